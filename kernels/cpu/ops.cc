// CPU ops: argument validation, thread splitting (OpenMP), run-time ISA dispatch, and the parts
// that are not per-ISA (GEMM argument checks, the GEMM itself being gemm.h's provider; embedding
// copies, top-k selection logic, RoPE angle tables). The vector kernels live in ops_isa.inc,
// compiled here once per ISA.
// GCC 12 warns (-Wmaybe-uninitialized) inside its own avx512fintrin.h, where intrinsics use
// _mm512_undefined_*() as a pass-through operand: a false positive (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "common/numeric/bf16.h"
#include "kernels/cpu/env_choice.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd.h"

namespace ring::kernels::cpu {
namespace {

// Precomputed per-call AdamW constants (bias corrections folded in, computed in fp64).
struct AdamConsts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  float decay;         // 1 - lr * weight_decay
};

// The serial per-ISA kernels; ops_isa.inc fills one table per ISA.
struct Kernels {
  void (*adamw)(int64_t n, const AdamConsts& c, float* p, const float* g, float* m, float* v);
  void (*rmsnorm_fwd)(int64_t rows, int64_t d, float eps, const float* x, const float* gain,
                      float* y, float* rstd);
  void (*rmsnorm_bwd)(int64_t rows, int64_t d, const float* x, const float* gain, const float* rstd,
                      const float* dy, float* dx, float* dgain_acc);
  void (*rope_token)(int64_t heads, int64_t hd, const float* cc, const float* ss, float* x);
  void (*swiglu_fwd)(int64_t n, const float* gate, const float* up, float* out);
  void (*swiglu_bwd)(int64_t n, const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup);
  void (*gelu_fwd)(int64_t n, const float* x, float* out);
  void (*gelu_bwd)(int64_t n, const float* x, const float* dout, float* dx);
  double (*ce_rows)(int64_t rows, int64_t vocab, const float* logits, const int32_t* labels,
                    float grad_scale, float* dlogits, int64_t* valid);
  void (*fill)(int64_t n, float value, float* x);
  void (*scale)(int64_t n, float alpha, float* x);
  void (*axpy)(int64_t n, float alpha, const float* x, float* y);
  void (*add)(int64_t n, const float* a, const float* b, float* out);
  double (*sum_squares)(int64_t n, const float* x);
  int64_t (*collect_above)(int64_t n, const float* x, uint32_t base, int32_t threshold,
                           uint32_t* out, float* out_val, int64_t cap);
  void (*to_bf16)(int64_t n, const float* x, uint16_t* out);
  void (*from_bf16)(int64_t n, const uint16_t* x, float* out);
  void (*round_bf16)(int64_t n, float* x);
};

#define RING_ISA_FILE "kernels/cpu/ops_isa.inc"
#include "kernels/cpu/isa_each.inc"

constexpr Kernels kKernels[3] = {scalar::make_kernels(), avx2::make_kernels(),
                                 avx512::make_kernels()};

EnvChoice g_isa;

int choose_isa() {
  const char* env = std::getenv("RING_CPU_ISA");
  std::string warning;
  Isa isa = resolve_isa(env ? env : "", &warning);
  if (!warning.empty()) std::fprintf(stderr, "ring kernels: %s\n", warning.c_str());
  return static_cast<int>(isa);
}

const Kernels& kernels() {
  return kKernels[static_cast<int>(active_isa())];
}

// ---- threading --------------------------------------------------------------------------
// Splits [0, n) into one contiguous range per thread (boundaries multiples of `align`
// elements, so threads never share a cache line of a 64-byte aligned array) and calls
// f(thread_index, begin, end) on each. Uses fewer threads when a thread would get less than
// `grain` elements. Ranges are in thread-index order, which callers rely on for ordering.
template <class F>
void parallel_ranges(int64_t n, int threads, int64_t grain, F&& f) {
  constexpr int64_t kAlign = 16;
  int64_t want = std::max<int64_t>(1, std::min<int64_t>(threads, n / std::max<int64_t>(grain, 1)));
  if (want <= 1) {
    f(0, int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(want))
  {
    int64_t nt = omp_get_num_threads();
    int64_t id = omp_get_thread_num();
    int64_t chunk = (n + nt - 1) / nt;
    chunk = (chunk + kAlign - 1) / kAlign * kAlign;
    int64_t b = std::min(n, id * chunk), e = std::min(n, b + chunk);
    f(static_cast<int>(id), b, e);
  }
}

// Element counts below which splitting across threads costs more than it saves.
constexpr int64_t kGrainStream = 1 << 15;  // cheap streaming ops (fill, add, adamw, ...)
constexpr int64_t kGrainMath = 1 << 12;    // transcendental ops (gelu, swiglu)

bool bad(int64_t n) {
  return n < 0;
}
template <class... P>
bool any_null(int64_t n, P... p) {
  return n > 0 && ((p == nullptr) || ...);
}

Status check_elementwise(int64_t n, bool pointers_ok) {
  if (n < 0 || !pointers_ok) return Status::kInvalidArgument;
  return Status::kOk;
}

// An elementwise op: arguments checked, [0, n) cut into ranges over `threads` threads, body(k,
// begin, end) for each with the active ISA's kernels.
template <typename Body>
Status elementwise(int64_t n, bool pointers_ok, int threads, Body body) {
  if (Status s = check_elementwise(n, pointers_ok); s != Status::kOk) return s;
  const Kernels& k = kernels();
  parallel_ranges(n, threads, kGrainStream, [&](int, int64_t b, int64_t e) { body(k, b, e); });
  return Status::kOk;
}

}  // namespace

// ---- ISA selection ------------------------------------------------------------------------
const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa resolve_isa(const std::string& env_value, std::string* warning) {
  if (env_value.empty() || env_value == "auto") return best_isa();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (env_value != isa_name(isa)) continue;
    if (isa_supported(isa)) return isa;
    if (warning) {
      *warning = std::string("RING_CPU_ISA=") + env_value + ": this CPU lacks it; using " +
                 isa_name(best_isa());
    }
    return best_isa();
  }
  if (warning) {
    *warning = std::string("RING_CPU_ISA=") + env_value +
               ": unknown (expected avx512, avx2, scalar or auto); using " + isa_name(best_isa());
  }
  return best_isa();
}

