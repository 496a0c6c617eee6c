// The one entry point of libring_kernels_cuda.so, the CUDA backend as a separately loaded
// library, and how the loader knows it may use what the library returns.
//
// ring_kernels (kernels/backend.cc) dlopens the library only when create_backend("cuda") is
// called, so binaries that never ask for the GPU do not need libcudart, libcublas or a driver at
// run time (and nothing links libcuda.so, the driver: libcudart loads it itself when present).
//
// The library exports one C function, ring_kernels_cuda_entry, returning a C struct (its own
// size, an ABI version, an interface hash, and the create function). create returns a
// ring::kernels::Backend*, a C++ object whose vtable the caller then uses: that is only sound
// when both sides were compiled from the same Backend declaration with a compatible C++ ABI.
// kBackendInterfaceHash captures exactly that (the SHA-256 of kernels/backend.h, the sizes of
// the types crossing the boundary, the compiler's C++ ABI and standard library ABI), and the
// loader calls create only when the library's hash equals its own. Anything else is refused
// with both hashes and what each side was built with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/backend.h"

// Set by kernels/CMakeLists.txt from the file's contents (cmake re-runs when it changes).
#ifndef RING_KERNELS_BACKEND_H_SHA256
#error "RING_KERNELS_BACKEND_H_SHA256 must be defined by the build (kernels/CMakeLists.txt)"
#endif

extern "C" {

typedef struct ring_kernels_cuda_entry {
  // sizeof(ring_kernels_cuda_entry_t) as the library was compiled. Members are only appended;
  // the loader refuses a struct too small for the members it reads.
  uint32_t struct_size;
  // kRingKernelsCudaAbi: bumped when this struct or the meaning of create changes.
  uint32_t abi_version;
  // kBackendInterfaceHash of the library's build.
  uint64_t interface_hash;
  // What the library was built with (compiler, C++ ABI, backend.h hash prefix), for messages.
  const char* built_with;
  // Creates a CUDA backend on device `device` (-1: $RING_CUDA_DEVICE or 0). Returns nullptr and
  // writes a message into err (err_len bytes, NUL-terminated) when no usable GPU is present or
  // the device cannot be set up. The caller owns the result (delete through Backend*). Call only
  // after checking interface_hash.
  ring::kernels::Backend* (*create)(int device, char* err, size_t err_len);
} ring_kernels_cuda_entry_t;

// The symbol the loader looks up.
#define RING_KERNELS_CUDA_ENTRY_SYMBOL "ring_kernels_cuda_entry"
const ring_kernels_cuda_entry_t* ring_kernels_cuda_entry(void);
}

namespace ring::kernels::cuda {

// Bump when ring_kernels_cuda_entry_t or the meaning of its create changes.
inline constexpr uint32_t kRingKernelsCudaAbi = 4;

namespace abi_detail {
constexpr uint64_t fnv1a(std::string_view s, uint64_t h = 14695981039346656037ull) {
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
constexpr uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}
#if defined(_GLIBCXX_USE_CXX11_ABI)
constexpr uint64_t kStdlibAbi = _GLIBCXX_USE_CXX11_ABI;
#else
constexpr uint64_t kStdlibAbi = 0;
#endif
#if defined(__GXX_ABI_VERSION)
constexpr uint64_t kCxxAbi = __GXX_ABI_VERSION;
#else
constexpr uint64_t kCxxAbi = 0;
#endif
#define RING_KERNELS_STR2(x) #x
#define RING_KERNELS_STR(x) RING_KERNELS_STR2(x)
}  // namespace abi_detail

// The Backend interface as both sides see it: its declaration (the header's hash), the sizes of
// the types passed by value or pointer through it, and the C++ / standard library ABI.
constexpr uint64_t backend_interface_hash() {
  using namespace abi_detail;
  const uint64_t facts[] = {sizeof(Backend),        alignof(Backend), sizeof(AttentionArgs),
                            sizeof(AttentionStats), sizeof(void*),    kCxxAbi,
                            kStdlibAbi};
  uint64_t h = fnv1a(RING_KERNELS_BACKEND_H_SHA256);
  for (uint64_t v : facts) h = mix(h, v);
  return h;
}
inline constexpr uint64_t kBackendInterfaceHash = backend_interface_hash();

// For messages: "C++ ABI 1017, libstdc++ cxx11 ABI 1, backend.h sha256 1a2b3c4d...".
inline constexpr const char* kBuiltWith =
    "C++ ABI " RING_KERNELS_STR(__GXX_ABI_VERSION) ", libstdc++ cxx11 ABI " RING_KERNELS_STR(
        _GLIBCXX_USE_CXX11_ABI) ", backend.h sha256 " RING_KERNELS_BACKEND_H_SHA256;

}  // namespace ring::kernels::cuda
