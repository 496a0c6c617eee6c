// RoPE frequencies with context-extension scaling, shared by every backend (host and device
// code) and the reference: the inverse frequency of pair j and the factor cos and sin are
// multiplied by, with the semantics of Hugging Face transformers' rope init functions
// (modeling_rope_utils.py: _compute_default/linear/llama3/yarn_parameters), in fp64.
//
// Pair j of a head of size head_dim (j < head_dim / 2) rotates by pos * inv_freq(j):
//   none:   inv_freq = theta^(-2j/head_dim)                       (attention factor 1)
//   linear: inv_freq / factor                                      (positions / factor)
//   llama3: wavelength w = 2 pi / inv_freq; w > original / low_freq_factor: inv_freq / factor;
//           w < original / high_freq_factor: inv_freq; between: (1 - s) inv_freq / factor +
//           s inv_freq with s = (original / w - low_freq_factor) / (high - low_freq_factor)
//   yarn:   inv_freq / factor (interpolation) and inv_freq (extrapolation) blended by a ramp
//           over pairs between the correction dimensions of beta_fast and beta_slow rotations
//           (floored and ceiled, clamped to [0, head_dim - 1]); cos and sin are multiplied by
//           0.1 ln(factor) + 1 (factor > 1; else 1).
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define RING_ROPE_HD __host__ __device__
#else
#define RING_ROPE_HD
#endif

namespace ring::kernels {

enum class RopeScaling : int32_t { kNone = 0, kLinear = 1, kLlama3 = 2, kYarn = 3 };

// Trivially copyable: passed by value to device kernels.
struct RopeParams {
  double theta = 10000.0;  // base frequency, finite > 0
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;            // >= 1 (linear, llama3, yarn)
  double original_context = 0.0;  // original_max_position_embeddings (llama3, yarn: > 0)
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3, > low_freq_factor
  double beta_fast = 32.0;        // yarn, > beta_slow
  double beta_slow = 1.0;         // yarn, > 0
};

// The parameters a backend accepts (what it checks before launching anything).
RING_ROPE_HD inline bool rope_params_valid(const RopeParams& p) {
  if (!(p.theta > 0.0) || !isfinite(p.theta)) return false;
  switch (p.scaling) {
    case RopeScaling::kNone:
      return true;
    case RopeScaling::kLinear:
      return p.factor >= 1.0 && isfinite(p.factor);
    case RopeScaling::kLlama3:
      return p.factor >= 1.0 && isfinite(p.factor) && p.original_context > 0.0 &&
             p.low_freq_factor > 0.0 && p.high_freq_factor > p.low_freq_factor &&
             isfinite(p.high_freq_factor);
    case RopeScaling::kYarn:
      return p.factor >= 1.0 && isfinite(p.factor) && p.original_context > 0.0 &&
             p.beta_slow > 0.0 && p.beta_fast > p.beta_slow && isfinite(p.beta_fast);
  }
  return false;
}

// Inverse frequency of pair j (radians per position).
RING_ROPE_HD inline double rope_inv_freq(const RopeParams& p, int64_t j, int64_t head_dim) {
  const double dim = static_cast<double>(head_dim);
  const double base = ::pow(p.theta, -2.0 * static_cast<double>(j) / dim);
  switch (p.scaling) {
    case RopeScaling::kNone:
      return base;
    case RopeScaling::kLinear:
      return base / p.factor;
    case RopeScaling::kLlama3: {
      const double two_pi = 6.283185307179586476925286766559;
      const double wavelen = two_pi / base;
      const double low_wavelen = p.original_context / p.low_freq_factor;
      const double high_wavelen = p.original_context / p.high_freq_factor;
      if (wavelen > low_wavelen) return base / p.factor;
      if (wavelen < high_wavelen) return base;
      const double s = (p.original_context / wavelen - p.low_freq_factor) /
                       (p.high_freq_factor - p.low_freq_factor);
      return (1.0 - s) * base / p.factor + s * base;
    }
    case RopeScaling::kYarn: {
      const double two_pi = 6.283185307179586476925286766559;
      // The pair index (in dims: 2j) at which a wavelength completes `rotations` turns over
      // the original context.
      const double ln_base2 = 2.0 * ::log(p.theta);
      double low = ::floor(dim * ::log(p.original_context / (p.beta_fast * two_pi)) / ln_base2);
      double high = ::ceil(dim * ::log(p.original_context / (p.beta_slow * two_pi)) / ln_base2);
      if (low < 0.0) low = 0.0;
      if (high > dim - 1.0) high = dim - 1.0;
      if (low == high) high += 0.001;
      double ramp = (static_cast<double>(j) - low) / (high - low);
      ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
      // extrapolation weight 1 - ramp (high frequencies kept), interpolation weight ramp.
      return base / p.factor * ramp + base * (1.0 - ramp);
    }
  }
  return base;
}

// What cos and sin are multiplied by (yarn's attention factor; 1 otherwise).
RING_ROPE_HD inline double rope_attention_factor(const RopeParams& p) {
  if (p.scaling == RopeScaling::kYarn && p.factor > 1.0) return 0.1 * ::log(p.factor) + 1.0;
  return 1.0;
}

}  // namespace ring::kernels