Isa active_isa() {
  return static_cast<Isa>(g_isa.get(choose_isa));
}

Status set_isa(Isa isa) {
  int v = static_cast<int>(isa);
  if (v < 0 || v > 2) return Status::kInvalidArgument;
  if (!isa_supported(isa)) return Status::kUnsupported;
  g_isa.set(v, choose_isa);
  return Status::kOk;
}

int hardware_threads() {
  return std::max(1, omp_get_num_procs());
}

// ---- GEMM ---------------------------------------------------------------------------------
Status gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
            int64_t ldc, int threads) {
  return gemm_mixed(dtype, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                    threads);
}

namespace {

// C = beta C over [m, n] (row stride ldc), as BLAS does for k = 0 or alpha = 0: beta 0
// overwrites (NaN included). A bf16 C is widened, scaled and rounded back by the one rounding.
void scale_c(DType c_dtype, int64_t m, int64_t n, float beta, void* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    if (c_dtype == DType::kF32) {
      float* row = static_cast<float*>(c) + i * ldc;
      if (beta == 0.f) {
        std::fill(row, row + n, 0.f);
      } else {
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
      }
    } else {
      uint16_t* row = static_cast<uint16_t*>(c) + i * ldc;
      for (int64_t j = 0; j < n; ++j) {
        row[j] = beta == 0.f ? uint16_t{0}
                             : numeric::f32_to_bf16(beta * numeric::bf16_to_f32(row[j]));
      }
    }
  }
}

}  // namespace

