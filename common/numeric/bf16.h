// bfloat16, the one rounding of the project: every place a float becomes bf16 (the CPU kernels'
// conversions, checkpoints and safetensors files, the CUDA kernels through __float2bfloat16_rn,
// which rounds the same way) gives the bits f32_to_bf16 gives here. docs/precision.md says where
// values are rounded and why.
//
//   uint16_t h = ring::numeric::f32_to_bf16(x);   // round to nearest, ties to even
//   float y = ring::numeric::bf16_to_f32(h);       // exact
//   float r = ring::numeric::round_bf16(x);        // x as it would be stored in bf16
//
// Round to nearest even on the 16 dropped bits; a finite value that rounds past the largest bf16
// becomes infinity of its sign (as IEEE rounding does); NaN stays NaN, made quiet, sign kept;
// subnormals are kept (no flush to zero). Header-only: the scalar form is the reference the
// vectorised conversions (kernels/cpu/bf16.h) are tested against bit for bit.
#pragma once

#include <bit>
#include <cstdint>

namespace ring::numeric {

constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return static_cast<uint16_t>((u >> 16) | 0x0040);  // quiet NaN, sign kept
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

constexpr float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

constexpr float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace ring::numeric
