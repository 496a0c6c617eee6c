// Single-rank training: the model, in-process AdamW on the flat buffers, the learning-rate
// schedule, global gradient-norm clipping and step statistics for the logs.
//
//   Trainer trainer(spec, backend.get(), &attention);     // init from train.seed
//   StepStats s = trainer.train_step(source->next_sequence());
//
// AdamW runs through Backend::adamw_step on each parameter tensor, with weight decay 0 on norm
// gains (ParamView::decay). The gradient is clipped to train.grad_clip in global L2 norm (over
// the whole flat buffer) before the update; the logged grad_norm is the norm before clipping.
// Schedule, clipping and decay mask are common/contract/optimizer_rule.h, which ringd's
// offloaded optimizer (daemon/optim/) calls too.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/optimizer_rule.h"
#include "common/contract/step_stats.h"
#include "common/spec/spec.h"
#include "kernels/backend.h"
#include "worker/data/sequence.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::train {

// The optimizer rule (learning rate, clipping, decay mask) and the step record are the contract
// with ringd, whose offloaded optimizer applies the same rule (common/contract/).
using contract::format_step;
using contract::learning_rate;
using contract::StepStats;
using contract::step_json;

class Trainer {
 public:
  // The spec must be valid (resolved). backend and attention must outlive the trainer.
  // total_steps: the schedule's horizon (train.steps, or the --steps override).
  Trainer(const spec::JobSpec& spec, kernels::Backend* backend, model::AttentionExecutor* attention,
          int64_t total_steps);

  model::Model& model() { return model_; }
  int64_t step() const { return step_; }

  // Context parallelism (worker/ring/): called after the backward with this rank's flat gradient
  // buffer [n] and loss; it sums both over the ranks of the ring in place (the loss_sum and valid
  // become the global ones), so every rank clips and applies the identical AdamW update. Unset:
  // one rank.
  using GradReduceFn = std::function<void(float* grads, int64_t n, model::LossResult* loss)>;
  void set_grad_reduce(GradReduceFn fn) { grad_reduce_ = std::move(fn); }

  // One optimizer step on this rank's tokens; the loss is normalised by global_valid (this
  // rank's valid labels when training alone).
  StepStats train_step(const model::Batch& batch, int64_t global_valid);
  // The same over several batches (gradient accumulation); global_valid counts all of them.
  StepStats train_step(const std::vector<model::Batch>& batches, int64_t global_valid);
  // One optimizer step on a whole sequence (one rank).
  StepStats train_step(const data::Sequence& seq);
  // One optimizer step on several whole sequences (one rank): their gradients are accumulated
  // and the loss is the mean over all their valid labels, as if they were one batch.
  StepStats train_step(const std::vector<data::Sequence>& seqs);

  // Writes the current weights as a one-node checkpoint under dir (docs/checkpoints.md:
  // master/<param> f32 tensors, the layout record, shard none) at train step step(); returns the
  // step directory. Throws ckpt::CheckpointError naming the directory on failure.
  std::string save_weights(const std::string& dir, const nlohmann::json& meta = {});
  // The weights AdamW updates, on the host [layout.total()]: the model's for fp32, the fp32
  // master for bf16 (the model holds only their bf16 rounding; model().get_params() gives that).
  std::vector<float> weights() const;

 private:
  spec::JobSpec spec_;
  kernels::Backend* backend_;
  model::Model model_;
  int64_t total_steps_;
  int64_t step_ = 0;
  model::DeviceArray<float> m_, v_;  // AdamW moments, [layout.total()]
  // model.dtype bf16: the fp32 master weights AdamW updates (the model holds only their bf16
  // rounding, set from this after every update). Empty for fp32.
  model::DeviceArray<float> master_;
  GradReduceFn grad_reduce_;
};

}  // namespace ring::train