Status gemm_mixed(DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                  float beta, void* c, int64_t ldc, int threads, std::string* error) {
  auto fail = [&](Status s, const std::string& why) {
    if (error) *error = "gemm: " + why;
    return s;
  };
  if ((ab != DType::kF32 && ab != DType::kBF16) ||
      (c_dtype != DType::kF32 && c_dtype != DType::kBF16)) {
    return fail(Status::kInvalidArgument, "storage must be f32 or bf16");
  }
  if (ab == DType::kF32 && c_dtype == DType::kBF16) {
    return fail(Status::kUnsupported, "fp32 A and B with a bf16 C is not implemented");
  }
  if (m < 0 || n < 0 || k < 0) return fail(Status::kInvalidArgument, "negative size");
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m > kMax || n > kMax || k > kMax || lda > kMax || ldb > kMax || ldc > kMax) {
    // cblas takes int (so does every provider here)
    return fail(Status::kInvalidArgument, "m, n, k and leading dimensions must be below 2^31");
  }
  // Row-major leading dimensions: columns of the stored matrix, at least 1.
  int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) ||
      ldc < std::max<int64_t>(1, n)) {
    return fail(Status::kInvalidArgument,
                "leading dimension smaller than the row length (row-major)");
  }
  if (m == 0 || n == 0) return Status::kOk;
  if (c == nullptr || (k > 0 && (a == nullptr || b == nullptr))) {
    return fail(Status::kInvalidArgument, "null pointer");
  }
  if (k == 0 || alpha == 0.f) {  // C = beta C (beta 0 overwrites, as BLAS does)
    scale_c(c_dtype, m, n, beta, c, ldc);
    return Status::kOk;
  }
  if (ab == DType::kBF16) {
    return bf16_gemm(active_bf16_gemm_path(), trans_a, trans_b, m, n, k, alpha,
                     static_cast<const uint16_t*>(a), lda, static_cast<const uint16_t*>(b), ldb,
                     beta, c, c_dtype, ldc, threads, error);
  }
  Status s = sgemm(active_gemm_provider(), trans_a, trans_b, m, n, k, alpha,
                   static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb, beta,
                   static_cast<float*>(c), ldc, threads);
  if (s != Status::kOk) {
    return fail(s, std::string("fp32 sgemm through ") +
                       gemm_provider_name(active_gemm_provider()) + " failed");
  }
  return s;
}

// ---- RMSNorm ------------------------------------------------------------------------------
Status rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x, const float* gain, float* y,
                       float* rstd, int threads) {
  if (bad(n) || bad(d) || (n > 0 && d == 0) || !(eps >= 0.f) || !std::isfinite(eps) ||
      any_null(n, x, gain, y, rstd)) {
    return Status::kInvalidArgument;
  }
  const Kernels& k = kernels();
  parallel_ranges(n, threads, std::max<int64_t>(1, kGrainStream / std::max<int64_t>(d, 1)),
                  [&](int, int64_t b, int64_t e) {
                    k.rmsnorm_fwd(e - b, d, eps, x + b * d, gain, y + b * d, rstd + b);
                  });
  return Status::kOk;
}

Status rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain, const float* rstd,
                        const float* dy, float* dx, float* dgain, int threads) {
  if (bad(n) || bad(d) || (n > 0 && d == 0) || any_null(n, x, gain, rstd, dy, dx, dgain)) {
    return Status::kInvalidArgument;
  }
  if (n == 0) return Status::kOk;
  const Kernels& k = kernels();
  int nt = std::max(1, threads);
  // Per-thread dgain partials [threads, d], summed in thread order: deterministic for a given
  // thread count.
  std::vector<float> partial(static_cast<size_t>(nt) * d, 0.f);
  std::vector<char> used(nt, 0);
  parallel_ranges(n, nt, std::max<int64_t>(1, kGrainStream / d), [&](int t, int64_t b, int64_t e) {
    used[t] = 1;
    k.rmsnorm_bwd(e - b, d, x + b * d, gain, rstd + b, dy + b * d, dx + b * d,
                  partial.data() + static_cast<size_t>(t) * d);
  });
  for (int t = 0; t < nt; ++t) {
    if (used[t]) k.add(d, dgain, partial.data() + static_cast<size_t>(t) * d, dgain);
  }
  return Status::kOk;
}

