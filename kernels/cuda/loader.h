// Loads libring_kernels_cuda.so on demand (kernels/cuda/plugin_abi.h) and creates the CUDA
// backend from it. Plain C++ and libdl: compiled into ring_kernels when the CUDA backend is
// built, so CPU-only binaries carry no CUDA dependency.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace ring::kernels::cuda {

// Search order: $RING_KERNELS_PATH (a directory), the install directory relative to the
// executable (<bin>/../lib/ringmaster), the configured install directory, the build tree's lib/
// only when running from it (common/install/locate.h), then the dynamic linker's path. Returns nullptr and sets *error naming
// every place tried, or what the library said (e.g. "no usable CUDA device: ...").
std::unique_ptr<Backend> load_cuda_backend(std::string* error);

}  // namespace ring::kernels::cuda
