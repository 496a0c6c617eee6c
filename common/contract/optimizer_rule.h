// The optimizer rule both optimizers apply: the in-worker Trainer (worker/train/) and ringd's
// offloaded NodeOptimizer (daemon/optim/) call these functions, so an offloaded run takes the
// same learning rate, clipping decision and AdamW hyper-parameters as an in-worker run, to the
// bit (tests/optim checks the weights equal bit for bit).
//
//   const double lr = learning_rate(spec.optimizer, step, total_steps);
//   const ClipRule c = clip_rule(sum_of_squares, spec.train.grad_clip);
//   if (c.clipped) g *= c.scale;                               // fp32 multiply
//   for (const ParamView& v : layout.views())
//     adamw on v with adamw_params(spec.optimizer, lr, step, v.decay);
//
// The AdamW update itself is the kernels' (Backend::adamw_step; NodeOptimizer's lazy path
// reproduces its rounding per coordinate).
#pragma once

#include <cstdint>

#include "common/spec/spec.h"

namespace ring::contract {

// Learning rate at optimizer step `step` (1-based) of `total_steps`: linear warm-up from 0 over
// lr_warmup_steps (step s < warm-up gets lr * s / warm-up), then constant lr, or cosine from lr
// to min_lr reached at total_steps.
double learning_rate(const spec::OptimizerSection& o, int64_t step, int64_t total_steps);

// Global L2-norm clipping of the whole gradient (train.grad_clip; 0 turns it off).
struct ClipRule {
  double norm = 0;       // sqrt(sum of squares): the logged grad_norm, before clipping
  bool clipped = false;  // grad_clip > 0 and norm > grad_clip
  float scale = 1.f;     // the gradient's factor when clipped: float(grad_clip / (norm + 1e-6))
};
ClipRule clip_rule(double sum_of_squares, double grad_clip);
// Whether clipping can change a step at all (then the update must wait for the global norm).
inline bool clipping_enabled(double grad_clip) {
  return grad_clip > 0;
}

// AdamW hyper-parameters of one parameter tensor at `step`, in the precision the kernels take
// (the fields of kernels::Backend::AdamWParams, in its order). Weight decay applies only where
// the layout says so (ParamView::decay: not on norm gains).
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};
AdamWParams adamw_params(const spec::OptimizerSection& o, double lr, int64_t step, bool decay);

}  // namespace ring::contract