// ---- RoPE ---------------------------------------------------------------------------------
Status rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& rp, const int64_t* pos,
            bool inverse, float* x, int threads) {
  if (bad(n) || bad(heads) || bad(head_dim) || head_dim % 2 != 0 || !rope_params_valid(rp) ||
      any_null(n, pos, x)) {
    return Status::kInvalidArgument;
  }
  if (n == 0 || heads == 0 || head_dim == 0) return Status::kOk;
  const Kernels& k = kernels();
  const int64_t half = head_dim / 2;
  // inv_freq[j] = theta^(-2j/head_dim) (scaled: kernels/rope.h), fp64: angles pos * inv_freq
  // reach 1e6 rad, where fp32 would lose whole radians.
  std::vector<double> inv_freq(half);
  for (int64_t j = 0; j < half; ++j) inv_freq[j] = rope_inv_freq(rp, j, head_dim);
  const double mscale = rope_attention_factor(rp);  // yarn's attention factor, else 1
  const double sign = inverse ? -1.0 : 1.0;
  parallel_ranges(n, threads, std::max<int64_t>(1, 256 / std::max<int64_t>(heads, 1)),
                  [&](int, int64_t b, int64_t e) {
                    std::vector<float> cc(head_dim), ss(head_dim);
                    for (int64_t i = b; i < e; ++i) {
                      double p = static_cast<double>(pos[i]);
                      for (int64_t j = 0; j < half; ++j) {
                        double ang = p * inv_freq[j];
                        float c = static_cast<float>(mscale * std::cos(ang));
                        float s = static_cast<float>(sign * mscale * std::sin(ang));
                        cc[2 * j] = cc[2 * j + 1] = c;
                        ss[2 * j] = -s;
                        ss[2 * j + 1] = s;
                      }
                      k.rope_token(heads, head_dim, cc.data(), ss.data(), x + i * heads * head_dim);
                    }
                  });
  return Status::kOk;
}

// ---- activations ----------------------------------------------------------------------------
Status swiglu_forward(int64_t n, const float* gate, const float* up, float* out, int threads) {
  if (bad(n) || any_null(n, gate, up, out)) return Status::kInvalidArgument;
  const Kernels& k = kernels();
  parallel_ranges(n, threads, kGrainMath, [&](int, int64_t b, int64_t e) {
    k.swiglu_fwd(e - b, gate + b, up + b, out + b);
  });
  return Status::kOk;
}

Status swiglu_backward(int64_t n, const float* gate, const float* up, const float* dout,
                       float* dgate, float* dup, int threads) {
  if (bad(n) || any_null(n, gate, up, dout, dgate, dup)) return Status::kInvalidArgument;
  const Kernels& k = kernels();
  parallel_ranges(n, threads, kGrainMath, [&](int, int64_t b, int64_t e) {
    k.swiglu_bwd(e - b, gate + b, up + b, dout + b, dgate + b, dup + b);
  });
  return Status::kOk;
}

Status gelu_forward(int64_t n, const float* x, float* out, int threads) {
  if (bad(n) || any_null(n, x, out)) return Status::kInvalidArgument;
  const Kernels& k = kernels();
  parallel_ranges(n, threads, kGrainMath,
                  [&](int, int64_t b, int64_t e) { k.gelu_fwd(e - b, x + b, out + b); });
  return Status::kOk;
}

Status gelu_backward(int64_t n, const float* x, const float* dout, float* dx, int threads) {
  if (bad(n) || any_null(n, x, dout, dx)) return Status::kInvalidArgument;
  const Kernels& k = kernels();
  parallel_ranges(n, threads, kGrainMath,
                  [&](int, int64_t b, int64_t e) { k.gelu_bwd(e - b, x + b, dout + b, dx + b); });
  return Status::kOk;
}

// ---- embedding ----------------------------------------------------------------------------
namespace {
bool ids_in_range(int64_t n, int64_t vocab, const int32_t* ids) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) return false;
  }
  return true;
}
}  // namespace

Status embedding_forward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                         const float* table, float* out, int threads) {
  if (bad(n) || bad(vocab) || bad(d) || any_null(n, ids, out) ||
      (n > 0 && d > 0 && table == nullptr) || !ids_in_range(n, vocab, ids)) {
    return Status::kInvalidArgument;
  }
  if (d == 0) return Status::kOk;
  parallel_ranges(
      n, threads, std::max<int64_t>(1, kGrainStream / d), [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          std::memcpy(out + i * d, table + static_cast<int64_t>(ids[i]) * d, sizeof(float) * d);
        }
      });
  return Status::kOk;
}

