// The C entry points of libring_kernels_cuda.so, the CUDA backend as a separately loaded library.
//
// ring_kernels (kernels/backend.cc) dlopens the library only when create_backend("cuda") is
// called, so binaries that never ask for the GPU do not need libcudart, libcublas or a driver at
// run time (and nothing links libcuda.so, the driver: libcudart loads it itself when present).
// Both sides are compiled from the same kernels/backend.h; kRingKernelsCudaAbi changes whenever
// the Backend class layout changes, and the loader refuses a library built for another version.
#pragma once

#include <cstddef>

namespace ring::kernels {
class Backend;
}

// Bump when kernels/backend.h's Backend (its virtual methods) or these functions change.
inline constexpr int kRingKernelsCudaAbi = 3;

extern "C" {
// The ABI version the library was built with (kRingKernelsCudaAbi).
int ring_kernels_cuda_abi(void);
// Creates a CUDA backend on device `device` (-1: $RING_CUDA_DEVICE or 0). Returns nullptr and
// writes a message into err (err_len bytes, NUL-terminated) when no usable GPU is present or
// the device cannot be set up. The caller owns the result (delete through Backend*).
ring::kernels::Backend* ring_kernels_cuda_create(int device, char* err, size_t err_len);
}
