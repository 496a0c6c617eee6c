// CPU implementations of every non-attention op of kernels/backend.h, as free functions that
// CpuBackend forwards to. Same contracts, shapes and Status codes as the Backend methods they
// implement (read backend.h); the extra `threads` argument is the number of OpenMP threads a
// call may use (>= 1; the backend resolves 0 to all cores before calling).
//
// Vectorized code is compiled per ISA (AVX-512, AVX2+FMA, scalar; see simd.h and ops_isa.inc)
// and chosen at run time from cpuid. RING_CPU_ISA=avx512|avx2|scalar overrides the choice
// (read once, at the first call); asking for an ISA this CPU lacks falls back to the best one
// it has, with a warning on stderr. Results differ between ISAs only by rounding.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace ring::kernels::cpu {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* isa_name(Isa isa);
// Whether this CPU (and OS) can run code for isa.
bool isa_supported(Isa isa);
// The best ISA this CPU supports.
Isa best_isa();
// Parses an RING_CPU_ISA value against what the CPU supports: empty or "auto" gives best_isa();
// a known name gives that ISA, or best_isa() if unsupported; anything else gives best_isa().
// *warning is set (when not null) whenever the value was not honoured as written.
Isa resolve_isa(const std::string& env_value, std::string* warning);
// The ISA ops run with now (RING_CPU_ISA at first use, or the last set_isa()).
Isa active_isa();
// Switches the ISA for all later calls in this process (tests use it to run every path).
// kUnsupported if this CPU cannot run isa. Not thread-safe against concurrent op calls.
Status set_isa(Isa isa);

// Number of threads the machine offers (what threads = 0 means).
int hardware_threads();

// ---- bf16 storage (common/numeric/bf16.h's rounding, bit for bit, on every ISA) -------------
// out[i] = bf16(x[i]); out[i] = float(x[i]); x[i] = float(bf16(x[i])) in place.
Status to_bf16(int64_t n, const float* x, uint16_t* out, int threads);
Status from_bf16(int64_t n, const uint16_t* x, float* out, int threads);
Status round_bf16(int64_t n, float* x, int threads);

// ---- dense linear algebra (through the GEMM provider of gemm.h: OpenBLAS or oneDNN) ----------
// gemm is gemm_mixed(dtype, dtype, ...). Storage (ab, c_dtype): (kF32, kF32) runs the fp32
// provider; (kBF16, kF32) and (kBF16, kBF16) the bf16 GEMM path of gemm.h (oneDNN or convert);
// (kF32, kBF16) is kUnsupported. When a call fails and error is not null, *error says why.
Status gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
            int64_t ldc, int threads);
Status gemm_mixed(DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                  float beta, void* c, int64_t ldc, int threads, std::string* error = nullptr);

// ---- normalisation, position, activations -----------------------------------------------
Status rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x, const float* gain, float* y,
                       float* rstd, int threads);
Status rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain, const float* rstd,
                        const float* dy, float* dx, float* dgain, int threads);
// head_dim must be even. Angles are computed in fp64 (positions reach 1e6 and beyond);
// frequencies and the attention factor as kernels/rope.h says.
Status rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& p, const int64_t* pos,
            bool inverse, float* x, int threads);
Status swiglu_forward(int64_t n, const float* gate, const float* up, float* out, int threads);
Status swiglu_backward(int64_t n, const float* gate, const float* up, const float* dout,
                       float* dgate, float* dup, int threads);
Status gelu_forward(int64_t n, const float* x, float* out, int threads);
Status gelu_backward(int64_t n, const float* x, const float* dout, float* dx, int threads);

// ---- embedding and loss -------------------------------------------------------------------
Status embedding_forward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                         const float* table, float* out, int threads);
// Deterministic: each table row is owned by one thread and summed in index order.
Status embedding_backward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                          const float* dout, float* dtable, int threads);
Status cross_entropy(int64_t n, int64_t vocab, const float* logits, const int32_t* labels,
                     float grad_scale, double* loss_sum, int64_t* valid, float* dlogits,
                     int threads);

// ---- optimizer and compression ------------------------------------------------------------
// One fused streaming pass over (param, grad, m, v): 4 arrays read, 3 written.
Status adamw_step(int64_t n, const Backend::AdamWParams& hp, float* param, const float* grad,
                  float* m, float* v, int threads);
// n < 2^32. Samples to estimate a threshold, collects candidates above it in one streaming pass,
// selects exactly among them; falls back to an exact radix (histogram) selection when the
// estimate gives too few or too many candidates. NaN counts as larger than any number.
Status topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices, float* values,
                int threads);
// Which way the last topk_abs call on this thread went (tests check every path is exercised).
enum class TopkPath : int {
  kExact = 0,            // small n or large k: exact radix selection directly
  kSampled = 1,          // sampled threshold, one pass, exact selection among candidates
  kFallbackTooFew = 2,   // sampled threshold gave fewer than k candidates: exact selection
  kFallbackTooMany = 3,  // sampled threshold gave too many candidates: exact selection
};
TopkPath topk_last_path();
// Test hook: bits >= 0 forces the candidate threshold (candidates: bit pattern of |x| > bits)
// instead of sampling, to drive the fallbacks; -1 restores sampling.
void set_topk_threshold_for_testing(int64_t bits);

// ---- elementwise helpers ------------------------------------------------------------------
Status fill(int64_t n, float value, float* x, int threads);
Status scale(int64_t n, float alpha, float* x, int threads);
Status axpy(int64_t n, float alpha, const float* x, float* y, int threads);
Status add(int64_t n, const float* a, const float* b, float* out, int threads);
Status sum_squares(int64_t n, const float* x, double* out, int threads);

}  // namespace ring::kernels::cpu