Status embedding_backward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                          const float* dout, float* dtable, int threads) {
  if (bad(n) || bad(vocab) || bad(d) || any_null(n, ids) ||
      (n > 0 && d > 0 && (dout == nullptr || dtable == nullptr)) || !ids_in_range(n, vocab, ids)) {
    return Status::kInvalidArgument;
  }
  if (n == 0 || d == 0) return Status::kOk;
  const Kernels& k = kernels();
  int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n * d / kGrainStream)));
  // Rows are owned by thread id % nt: no two threads write one row, and each row sums its
  // contributions in token order (deterministic). Every thread scans all ids (cheap).
  auto body = [&](int t) {
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] % nt != t) continue;
      float* row = dtable + static_cast<int64_t>(ids[i]) * d;
      k.add(d, row, dout + i * d, row);
    }
  };
  if (nt == 1) {
    body(0);
  } else {
#pragma omp parallel num_threads(nt)
    {
      if (omp_get_num_threads() == nt) {
        body(omp_get_thread_num());
      } else {
#pragma omp single
        for (int t = 0; t < nt; ++t) body(t);
      }
    }
  }
  return Status::kOk;
}

// ---- cross-entropy ------------------------------------------------------------------------
Status cross_entropy(int64_t n, int64_t vocab, const float* logits, const int32_t* labels,
                     float grad_scale, double* loss_sum, int64_t* valid, float* dlogits,
                     int threads) {
  if (bad(n) || bad(vocab) || (n > 0 && vocab == 0) || any_null(n, logits, labels) ||
      loss_sum == nullptr || valid == nullptr) {
    return Status::kInvalidArgument;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] != -1 && (labels[i] < 0 || labels[i] >= vocab)) {
      return Status::kInvalidArgument;
    }
  }
  const Kernels& k = kernels();
  int nt = std::max(1, threads);
  std::vector<double> loss(nt, 0.0);
  std::vector<int64_t> count(nt, 0);
  parallel_ranges(n, nt, std::max<int64_t>(1, kGrainMath / std::max<int64_t>(vocab, 1)),
                  [&](int t, int64_t b, int64_t e) {
                    loss[t] = k.ce_rows(e - b, vocab, logits + b * vocab, labels + b, grad_scale,
                                        dlogits ? dlogits + b * vocab : nullptr, &count[t]);
                  });
  double total = 0.0;
  int64_t total_valid = 0;
  for (int t = 0; t < nt; ++t) {  // fixed order: deterministic for a given thread count
    total += loss[t];
    total_valid += count[t];
  }
  *loss_sum = total;
  *valid = total_valid;
  return Status::kOk;
}

// ---- AdamW --------------------------------------------------------------------------------
Status adamw_step(int64_t n, const Backend::AdamWParams& hp, float* param, const float* grad,
                  float* m, float* v, int threads) {
  if (bad(n) || any_null(n, param, grad, m, v) || hp.step < 1 || !(hp.beta1 >= 0.f) ||
      !(hp.beta1 < 1.f) || !(hp.beta2 >= 0.f) || !(hp.beta2 < 1.f) || !(hp.eps >= 0.f) ||
      !std::isfinite(hp.lr) || !std::isfinite(hp.eps) || !std::isfinite(hp.weight_decay)) {
    return Status::kInvalidArgument;
  }
  double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  AdamConsts c;
  c.beta1 = hp.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.beta2 = hp.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.eps = hp.eps;
  c.step_size = static_cast<float>(hp.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  const Kernels& k = kernels();
  parallel_ranges(n, threads, kGrainStream, [&](int, int64_t b, int64_t e) {
    k.adamw(e - b, c, param + b, grad + b, m + b, v + b);
  });
  return Status::kOk;
}

// ---- top-k by magnitude ---------------------------------------------------------------------
// Order: larger |x| first (compared on the IEEE bits of |x|: NaN above inf), then lower index.
// key = bits(|x|) << 32 | ~index is unique per element and larger means preferred, so "the k
// largest keys" is exactly the contract's selection.
namespace {

inline int32_t abs_bits(float f) {
  return static_cast<int32_t>(std::bit_cast<uint32_t>(f) & 0x7fffffffu);
}
inline uint64_t topk_key(int32_t bits, uint32_t index) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(bits)) << 32) | (0xffffffffu - index);
}

