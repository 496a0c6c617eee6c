// Small device helpers shared by the kernels of libring_kernels_cuda.so.
#pragma once

#include <cuda_bf16.h>

namespace ring::kernels::cuda {

template <typename T>
__device__ __forceinline__ T to_t(float x);
template <>
__device__ __forceinline__ float to_t<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
template <typename V>
__device__ V block_sum(V v, V* shared32) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // shared32 may still be read by a previous call
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  V t = lane < warps ? shared32[lane] : V(0);
  return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float* shared32) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float t = lane < warps ? shared32[lane] : -INFINITY;
  return warp_max(t);
}

}  // namespace ring::kernels::cuda
