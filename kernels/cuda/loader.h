// Loads libring_kernels_cuda.so on demand (kernels/cuda/plugin_abi.h) and creates the CUDA
// backend from it. Plain C++ and libdl: compiled into ring_kernels when the CUDA backend is
// built, so CPU-only binaries carry no CUDA dependency.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace ring::kernels::cuda {

// Search order: $RING_KERNELS_PATH (a directory), the install directory relative to the
// executable (<bin>/../lib/ringmaster), the configured install directory, the build tree's lib/
// only when running from it (common/install/locate.h), then the dynamic linker's path. Returns nullptr and sets *error naming
// every place tried, or what the library said (e.g. "no usable CUDA device: ...").
std::unique_ptr<Backend> load_cuda_backend(std::string* error);

// The files load_cuda_backend tries, in order (the search order above).
std::vector<std::string> cuda_library_candidates();

// A CUDA backend library that passed the checks of plugin_abi.h.
struct CudaLibrary {
  std::string path;  // the file that passed; empty when none did
  Backend* (*create)(int device, char* err, size_t err_len) = nullptr;
  std::string error;  // when create is null: every candidate and why it was refused
};

// Opens the first candidate that exports ring_kernels_cuda_entry with an entry struct large
// enough, this ABI version and this build's Backend interface hash; the others are skipped with
// the file, what is wrong and the rule in `error`. Nothing from a refused library is called
// beyond its entry function.
CudaLibrary open_cuda_library(const std::vector<std::string>& candidates);

}  // namespace ring::kernels::cuda