std::atomic<int64_t> g_topk_threshold_override{-1};
thread_local TopkPath g_topk_last_path = TopkPath::kExact;

// Exact selection in a bounded number of streaming passes (radix select on the 31 bits of
// |x|): find the k-th largest bit pattern V (two 15/16-bit histogram passes), then take every
// element above V and the first (k - above) equal to V in index order.
void topk_exact(int64_t n, int64_t k, const float* x, uint32_t* indices, int threads) {
  int nt = std::max(1, threads);
  // Pass 1: histogram of the high 15 bits (bits >> 16, < 2^15).
  constexpr int kHi = 1 << 15, kLo = 1 << 16;
  std::vector<std::vector<int64_t>> hist(nt);
  parallel_ranges(n, nt, kGrainStream, [&](int t, int64_t b, int64_t e) {
    hist[t].assign(kHi, 0);
    for (int64_t i = b; i < e; ++i) ++hist[t][abs_bits(x[i]) >> 16];
  });
  std::vector<int64_t> h(kHi, 0);
  for (auto& ht : hist) {
    if (!ht.empty()) {
      for (int q = 0; q < kHi; ++q) h[q] += ht[q];
    }
  }
  int64_t above = 0;  // elements in bins strictly above the boundary bin
  int hi_bin = kHi - 1;
  while (above + h[hi_bin] < k) above += h[hi_bin--];
  // Pass 2: histogram of the low 16 bits inside the boundary bin.
  parallel_ranges(n, nt, kGrainStream, [&](int t, int64_t b, int64_t e) {
    hist[t].assign(kLo, 0);
    for (int64_t i = b; i < e; ++i) {
      int32_t bits = abs_bits(x[i]);
      if ((bits >> 16) == hi_bin) ++hist[t][bits & 0xffff];
    }
  });
  std::vector<int64_t> l(kLo, 0);
  for (auto& ht : hist) {
    if (!ht.empty()) {
      for (int q = 0; q < kLo; ++q) l[q] += ht[q];
    }
  }
  int lo_bin = kLo - 1;
  while (above + l[lo_bin] < k) above += l[lo_bin--];
  const int32_t kth = (hi_bin << 16) | lo_bin;  // the k-th largest |x| bit pattern
  const int64_t take_equal = k - above;         // >= 1 elements equal to kth are taken
  // Pass 3: per-thread counts (above, equal); pass 4: write in index order.
  std::vector<int64_t> n_above(nt, 0), n_equal(nt, 0);
  std::vector<int64_t> range_b(nt, 0), range_e(nt, 0);
  parallel_ranges(n, nt, kGrainStream, [&](int t, int64_t b, int64_t e) {
    range_b[t] = b;
    range_e[t] = e;
    int64_t a = 0, q = 0;
    for (int64_t i = b; i < e; ++i) {
      int32_t bits = abs_bits(x[i]);
      a += bits > kth;
      q += bits == kth;
    }
    n_above[t] = a;
    n_equal[t] = q;
  });
  std::vector<int64_t> offset(nt, 0), eq_quota(nt, 0);
  int64_t out = 0, eq_before = 0;
  for (int t = 0; t < nt; ++t) {
    eq_quota[t] = std::clamp<int64_t>(take_equal - eq_before, 0, n_equal[t]);
    eq_before += n_equal[t];
    offset[t] = out;
    out += n_above[t] + eq_quota[t];
  }
  parallel_ranges(n, nt, kGrainStream, [&](int t, int64_t b, int64_t e) {
    uint32_t* o = indices + offset[t];
    int64_t quota = eq_quota[t];
    for (int64_t i = b; i < e; ++i) {
      int32_t bits = abs_bits(x[i]);
      if (bits > kth || (bits == kth && quota-- > 0)) *o++ = static_cast<uint32_t>(i);
    }
  });
}

