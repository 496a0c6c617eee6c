// Status and dtype helpers, and the backend registry: a small ordered table of the backends
// compiled into this build. The first entry is the default; the CUDA backend joins the table
// (ahead of "cpu") when it is built.
#include "kernels/backend.h"

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/ops.h"
#ifdef RING_HAVE_CUDA_BACKEND
#include "kernels/cuda/loader.h"
#endif

namespace ring::kernels {

const char* status_string(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kOutOfMemory:
      return "out of memory";
    case Status::kDeviceError:
      return "device error";
    case Status::kInternal:
      return "internal error";
  }
  return "unknown status";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

namespace {

struct BackendEntry {
  const char* name;
  // threads >= 1 here. Returns nullptr and sets *error when the backend cannot start.
  std::unique_ptr<Backend> (*create)(int threads, std::string* error);
};

std::unique_ptr<Backend> create_cpu(int threads, std::string* error) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

#ifdef RING_HAVE_CUDA_BACKEND
// libring_kernels_cuda.so, loaded on first use; threads do not apply to the GPU.
std::unique_ptr<Backend> create_cuda(int threads, std::string* error) {
  return cuda::load_cuda_backend(error);
}
#endif

// In order of preference.
constexpr BackendEntry kBackends[] = {
#ifdef RING_HAVE_CUDA_BACKEND
    {"cuda", &create_cuda},
#endif
    {"cpu", &create_cpu},
};

std::string names_joined() {
  std::string s;
  for (const BackendEntry& e : kBackends) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
  for (const BackendEntry& e : kBackends) names.emplace_back(e.name);
  return names;
}

std::unique_ptr<Backend> create_backend(const std::string& name, int threads, std::string* error) {
  std::string local;
  std::string* err = error ? error : &local;
  if (threads < 0) {
    *err = "backend threads must be >= 0 (0: all cores), got " + std::to_string(threads);
    return nullptr;
  }
  for (const BackendEntry& e : kBackends) {
    if (name != e.name) continue;
    return e.create(threads == 0 ? cpu::hardware_threads() : threads, err);
  }
  if (name == "cuda") {
    *err = "backend 'cuda' is not built into this binary (configured without CUDA: "
           "RING_WITH_CUDA=OFF or no nvcc); available: " +
           names_joined();
  } else {
    *err = "unknown backend '" + name + "'; available: " + names_joined();
  }
  return nullptr;
}

}  // namespace ring::kernels
