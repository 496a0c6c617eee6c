#include "kernels/cuda/loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "common/install/locate.h"
#include "kernels/cuda/plugin_abi.h"

namespace ring::kernels::cuda {
namespace {

constexpr const char* kLibName = "libring_kernels_cuda.so";

struct Loaded {
  void* handle = nullptr;  // never closed: backends created from it may live until exit
  int (*abi)() = nullptr;
  Backend* (*create)(int, char*, size_t) = nullptr;
  std::string error;
};

Loaded load_once() {
  Loaded l;
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RING_KERNELS_PATH"); dir != nullptr && *dir != '\0') {
    candidates.push_back(std::string(dir) + "/" + kLibName);
  }
  for (const std::string& dir : install::plugin_dirs("lib")) candidates.push_back(dir + "/" + kLibName);
  candidates.push_back(kLibName);
  std::string tried;
  for (const std::string& path : candidates) {
    dlerror();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why ? why : "dlopen failed");
      continue;
    }
    auto abi = reinterpret_cast<int (*)()>(dlsym(h, "ring_kernels_cuda_abi"));
    auto create =
        reinterpret_cast<Backend* (*)(int, char*, size_t)>(dlsym(h, "ring_kernels_cuda_create"));
    if (abi == nullptr || create == nullptr) {
      tried += "\n  " + path + ": not a ringmaster CUDA backend (entry points missing)";
      dlclose(h);
      continue;
    }
    if (abi() != kRingKernelsCudaAbi) {
      tried += "\n  " + path + ": built for backend ABI " + std::to_string(abi()) +
               ", this binary needs " + std::to_string(kRingKernelsCudaAbi) + " (stale build?)";
      dlclose(h);
      continue;
    }
    l.handle = h;
    l.abi = abi;
    l.create = create;
    return l;
  }
  l.error = std::string("cannot load the CUDA backend (") + kLibName + "); tried:" + tried;
  return l;
}

}  // namespace

std::unique_ptr<Backend> load_cuda_backend(std::string* error) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load_once(); });
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