// Fast path. Returns false (nothing written) when the sampled threshold gives fewer than k or
// too many candidates; the caller then runs topk_exact.
bool topk_sampled(int64_t n, int64_t k, const float* x, uint32_t* indices, float* values,
                  int threads, TopkPath* why_not) {
  const Kernels& kern = kernels();
  int32_t threshold;  // candidates: bits(|x|) > threshold
  double expected_fraction;
  int64_t forced = g_topk_threshold_override.load();
  if (forced >= 0) {
    threshold = static_cast<int32_t>(forced);
    expected_fraction = 4.0 * k / n;
  } else {
    // Sample s elements, one per stratum of n/s at a hashed offset (no periodic aliasing).
    const int64_t s = std::min<int64_t>(n / 4, 1 << 16);
    // Each read is a cache miss: spread them over the threads.
    std::vector<int32_t> sample(s);
    parallel_ranges(s, threads, 4096, [&](int, int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        uint64_t h = (static_cast<uint64_t>(j) + 1) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        double u = static_cast<double>(h >> 11) * 0x1.0p-53;
        int64_t i = std::min<int64_t>(n - 1, static_cast<int64_t>((j + u) * n / s));
        sample[j] = abs_bits(x[i]);
      }
    });
    // Rank r: a margin of 25% + 4 sigma above the expected count of sampled elements in the
    // top k, so the threshold lands below the true k-th value with overwhelming probability
    // while keeping about 1.3-1.7 k candidates.
    double expected = static_cast<double>(k) * s / n;
    int64_t r = static_cast<int64_t>(std::ceil(expected * 1.25 + 4.0 * std::sqrt(expected) + 4));
    if (r >= s) {
      *why_not = TopkPath::kExact;
      return false;
    }
    std::nth_element(sample.begin(), sample.begin() + (r - 1), sample.end(), std::greater<>());
    threshold = sample[r - 1] - 1;  // bits > threshold  <=>  bits >= r-th largest sample
    expected_fraction = static_cast<double>(r) / s;
  }
  // One streaming pass: per-thread candidate lists, bounded at twice the expected count.
  int nt = std::max(1, threads);
  // Default-initialized (not zeroed): only the pages candidates land on are ever touched.
  std::vector<std::unique_ptr<uint32_t[]>> cand(nt);
  std::vector<std::unique_ptr<float[]>> cand_val(nt);
  std::vector<int64_t> got(nt, 0);
  std::atomic<bool> overflow{false};
  parallel_ranges(n, nt, kGrainStream, [&](int t, int64_t b, int64_t e) {
    int64_t cap = static_cast<int64_t>(2.0 * expected_fraction * (e - b)) + 4096;
    cand[t].reset(new uint32_t[cap]);
    cand_val[t].reset(new float[cap]);
    got[t] = kern.collect_above(e - b, x + b, static_cast<uint32_t>(b), threshold, cand[t].get(),
                                cand_val[t].get(), cap);
    if (got[t] < 0) overflow = true;
  });
  if (overflow) {
    *why_not = TopkPath::kFallbackTooMany;
    return false;
  }
  int64_t total = 0;
  for (int t = 0; t < nt; ++t) total += got[t];
  if (total < k) {
    *why_not = TopkPath::kFallbackTooFew;
    return false;
  }
  // Every element outside the candidates is smaller than every candidate, and there are at
  // least k candidates: the top k are among them. Find the k-th largest candidate key.
  std::vector<uint64_t> keys;
  keys.reserve(total);
  for (int t = 0; t < nt; ++t) {
    for (int64_t q = 0; q < got[t]; ++q) {
      keys.push_back(topk_key(abs_bits(cand_val[t][q]), cand[t][q]));
    }
  }
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<>());
  const uint64_t kth = keys[k - 1];
  // Candidates are in ascending index order (thread ranges are ordered): keep those >= kth.
  int64_t o = 0;
  for (int t = 0; t < nt; ++t) {
    for (int64_t q = 0; q < got[t]; ++q) {
      uint32_t i = cand[t][q];
      float xv = cand_val[t][q];
      if (o < k && topk_key(abs_bits(xv), i) >= kth) {
        indices[o] = i;
        values[o++] = xv;
      }
    }
  }
  if (o != k) {  // cannot happen (keys are unique); report it so tests see a broken fast path
    *why_not = TopkPath::kExact;
    return false;
  }
  return true;
}

}  // namespace

