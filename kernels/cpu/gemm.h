// The CPU GEMM provider: which library runs fp32 C = alpha op(A) op(B) + beta C (row-major).
//
// Providers: OpenBLAS (cblas_sgemm) and oneDNN (dnnl_sgemm, when built with libdnnl-dev).
// Debian's OpenBLAS picks its kernels from a table of CPU models; on a model newer than the table
// it can run kernels far older than the CPU (Prescott SSE3 on an AVX-512 Xeon, a fifth of the
// speed), while oneDNN picks its kernels from CPU feature flags. The automatic choice is a pure
// function of cpuid and OpenBLAS's reported core (no timing), so one machine always makes the
// same choice and results stay bit-identical run to run (resume relies on it):
//   - oneDNN when OpenBLAS's core lacks the widest vector kernels this CPU runs (it fell back);
//   - OpenBLAS otherwise (its own kernels for this CPU), or when oneDNN is not built in.
// RING_GEMM=openblas|onednn|auto overrides it (read once, at the first GEMM); the choice and the
// reason go to stderr once per process. docs/performance.md has the measurements behind it.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/env_choice.h"

namespace ring::kernels::cpu {

enum class GemmProvider : int { kOpenBlas = 0, kOneDnn = 1 };
inline constexpr GemmProvider kGemmProviders[] = {GemmProvider::kOpenBlas, GemmProvider::kOneDnn};

// "openblas", "onednn" (the RING_GEMM spellings).
const char* gemm_provider_name(GemmProvider p);
// Whether the provider is compiled into this build (OpenBLAS always is).
bool gemm_provider_built(GemmProvider p);

// What the automatic choice looks at.
struct GemmFacts {
  std::string openblas_core;  // openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...
  int cpu_vector_level = 0;   // 2: AVX-512, 1: AVX2+FMA, 0: neither (from cpuid)
  bool onednn_built = false;
};
// The facts of this machine and build.
GemmFacts gemm_facts();
// The widest vectors an OpenBLAS core's kernels use, on the same scale as cpu_vector_level:
// 2 for SkylakeX/Cooperlake/SapphireRapids, 1 for Haswell/Zen, 0 for the older ones.
int openblas_core_vector_level(const std::string& core);

// value: the provider (OpenBLAS unless the rule or RING_GEMM says otherwise).
using GemmChoice = Resolved<GemmProvider>;
// Resolves a RING_GEMM value: empty or "auto" applies the rule above; "openblas" or "onednn"
// selects that provider (oneDNN when not built: OpenBLAS, with a warning); anything else: the
// automatic choice, with a warning naming RING_GEMM and the accepted values.
GemmChoice resolve_gemm_provider(const std::string& env_value, const GemmFacts& facts);

// The provider GEMMs run with now (RING_GEMM at first use, or the last set_gemm_provider()).
GemmProvider active_gemm_provider();
// Switches the provider for all later GEMMs in this process (tests and benchmarks use it).
// kUnsupported if it is not built. Not thread-safe against concurrent GEMM calls.
Status set_gemm_provider(GemmProvider p);

// Row-major fp32 GEMM through provider p on up to `threads` threads. Arguments must already be
// valid (cpu::gemm in ops.h checks them): m, n, k >= 1, each below 2^31, leading dimensions at
// least the stored row length. OpenBLAS's thread count is process-wide and is set per call;
// oneDNN runs on OpenMP and gets `threads` through the calling thread's OpenMP setting, restored
// after the call. Both give the same bits for the same inputs, shape and thread count.
Status sgemm(GemmProvider p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
             float* c, int64_t ldc, int threads);

// ---- bf16 GEMM: A and B stored as bf16 (uint16_t bits), C fp32 or bf16, fp32 accumulation ------
// Two paths, each giving alpha op(A) op(B) + beta C to fp32 rounding (the same bound):
//   - onednn: oneDNN's matmul primitive on the bf16 operands (AVX512_BF16 dot products or AMX
//     tiles; both treat subnormal inputs and products as zero), fp32 result;
//   - convert: bf16 -> fp32 tiles (from_bf16, exact) fed to the active fp32 provider (sgemm above).
// A bf16 C is always produced as fp32 first and rounded once by to_bf16 (common/numeric/bf16.h's
// rounding), so the rounding of the output is the project's one rounding on both paths.
// The automatic choice is a pure function of cpuid and the build (never timed): onednn when it is
// built and the CPU has AVX512_BF16 or AMX-BF16, convert otherwise. RING_BF16_GEMM=onednn|
// convert|auto overrides it (read once, at the first bf16 GEMM); choice and reason go to stderr
// once per process. Like the fp32 providers, each path gives the same bits for the same inputs,
// shape and thread count; the two paths differ from each other within the bound.
enum class Bf16GemmPath : int { kConvert = 0, kOneDnn = 1 };
inline constexpr Bf16GemmPath kBf16GemmPaths[] = {Bf16GemmPath::kConvert, Bf16GemmPath::kOneDnn};

// "convert", "onednn" (the RING_BF16_GEMM spellings).
const char* bf16_gemm_path_name(Bf16GemmPath p);
// Whether the path is compiled into this build (convert always is; onednn with libdnnl-dev).
bool bf16_gemm_path_built(Bf16GemmPath p);

// What the automatic choice looks at (cpuid, with the OS's XSAVE state enabled for it).
struct Bf16GemmFacts {
  bool avx512_bf16 = false;  // CPUID.(7,1):EAX[5] and AVX-512 state
  bool amx_bf16 = false;     // CPUID.(7,0):EDX[22] (AMX-BF16) and [24] (AMX-TILE), tile state
  bool onednn_built = false;
};
Bf16GemmFacts bf16_gemm_facts();

// value: the path (conversion unless the rule or RING_BF16_GEMM says otherwise).
using Bf16GemmChoice = Resolved<Bf16GemmPath>;
// Resolves a RING_BF16_GEMM value: empty or "auto" applies the rule above; "convert" or "onednn"
// selects that path (onednn without oneDNN in the build: convert, with a warning; onednn on a CPU
// without the bf16 instructions is honoured, and calls oneDNN cannot serve there fail with
// kUnsupported); anything else: the automatic choice, with a warning naming the accepted values.
Bf16GemmChoice resolve_bf16_gemm_path(const std::string& env_value, const Bf16GemmFacts& facts);

// The path bf16 GEMMs run with now (RING_BF16_GEMM at first use, or the last set_bf16_gemm_path()).
Bf16GemmPath active_bf16_gemm_path();
// Switches the path for all later bf16 GEMMs in this process (tests and benchmarks use it).
// kUnsupported if it is not built. Not thread-safe against concurrent GEMM calls.
Status set_bf16_gemm_path(Bf16GemmPath p);

// Row-major C[m,n] = alpha op(A) op(B) + beta C with A, B bf16 and C stored as c_dtype (kF32 or
// kBF16), through path p on up to `threads` threads. Arguments must already be valid
// (cpu::gemm_mixed in ops.h checks them and handles k = 0 and alpha = 0): m, n, k >= 1, each
// below 2^31, leading dimensions at least the stored row length. beta 0 overwrites C. On
// failure *error (when not null) names the path, the library call and, for kUnsupported, the
// CPU feature that is missing.
// Thread-safe: oneDNN primitives are cached per (shape, transposes, leading dimensions, alpha,
// beta, threads) in a bounded cache shared by all threads, each call with its own scratchpad.
Status bf16_gemm(Bf16GemmPath p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                 float beta, void* c, DType c_dtype, int64_t ldc, int threads,
                 std::string* error = nullptr);

}  // namespace ring::kernels::cpu
