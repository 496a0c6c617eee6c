// Single-rank training: the model, in-process AdamW on the flat buffers, the learning-rate
// schedule, global gradient-norm clipping and step statistics for the logs.
//
//   Trainer trainer(spec, backend.get(), &attention);     // init from train.seed
//   StepStats s = trainer.train_step(source->next_sequence());
//
// AdamW runs through Backend::adamw_step on each parameter tensor, with weight decay 0 on norm
// gains (ParamView::decay). The gradient is clipped to train.grad_clip in global L2 norm (over
// the whole flat buffer) before the update; the logged grad_norm is the norm before clipping.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/spec/spec.h"
#include "kernels/backend.h"
#include "worker/data/sequence.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::train {

// Learning rate at optimizer step `step` (1-based) of `total_steps`: linear warm-up from 0 over
// lr_warmup_steps (step s < warm-up gets lr * s / warm-up), then constant lr, or cosine from lr
// to min_lr reached at total_steps.
double learning_rate(const spec::OptimizerSection& o, int64_t step, int64_t total_steps);

struct StepStats {
  int64_t step = 0;       // 1-based optimizer step just taken
  double loss = 0;        // mean cross-entropy (nats) over the step's valid labels
  int64_t tokens = 0;     // tokens processed in the step (all its sequences)
  int64_t valid = 0;      // valid labels
  double grad_norm = 0;   // global L2 norm before clipping
  double lr = 0;          // learning rate used for the update
  double step_ms = 0;     // wall time of forward + backward + optimizer
  double tokens_per_s = 0;
};

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

 private:
  spec::JobSpec spec_;
  kernels::Backend* backend_;
  model::Model model_;
  int64_t total_steps_;
  int64_t step_ = 0;
  model::DeviceArray<float> m_, v_;  // AdamW moments, [layout.total()]
  GradReduceFn grad_reduce_;
};

// "step 10 | loss 2.3456 | 12345 tok/s | 234.5 ms | lr 1.00e-03 | gnorm 0.812"
std::string format_step(const StepStats& s);
// One JSON object (one line): {"step":..,"loss":..,"tokens_per_s":..,"step_ms":..,"lr":..,
// "grad_norm":..,"tokens":..,"valid":..}
std::string step_json(const StepStats& s);

}  // namespace ring::train