void set_topk_threshold_for_testing(int64_t bits) {
  g_topk_threshold_override = bits;
}
TopkPath topk_last_path() {
  return g_topk_last_path;
}

Status topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices, float* values,
                int threads) {
  if (bad(n) || bad(k) || k > n || n > (int64_t{1} << 32) || any_null(n, x) ||
      any_null(k, indices, values)) {
    return Status::kInvalidArgument;
  }
  if (k == 0) {
    g_topk_last_path = TopkPath::kExact;
    return Status::kOk;
  }
  if (k == n) {
    for (int64_t i = 0; i < n; ++i) indices[i] = static_cast<uint32_t>(i);
    g_topk_last_path = TopkPath::kExact;
  } else {
    // Sampling pays off when n is large and k a small fraction of it.
    TopkPath path = TopkPath::kExact;
    if (n >= (int64_t{1} << 16) && k * 16 <= n) {
      path = TopkPath::kSampled;
      if (topk_sampled(n, k, x, indices, values, threads, &path)) {
        g_topk_last_path = path;
        return Status::kOk;  // values written from the candidates
      }
    }
    topk_exact(n, k, x, indices, threads);
    g_topk_last_path = path;
  }
  parallel_ranges(k, threads, kGrainStream, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) values[i] = x[indices[i]];
  });
  return Status::kOk;
}

// ---- elementwise helpers ------------------------------------------------------------------
Status fill(int64_t n, float value, float* x, int threads) {
  return elementwise(n, !any_null(n, x), threads,
                     [&](const Kernels& k, int64_t b, int64_t e) { k.fill(e - b, value, x + b); });
}

Status scale(int64_t n, float alpha, float* x, int threads) {
  return elementwise(n, !any_null(n, x), threads,
                     [&](const Kernels& k, int64_t b, int64_t e) { k.scale(e - b, alpha, x + b); });
}

Status axpy(int64_t n, float alpha, const float* x, float* y, int threads) {
  return elementwise(n, !any_null(n, x, y), threads, [&](const Kernels& k, int64_t b, int64_t e) {
    k.axpy(e - b, alpha, x + b, y + b);
  });
}

Status to_bf16(int64_t n, const float* x, uint16_t* out, int threads) {
  return elementwise(n, !any_null(n, x, out), threads, [&](const Kernels& k, int64_t b, int64_t e) {
    k.to_bf16(e - b, x + b, out + b);
  });
}

Status from_bf16(int64_t n, const uint16_t* x, float* out, int threads) {
  return elementwise(n, !any_null(n, x, out), threads, [&](const Kernels& k, int64_t b, int64_t e) {
    k.from_bf16(e - b, x + b, out + b);
  });
}

Status round_bf16(int64_t n, float* x, int threads) {
  return elementwise(n, !any_null(n, x), threads,
                     [&](const Kernels& k, int64_t b, int64_t e) { k.round_bf16(e - b, x + b); });
}

Status add(int64_t n, const float* a, const float* b, float* out, int threads) {
  return elementwise(
      n, !any_null(n, a, b, out), threads,
      [&](const Kernels& k, int64_t lo, int64_t hi) { k.add(hi - lo, a + lo, b + lo, out + lo); });
}

Status sum_squares(int64_t n, const float* x, double* out, int threads) {
  if (bad(n) || any_null(n, x) || out == nullptr) return Status::kInvalidArgument;
  const Kernels& k = kernels();
  int nt = std::max(1, threads);
  std::vector<double> part(nt, 0.0);
  parallel_ranges(n, nt, kGrainStream,
                  [&](int t, int64_t b, int64_t e) { part[t] = k.sum_squares(e - b, x + b); });
  double total = 0.0;
  for (double p : part) total += p;
  *out = total;
  return Status::kOk;
}

}  // namespace ring::kernels::cpu
