#include "common/contract/optimizer_rule.h"

#include <algorithm>
#include <cmath>

namespace ring::contract {

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

ClipRule clip_rule(double sum_of_squares, double grad_clip) {
  ClipRule c;
  c.norm = std::sqrt(sum_of_squares);
  c.clipped = clipping_enabled(grad_clip) && c.norm > grad_clip;
  if (c.clipped) c.scale = static_cast<float>(grad_clip / (c.norm + 1e-6));
  return c;
}

AdamWParams adamw_params(const spec::OptimizerSection& o, double lr, int64_t step, bool decay) {
  return AdamWParams{static_cast<float>(lr),
                     static_cast<float>(o.beta1),
                     static_cast<float>(o.beta2),
                     static_cast<float>(o.eps),
                     decay ? static_cast<float>(o.weight_decay) : 0.f,
                     step};
}

}  // namespace ring::contract
