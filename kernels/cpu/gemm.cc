#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/env_choice.h"
#include "kernels/cpu/ops.h"

#if RING_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_threads(void);
extern "C" char* openblas_get_corename(void);

namespace ring::kernels::cpu {
namespace {

EnvChoice g_provider;

int choose_provider() {
  const char* env = std::getenv("RING_GEMM");
  GemmChoice choice = resolve_gemm_provider(env ? env : "", gemm_facts());
  std::fprintf(stderr, "ring kernels: %sGEMM provider %s (%s)\n", choice.warning ? "warning: " : "",
               gemm_provider_name(choice.value), choice.reason.c_str());
  return static_cast<int>(choice.value);
}

const char* level_name(int level) {
  return level >= 2 ? "AVX-512" : level == 1 ? "AVX2+FMA" : "SSE";
}

}  // namespace

constexpr NamedChoice<GemmProvider> kProviderNames[] = {
    {GemmProvider::kOpenBlas, "openblas", true},
    {GemmProvider::kOneDnn, "onednn", RING_HAVE_ONEDNN != 0},
};

const char* gemm_provider_name(GemmProvider p) { return choice_name(kProviderNames, p); }

bool gemm_provider_built(GemmProvider p) { return choice_built(kProviderNames, p); }

GemmFacts gemm_facts() {
  GemmFacts f;
  const char* core = openblas_get_corename();
  f.openblas_core = core ? core : "";
  f.cpu_vector_level = isa_supported(Isa::kAvx512) ? 2 : isa_supported(Isa::kAvx2) ? 1 : 0;
  f.onednn_built = gemm_provider_built(GemmProvider::kOneDnn);
  return f;
}

int openblas_core_vector_level(const std::string& core) {
  // OpenBLAS's x86-64 core names (driver/others/dynamic.c). Cooperlake is SkylakeX plus bf16;
  // Sandybridge has AVX without FMA, which counts as a fallback on an AVX2+FMA CPU.
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (core == c) return 2;
  }
  for (const char* c : {"Haswell", "Zen"}) {
    if (core == c) return 1;
  }
  return 0;
}

GemmChoice resolve_gemm_provider(const std::string& env_value, const GemmFacts& facts) {
  GemmChoice choice;
  for (GemmProvider p : kGemmProviders) {
    if (env_value != gemm_provider_name(p)) continue;
    if (p == GemmProvider::kOneDnn && !facts.onednn_built) {
      choice.reason = "RING_GEMM=onednn: this build has no oneDNN (libdnnl-dev); using openblas";
      choice.warning = true;
      return choice;
    }
    choice.value = p;
    choice.reason = "RING_GEMM=" + env_value;
    return choice;
  }
  std::string prefix;
  if (!env_value.empty() && env_value != "auto") {
    prefix = "RING_GEMM=" + env_value + ": unknown (expected openblas, onednn or auto); ";
    choice.warning = true;
  }
  const int core_level = openblas_core_vector_level(facts.openblas_core);
  const std::string core = "OpenBLAS core " + facts.openblas_core + " (" + level_name(core_level) +
                           " kernels), CPU " + level_name(facts.cpu_vector_level);
  if (core_level >= facts.cpu_vector_level) {
    choice.reason = prefix + "auto: " + core + ": OpenBLAS runs the CPU's widest kernels";
  } else if (!facts.onednn_built) {
    choice.reason = prefix + "auto: " + core + ": OpenBLAS fell back to older kernels, but this " +
                    "build has no oneDNN (libdnnl-dev)";
  } else {
    choice.value = GemmProvider::kOneDnn;
    choice.reason = prefix + "auto: " + core + ": OpenBLAS fell back to older kernels; oneDNN " +
                    "picks its kernels from the CPU's features";
  }
  return choice;
}

GemmProvider active_gemm_provider() {
  return static_cast<GemmProvider>(g_provider.get(choose_provider));
}

Status set_gemm_provider(GemmProvider p) {
  int v = static_cast<int>(p);
  if (v < 0 || v > 1) return Status::kInvalidArgument;
  if (!gemm_provider_built(p)) return Status::kUnsupported;
  g_provider.set(v, choose_provider);
  return Status::kOk;
}

Status sgemm(GemmProvider p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
             float* c, int64_t ldc, int threads) {
  switch (p) {
    case GemmProvider::kOpenBlas:
      // The OpenBLAS thread count is process-wide (other callers may change it): set it per
      // call, only when it differs (setting it resizes OpenBLAS's pool).
      if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                  beta, c, static_cast<int>(ldc));
      return Status::kOk;
    case GemmProvider::kOneDnn: {
#if RING_HAVE_ONEDNN
      // Debian's oneDNN runs on OpenMP and takes its thread count from omp_get_max_threads(),
      // an ICV of the calling thread: set it for this call only.
      const int saved = omp_get_max_threads();
      if (saved != threads) omp_set_num_threads(threads);
      // dnnl_sgemm is row-major, like the Backend contract (unlike Fortran BLAS).
      dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                    lda, b, ldb, beta, c, ldc);
      if (saved != threads) omp_set_num_threads(saved);
      if (st == dnnl_success) return Status::kOk;
      return st == dnnl_out_of_memory ? Status::kOutOfMemory : Status::kInternal;
#else
      return Status::kUnsupported;
#endif
    }
  }
  return Status::kInvalidArgument;
}

}  // namespace ring::kernels::cpu
