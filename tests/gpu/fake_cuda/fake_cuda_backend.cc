// A stand-in for libring_kernels_cuda.so with no CUDA in it, built once per case the loader must
// handle (cuda_loader_test.cc): FAKE_CASE selects what its entry gets right or wrong. create
// never makes a backend; it says it was called, which is all the loader's checks need.
#include <cstdio>

#include "kernels/cuda/plugin_abi.h"

#define FAKE_GOOD 0
#define FAKE_HASH 1        // built against another Backend interface
#define FAKE_VERSION 2     // another entry ABI version
#define FAKE_SMALL 3       // an entry struct without create
#define FAKE_NO_SYMBOL 4   // the entry points of the version before the entry struct
#define FAKE_NULL_ENTRY 5  // the entry function returns NULL

namespace {

[[maybe_unused]] ring::kernels::Backend* create(int device, char* err, size_t err_len) {
  std::snprintf(err, err_len, "fake CUDA backend: create(device %d) called", device);
  return nullptr;
}

using ring::kernels::cuda::kBackendInterfaceHash;
using ring::kernels::cuda::kRingKernelsCudaAbi;

#if FAKE_CASE == FAKE_GOOD
const ring_kernels_cuda_entry_t kEntry = {sizeof(kEntry), kRingKernelsCudaAbi,
                                          kBackendInterfaceHash, "fake build", &create};
#elif FAKE_CASE == FAKE_HASH
const ring_kernels_cuda_entry_t kEntry = {sizeof(kEntry), kRingKernelsCudaAbi,
                                          kBackendInterfaceHash ^ 1, "another build", &create};
#elif FAKE_CASE == FAKE_VERSION
const ring_kernels_cuda_entry_t kEntry = {sizeof(kEntry), kRingKernelsCudaAbi + 1,
                                          kBackendInterfaceHash, "fake build", &create};
#elif FAKE_CASE == FAKE_SMALL
const ring_kernels_cuda_entry_t kEntry = {
    static_cast<uint32_t>(offsetof(ring_kernels_cuda_entry_t, create)), kRingKernelsCudaAbi,
    kBackendInterfaceHash, "fake build", nullptr};
#endif

}  // namespace

#if FAKE_CASE == FAKE_NO_SYMBOL
extern "C" __attribute__((visibility("default"))) int ring_kernels_cuda_abi(void) { return 3; }
#elif FAKE_CASE == FAKE_NULL_ENTRY
extern "C" __attribute__((visibility("default"))) const ring_kernels_cuda_entry_t*
ring_kernels_cuda_entry(void) {
  return nullptr;
}
#else
extern "C" __attribute__((visibility("default"))) const ring_kernels_cuda_entry_t*
ring_kernels_cuda_entry(void) {
  return &kEntry;
}
#endif
