#include "worker/train/trainer.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace ring::train {

using model::check_status;

double learning_rate(const spec::OptimizerSection& o, int64_t step, int64_t total_steps) {
  if (o.lr_warmup_steps > 0 && step < o.lr_warmup_steps) {
    return o.lr * static_cast<double>(step) / static_cast<double>(o.lr_warmup_steps);
  }
  if (o.schedule == spec::LrSchedule::kConstant) return o.lr;
  const int64_t span = total_steps - o.lr_warmup_steps;
  if (span <= 0) return o.lr;
  double progress = static_cast<double>(step - o.lr_warmup_steps) / static_cast<double>(span);
  progress = std::min(1.0, std::max(0.0, progress));
  constexpr double kPi = 3.14159265358979323846;
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(kPi * progress));
}

Trainer::Trainer(const spec::JobSpec& spec, kernels::Backend* backend,
                 model::AttentionExecutor* attention, int64_t total_steps)
    : spec_(spec),
      backend_(backend),
      model_(model::ModelConfig::from_spec(spec), backend, attention),
      total_steps_(total_steps) {
  model_.init_params(static_cast<uint64_t>(spec.train.seed));
  const int64_t n = model_.layout().total();
  m_.resize(backend_, n);
  v_.resize(backend_, n);
  check_status(backend_->fill(n, 0.f, m_.data()), "fill");
  check_status(backend_->fill(n, 0.f, v_.data()), "fill");
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
  const double norm = std::sqrt(ss);
  const double clip = spec_.train.grad_clip;
  if (clip > 0 && norm > clip) {
    check_status(backend_->scale(n, static_cast<float>(clip / (norm + 1e-6)), model_.grads()),
                 "scale");
  }

  ++step_;
  const spec::OptimizerSection& o = spec_.optimizer;
  const double lr = learning_rate(o, step_, total_steps_);
  for (const model::ParamView& v : model_.layout().views()) {
    kernels::Backend::AdamWParams hp{static_cast<float>(lr), static_cast<float>(o.beta1),
                                     static_cast<float>(o.beta2), static_cast<float>(o.eps),
                                     v.decay ? static_cast<float>(o.weight_decay) : 0.f, step_};
    check_status(backend_->adamw_step(v.size, hp, model_.params() + v.offset,
                                      model_.grads() + v.offset, m_.data() + v.offset,
                                      v_.data() + v.offset),
                 "adamw_step");
  }
  check_status(backend_->synchronize(), "synchronize");
  const auto t1 = std::chrono::steady_clock::now();

  StepStats s;
  s.step = step_;
  s.loss = r.valid > 0 ? r.loss_sum / static_cast<double>(r.valid) : 0.0;
  s.tokens = tokens;
  s.valid = r.valid;
  s.grad_norm = norm;
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

std::string format_step(const StepStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %lld | loss %.4f | %.0f tok/s | %.1f ms | lr %.3e | gnorm %.3f",
                static_cast<long long>(s.step), s.loss, s.tokens_per_s, s.step_ms, s.lr,
                s.grad_norm);
  return buf;
}

std::string step_json(const StepStats& s) {
  nlohmann::json j{{"step", s.step},       {"loss", s.loss},   {"tokens_per_s", s.tokens_per_s},
                   {"step_ms", s.step_ms}, {"lr", s.lr},       {"grad_norm", s.grad_norm},
                   {"tokens", s.tokens},   {"valid", s.valid}};
  return j.dump();
}

}  // namespace ring::train
