#include "worker/train/trainer.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/contract/model_config.h"
#include "common/contract/shard.h"
#include "common/checkpoint/checkpoint.h"

namespace ring::train {

using model::check_status;

Trainer::Trainer(const spec::JobSpec& spec, kernels::Backend* backend,
                 model::AttentionExecutor* attention, int64_t total_steps)
    : spec_(spec),
      backend_(backend),
      model_(model::ModelConfig::from_spec(spec), backend, attention),
      total_steps_(total_steps) {
  const int64_t n = model_.layout().total();
  std::vector<float> host;  // the initial weights, fp32
  if (spec.model.init_from.empty()) {
    host = model_.initial_params(static_cast<uint64_t>(spec.train.seed));
  } else {
    // model.init_from: the checkpoint's master/<param> tensors, found by name in any shard
    // (names and shapes checked); the moments below start at zero.
    host.assign(static_cast<size_t>(n), 0.f);
    std::vector<ckpt::LoadTarget> targets;
    for (const auto& v : model_.layout().views()) {
      ckpt::LoadTarget t{"master/" + v.name, ckpt::DType::kF32, v.shape, host.data() + v.offset};
      t.flat_name = "master";  // format 1
      t.flat_offset = v.offset;
      targets.push_back(std::move(t));
    }
    // The checkpoint's model record against this job's (shape and settings; another dtype is
    // converted: docs/checkpoints.md, "The model record").
    ckpt::Layout job;
    job.model = contract::model_record(model_.config());
    try {
      ckpt::load_from_path(spec.model.init_from, 0, 1, targets, &job);
    } catch (const ckpt::CheckpointError& e) {
      throw model::ModelError(std::string("cannot initialise from model.init_from: ") + e.what());
    }
  }
  model_.set_params(host);
  if (model_.config().dtype == spec::DType::kBf16) {
    // The master is the weights as set, unrounded (the model holds their bf16 rounding).
    master_.resize(backend_, n);
    check_status(backend_->copy_to_device(master_.data(), host.data(), master_.bytes()),
                 "copy_to_device");
  }
  m_.resize(backend_, n);
  v_.resize(backend_, n);
  check_status(backend_->fill(n, 0.f, m_.data()), "fill");
  check_status(backend_->fill(n, 0.f, v_.data()), "fill");
}

std::string Trainer::save_weights(const std::string& dir, const nlohmann::json& meta) {
  const contract::ParamLayout& pl = model_.layout();
  ckpt::Layout layout;
  layout.shard = "none";
  layout.nodes = 1;
  layout.total_floats = pl.total();
  for (const contract::NodeRange& r : contract::shard_ranges(pl, 1))
    layout.ranges.push_back({r.node, r.begin, r.end, r.first_bucket, r.end_bucket});
  layout.model = contract::model_record(model_.config());
  ckpt::Options o;
  o.dir = dir;
  o.keep_last = 1 << 20;  // nothing of an earlier run in dir is removed
  o.tag = "weights";
  o.spec_hash = "weights";
  o.layout = std::move(layout);
  const std::vector<float> host = weights();  // bf16: the fp32 master, not the rounded weights
  ckpt::Checkpointer ck(o);
  for (const auto& v : pl.views())
    ck.add_tensor("master/" + v.name, ckpt::DType::kF32, v.shape, host.data() + v.offset);
  ck.start(step_, meta.is_object() ? meta : nlohmann::json::object());
  ckpt::SaveResult r = ck.wait();
  if (!r.ok) throw ckpt::CheckpointError(dir + ": writing the weights failed: " + r.error);
  return r.path;
}

std::vector<float> Trainer::weights() const {
  if (master_.size() == 0) return model_.get_params();
  std::vector<float> host(static_cast<size_t>(master_.size()));
  check_status(backend_->copy_to_host(host.data(), master_.data(), master_.bytes()),
               "copy_to_host");
  return host;
}

StepStats Trainer::train_step(const model::Batch& batch, int64_t global_valid) {
  return train_step(std::vector<model::Batch>{batch}, global_valid);
}

StepStats Trainer::train_step(const std::vector<model::Batch>& batches, int64_t global_valid) {
  const auto t0 = std::chrono::steady_clock::now();
  model_.zero_grads();
  model::LossResult r;
  int64_t tokens = 0;
  for (const model::Batch& batch : batches) {
    model::LossResult b = model_.forward_backward(batch, std::max<int64_t>(global_valid, 1));
    r.loss_sum += b.loss_sum;
    r.valid += b.valid;
    tokens += batch.tokens;
  }

  const int64_t n = model_.layout().total();
  if (grad_reduce_) grad_reduce_(model_.grads(), n, &r);
  double ss = 0;
  check_status(backend_->sum_squares(n, model_.grads(), &ss), "sum_squares");
  const contract::ClipRule clip = contract::clip_rule(ss, spec_.train.grad_clip);
  if (clip.clipped) check_status(backend_->scale(n, clip.scale, model_.grads()), "scale");

  ++step_;
  const spec::OptimizerSection& o = spec_.optimizer;
  const double lr = learning_rate(o, step_, total_steps_);
  float* weights = master_.size() > 0 ? master_.data() : model_.params();
  for (const model::ParamView& v : model_.layout().views()) {
    const contract::AdamWParams a = contract::adamw_params(o, lr, step_, v.decay);
    const kernels::Backend::AdamWParams hp{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step};
    check_status(backend_->adamw_step(v.size, hp, weights + v.offset, model_.grads() + v.offset,
                                      m_.data() + v.offset, v_.data() + v.offset),
                 "adamw_step");
  }
  if (master_.size() > 0)  // the model's bf16 weights: the master rounded
    model_.set_params_from_device(master_.data(), n);
  check_status(backend_->synchronize(), "synchronize");
  const auto t1 = std::chrono::steady_clock::now();

  StepStats s;
  s.step = step_;
  s.loss = r.valid > 0 ? r.loss_sum / static_cast<double>(r.valid) : 0.0;
  s.tokens = tokens;
  s.valid = r.valid;
  s.grad_norm = clip.norm;
  s.lr = lr;
  s.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  s.tokens_per_s = s.step_ms > 0 ? static_cast<double>(tokens) * 1000.0 / s.step_ms : 0;
  return s;
}

StepStats Trainer::train_step(const data::Sequence& seq) {
  model::Batch b{seq.size(), seq.tokens.data(), seq.labels.data(), seq.positions.data(),
                 seq.doc_ids.data()};
  return train_step(b, seq.valid_labels());
}

StepStats Trainer::train_step(const std::vector<data::Sequence>& seqs) {
  std::vector<model::Batch> batches;
  int64_t valid = 0;
  for (const data::Sequence& seq : seqs) {
    batches.push_back(model::Batch{seq.size(), seq.tokens.data(), seq.labels.data(),
                                   seq.positions.data(), seq.doc_ids.data()});
    valid += seq.valid_labels();
  }
  return train_step(batches, valid);
}

}  // namespace ring::train
