#include "kernels/cuda/loader.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "common/install/locate.h"
#include "kernels/cuda/plugin_abi.h"

namespace ring::kernels::cuda {
namespace {

constexpr const char* kLibName = "libring_kernels_cuda.so";

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Why a library's entry cannot be used by this binary, or "" when it can.
std::string check_entry(const ring_kernels_cuda_entry_t* e) {
  constexpr size_t kNeeded = offsetof(ring_kernels_cuda_entry_t, create) + sizeof(e->create);
  if (e == nullptr) return std::string(RING_KERNELS_CUDA_ENTRY_SYMBOL) + "() returned NULL";
  if (e->struct_size < kNeeded)
    return "its entry struct is " + std::to_string(e->struct_size) + " bytes, less than the " +
           std::to_string(kNeeded) + " this loader reads";
  if (e->abi_version != kRingKernelsCudaAbi)
    return "built for CUDA backend ABI version " + std::to_string(e->abi_version) +
           ", this program needs " + std::to_string(kRingKernelsCudaAbi);
  if (e->interface_hash != kBackendInterfaceHash)
    return "built against another Backend interface (hash " + hex(e->interface_hash) + ", " +
           (e->built_with ? e->built_with : "unknown build") + "); this program has hash " +
           hex(kBackendInterfaceHash) + " (" + kBuiltWith + ")";
  if (e->create == nullptr) return "its create function is NULL";
  return "";
}

}  // namespace

std::vector<std::string> cuda_library_candidates() {
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RING_KERNELS_PATH"); dir != nullptr && *dir != '\0') {
    candidates.push_back(std::string(dir) + "/" + kLibName);
  }
  for (const std::string& dir : install::plugin_dirs("lib")) candidates.push_back(dir + "/" + kLibName);
  candidates.push_back(kLibName);
  return candidates;
}

CudaLibrary open_cuda_library(const std::vector<std::string>& candidates) {
  CudaLibrary l;
  std::string tried;
  for (const std::string& path : candidates) {
    dlerror();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why ? why : "dlopen failed");
      continue;
    }
    auto entry = reinterpret_cast<const ring_kernels_cuda_entry_t* (*)()>(
        dlsym(h, RING_KERNELS_CUDA_ENTRY_SYMBOL));
    std::string why = entry == nullptr ? std::string("does not export ") +
                                             RING_KERNELS_CUDA_ENTRY_SYMBOL +
                                             " (not a ringmaster CUDA backend, or a stale one)"
                                       : check_entry(entry());
    if (!why.empty()) {
      tried += "\n  " + path + ": " + why +
               "; rule: the library must come from the same build as this program "
               "(kernels/cuda/plugin_abi.h)";
      dlclose(h);
      continue;
    }
    // Never closed: backends created from it may live until exit.
    l.path = path;
    l.create = entry()->create;
    return l;
  }
  l.error = std::string("cannot load the CUDA backend (") + kLibName + "); tried:" + tried;
  return l;
}

std::unique_ptr<Backend> load_cuda_backend(std::string* error) {
  static std::once_flag once;
  static CudaLibrary loaded;
  std::call_once(once, [] { loaded = open_cuda_library(cuda_library_candidates()); });
  if (loaded.create == nullptr) {
    *error = loaded.error;
    return nullptr;
  }
  char buf[1024] = {0};
  Backend* b = loaded.create(-1, buf, sizeof(buf));
  if (b == nullptr) {
    *error = buf[0] != '\0' ? std::string(buf) : std::string("CUDA backend creation failed");
    return nullptr;
  }
  return std::unique_ptr<Backend>(b);
}

}  // namespace ring::kernels::cuda
