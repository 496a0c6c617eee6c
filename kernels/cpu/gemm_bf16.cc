// The bf16 GEMM of the CPU backend (kernels/cpu/gemm.h): the path choice from cpuid, the
// conversion path (bf16 -> fp32 tiles, the active fp32 provider) and the oneDNN matmul path with
// its primitive cache.
#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

#include "kernels/cpu/env_choice.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

#if RING_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace ring::kernels::cpu {
namespace {

// ---- the choice -----------------------------------------------------------------------------
EnvChoice g_path;

int choose_path() {
  const char* env = std::getenv("RING_BF16_GEMM");
  Bf16GemmChoice choice = resolve_bf16_gemm_path(env ? env : "", bf16_gemm_facts());
  std::fprintf(stderr, "ring kernels: %sbf16 GEMM path %s (%s)\n",
               choice.warning ? "warning: " : "", bf16_gemm_path_name(choice.value),
               choice.reason.c_str());
  return static_cast<int>(choice.value);
}

// Whether the OS saves the XCR0 state components in mask (so the instructions using them run).
bool os_saves(uint64_t mask) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0) return false;  // OSXSAVE
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  return (xcr0 & mask) == mask;
}

// What the CPU lacks for oneDNN's bf16 matmul, for error messages.
std::string cpu_bf16_features(const Bf16GemmFacts& f) {
  if (f.avx512_bf16 || f.amx_bf16) {
    return std::string("the CPU has") + (f.avx512_bf16 ? " AVX512_BF16" : "") +
           (f.amx_bf16 ? " AMX-BF16" : "");
  }
  return std::string("the CPU has neither AVX512_BF16 nor AMX-BF16") +
         (isa_supported(Isa::kAvx512) ? "" : ", nor AVX-512 (oneDNN's bf16 floor)");
}

// ---- the conversion path --------------------------------------------------------------------
// Tile sizes: a function of the shape only, so the bits of a result never depend on the machine.
// Tiles are large because each one is an sgemm call, and each call wakes the provider's threads
// (milliseconds on a loaded machine); an fp32 C tile holds up to kTileElems elements.
// Scratch per call: an A tile, a B tile (kTileDepth x kTileCols) and, for a bf16 C, a C tile of
// fp32: at most 16 + 32 + 16 MiB.
constexpr int64_t kTileCols = 4096;   // columns of op(B) and C per tile
constexpr int64_t kTileDepth = 2048;  // k per tile
constexpr int64_t kTileElems = int64_t{1} << 22;
// Conversions this large are split across the threads; smaller ones run on the calling thread
// (measured: waking OpenMP threads for each small tile costs more than it saves under load).
constexpr int64_t kWidenGrain = int64_t{1} << 22;

// dst [rows, cols] (dense) = src [rows, cols] with row stride ld, widened exactly.
void widen(int64_t rows, int64_t cols, const uint16_t* src, int64_t ld, float* dst, int threads) {
  if (rows * cols < kWidenGrain) threads = 1;
  if (ld == cols || rows == 1) {
    from_bf16(rows * cols, src, dst, threads);
    return;
  }
  const int nt = std::max(1, threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t r = 0; r < rows; ++r) from_bf16(cols, src + r * ld, dst + r * cols, 1);
}

// dst [rows, cols] with row stride ld = bf16(src [rows, cols] dense): the one rounding.
void narrow(int64_t rows, int64_t cols, const float* src, uint16_t* dst, int64_t ld, int threads) {
  if (rows * cols < kWidenGrain) threads = 1;
  if (ld == cols || rows == 1) {
    to_bf16(rows * cols, src, dst, threads);
    return;
  }
  const int nt = std::max(1, threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t r = 0; r < rows; ++r) to_bf16(cols, src + r * cols, dst + r * ld, 1);
}

std::unique_ptr<float[]> scratch_floats(int64_t n) {
  return std::unique_ptr<float[]>(new (std::nothrow) float[static_cast<size_t>(n)]);
}

// The conversion path's fp32 tiles, kept by each calling thread from one call to the next and
// grown when a call needs more (at most the 64 MiB above). Fresh tiles each call cost a page
// fault per 4 KiB touched: measured 8-10% of a 2048^3 GEMM on one AVX2 thread, more than the
// conversions themselves. Only the buffers are reused; tile shapes and sgemm calls are unchanged.
class TileScratch {
 public:
  // A buffer of at least n floats (slot 0: A tile, 1: B tile, 2: C tile), or null when out of
  // memory. Its contents are whatever the last call left.
  float* get(int slot, int64_t n) {
    Slot& s = slots_[slot];
    if (s.floats < n) {
      s.data.reset();  // free the old one first: never hold both
      s.data = scratch_floats(n);
      s.floats = s.data ? n : 0;
    }
    return s.data.get();
  }

 private:
  struct Slot {
    std::unique_ptr<float[]> data;
    int64_t floats = 0;
  };
  Slot slots_[3];
};

TileScratch& tile_scratch() {
  thread_local TileScratch scratch;
  return scratch;
}

Status convert_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                    void* c, DType c_dtype, int64_t ldc, int threads, std::string* error) {
  const int64_t nt = std::min(n, kTileCols), kt = std::min(k, kTileDepth);
  const int64_t mt = std::clamp<int64_t>(kTileElems / std::max(nt, kt), 1, m);
  const bool c_bf16 = c_dtype == DType::kBF16;
  TileScratch& scratch = tile_scratch();
  float* at = scratch.get(0, mt * kt);
  float* bt = scratch.get(1, kt * nt);
  float* ct = c_bf16 ? scratch.get(2, mt * nt) : nullptr;
  if (!at || !bt || (c_bf16 && !ct)) {
    if (error) *error = "bf16 GEMM path convert: out of memory for the fp32 tiles";
    return Status::kOutOfMemory;
  }
  const GemmProvider provider = active_gemm_provider();
  for (int64_t i0 = 0; i0 < m; i0 += mt) {
    const int64_t rows = std::min(mt, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += nt) {
      const int64_t cols = std::min(nt, n - j0);
      // The fp32 C tile: C itself when it is fp32, else a widened copy rounded back at the end.
      float* tile = c_bf16 ? ct : static_cast<float*>(c) + i0 * ldc + j0;
      const int64_t ld_tile = c_bf16 ? cols : ldc;
      uint16_t* c16 = c_bf16 ? static_cast<uint16_t*>(c) + i0 * ldc + j0 : nullptr;
      if (c_bf16 && beta != 0.f) widen(rows, cols, c16, ldc, tile, threads);
      for (int64_t p0 = 0; p0 < k; p0 += kt) {
        const int64_t depth = std::min(kt, k - p0);
        // op(A) tile [rows, depth]: A [m,k] rows i0.., or with ta A [k,m] rows p0.. (kept
        // transposed); op(B) tile [depth, cols] likewise. sgemm applies the transposes.
        if (ta) {
          widen(depth, rows, a + p0 * lda + i0, lda, at, threads);
        } else {
          widen(rows, depth, a + i0 * lda + p0, lda, at, threads);
        }
        if (tb) {
          widen(cols, depth, b + j0 * ldb + p0, ldb, bt, threads);
        } else {
          widen(depth, cols, b + p0 * ldb + j0, ldb, bt, threads);
        }
        // The first depth tile applies beta (0 overwrites); the others accumulate.
        Status s = sgemm(provider, ta, tb, rows, cols, depth, alpha, at, ta ? rows : depth,
                         bt, tb ? depth : cols, p0 == 0 ? beta : 1.f, tile, ld_tile,
                         threads);
        if (s != Status::kOk) {
          if (error) {
            *error = std::string("bf16 GEMM path convert: fp32 sgemm through ") +
                     gemm_provider_name(provider) + " failed: " + status_string(s);
          }
          return s;
        }
      }
      if (c_bf16) narrow(rows, cols, tile, c16, ldc, threads);
    }
  }
  return Status::kOk;
}

// ---- the oneDNN path ------------------------------------------------------------------------
#if RING_HAVE_ONEDNN
// For a bf16 C, oneDNN writes fp32 row panels of at most this many elements (16 MiB) that are
// then rounded by to_bf16; an fp32 C is written in place in one call.
constexpr int64_t kPanelFloats = int64_t{1} << 22;

// What a matmul primitive is specialised on (oneDNN JIT-compiles per shape and thread count).
struct MatmulKey {
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool ta = false, tb = false;
  uint32_t alpha = 0, beta = 0;  // bits; beta 0 means no sum post-op
  int threads = 1;
  bool operator==(const MatmulKey&) const = default;
};

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    size_t h = 0;
    for (uint64_t v : {uint64_t(k.m), uint64_t(k.n), uint64_t(k.k), uint64_t(k.lda),
                       uint64_t(k.ldb), uint64_t(k.ldc), uint64_t(k.ta) | uint64_t(k.tb) << 1,
                       uint64_t(k.alpha) | uint64_t(k.beta) << 32, uint64_t(k.threads)}) {
      h = (h ^ std::hash<uint64_t>{}(v)) * 0x100000001b3ull;
    }
    return h;
  }
};

struct Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, scratchpad;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A bounded map of primitives shared by all threads; the least recently used goes when full.
class MatmulCache {
 public:
  std::shared_ptr<const Matmul> find(const MatmulKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    it->second.second = ++tick_;
    return it->second.first;
  }
  void insert(const MatmulKey& key, std::shared_ptr<const Matmul> mm) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kCapacity && map_.find(key) == map_.end()) {
      auto oldest = map_.begin();
      for (auto it = map_.begin(); it != map_.end(); ++it) {
        if (it->second.second < oldest->second.second) oldest = it;
      }
      map_.erase(oldest);
    }
    map_[key] = {std::move(mm), ++tick_};
  }

 private:
  static constexpr size_t kCapacity = 64;
  std::mutex mu_;
  uint64_t tick_ = 0;
  std::unordered_map<MatmulKey, std::pair<std::shared_ptr<const Matmul>, uint64_t>, MatmulKeyHash>
      map_;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

const char* dnnl_isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::all:
      return "all";
    default:
      return "older than avx2";
  }
}

Status dnnl_failure(const dnnl::error& e, const char* what, std::string* error) {
  const Status s = e.status == dnnl_unimplemented    ? Status::kUnsupported
                   : e.status == dnnl_out_of_memory ? Status::kOutOfMemory
                                                    : Status::kInternal;
  if (error) {
    *error = std::string("bf16 GEMM path onednn: ") + what + ": " + e.what();
    if (s == Status::kUnsupported) {
      // oneDNN 2.6 runs bf16 matmul from AVX-512 (avx512_core) up, at speed with AVX512_BF16
      // or AMX-BF16; DNNL_MAX_CPU_ISA can hold it below what the CPU has.
      *error += std::string(" (no bf16 matmul in oneDNN for this CPU: ") +
                cpu_bf16_features(bf16_gemm_facts()) + "; oneDNN's effective ISA is " +
                dnnl_isa_name(dnnl::get_effective_cpu_isa()) +
                ", and it needs avx512_core or newer; RING_BF16_GEMM=convert or auto runs the " +
                "conversion path)";
    }
  }
  return s;
}

// The cached primitive for key, created on first use (with the OpenMP thread count set).
Status get_matmul(const MatmulKey& key, std::shared_ptr<const Matmul>* out, std::string* error) {
  if ((*out = matmul_cache().find(key))) return Status::kOk;
  using dnnl::memory;
  using dims = memory::dims;
  try {
    memory::desc a({key.m, key.k}, memory::data_type::bf16,
                   key.ta ? dims{1, key.lda} : dims{key.lda, 1});
    memory::desc b({key.k, key.n}, memory::data_type::bf16,
                   key.tb ? dims{1, key.ldb} : dims{key.ldb, 1});
    memory::desc c({key.m, key.n}, memory::data_type::f32, dims{key.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per call: concurrent calls are safe
    const float alpha = std::bit_cast<float>(key.alpha), beta = std::bit_cast<float>(key.beta);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});  // applied before the sum post-op
    if (beta != 0.f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);  // C = alpha op(A) op(B) + beta C
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    auto mm = std::make_shared<Matmul>(Matmul{dnnl::matmul(pd), a, b, c, pd.scratchpad_desc()});
    matmul_cache().insert(key, mm);
    *out = std::move(mm);
    return Status::kOk;
  } catch (const dnnl::error& e) {
    return dnnl_failure(e, "matmul primitive creation", error);
  }
}

// C [m, n] fp32 (row stride ldc) = alpha op(A) op(B) + beta C through one primitive.
Status run_matmul(MatmulKey key, const uint16_t* a, const uint16_t* b, float* c,
                  std::string* error) {
  std::shared_ptr<const Matmul> mm;
  if (Status s = get_matmul(key, &mm, error); s != Status::kOk) return s;
  try {
    dnnl::engine& eng = cpu_engine();
    const size_t scratch_bytes = mm->scratchpad.get_size();
    std::unique_ptr<uint8_t[]> scratch(
        new (std::nothrow) uint8_t[std::max<size_t>(1, scratch_bytes)]);
    if (!scratch) {
      if (error) *error = "bf16 GEMM path onednn: out of memory for the matmul scratchpad";
      return Status::kOutOfMemory;
    }
    dnnl::memory ma(mm->a, eng, const_cast<uint16_t*>(a));
    dnnl::memory mb(mm->b, eng, const_cast<uint16_t*>(b));
    dnnl::memory mc(mm->c, eng, c);
    dnnl::memory ms(mm->scratchpad, eng, scratch.get());
    dnnl::stream stream(eng);
    mm->prim.execute(stream, {{DNNL_ARG_SRC, ma},
                              {DNNL_ARG_WEIGHTS, mb},
                              {DNNL_ARG_DST, mc},
                              {DNNL_ARG_SCRATCHPAD, ms}});
    stream.wait();
  } catch (const dnnl::error& e) {
    return dnnl_failure(e, "matmul execution", error);
  }
  return Status::kOk;
}

Status onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                   void* c, DType c_dtype, int64_t ldc, int threads, std::string* error) {
  MatmulKey key;
  key.n = n;
  key.k = k;
  key.lda = lda;
  key.ldb = ldb;
  key.ta = ta;
  key.tb = tb;
  key.alpha = std::bit_cast<uint32_t>(alpha);
  key.beta = beta == 0.f ? 0u : std::bit_cast<uint32_t>(beta);
  key.threads = threads;
  if (c_dtype == DType::kF32) {
    key.m = m;
    key.ldc = ldc;
    return run_matmul(key, a, b, static_cast<float*>(c), error);
  }
  // bf16 C: fp32 row panels, rounded by the one rounding.
  const int64_t panel = std::clamp<int64_t>(kPanelFloats / n, 1, m);
  auto tile = scratch_floats(panel * n);
  if (!tile) {
    if (error) *error = "bf16 GEMM path onednn: out of memory for the fp32 C panel";
    return Status::kOutOfMemory;
  }
  key.ldc = n;
  for (int64_t i0 = 0; i0 < m; i0 += panel) {
    key.m = std::min(panel, m - i0);
    uint16_t* c16 = static_cast<uint16_t*>(c) + i0 * ldc;
    if (beta != 0.f) widen(key.m, n, c16, ldc, tile.get(), threads);
    // Rows i0.. of op(A): rows of A, or columns of A [k, m] with ta.
    const uint16_t* a_panel = ta ? a + i0 : a + i0 * lda;
    if (Status s = run_matmul(key, a_panel, b, tile.get(), error); s != Status::kOk) return s;
    narrow(key.m, n, tile.get(), c16, ldc, threads);
  }
  return Status::kOk;
}
#endif

}  // namespace

constexpr NamedChoice<Bf16GemmPath> kPathNames[] = {
    {Bf16GemmPath::kConvert, "convert", true},
    {Bf16GemmPath::kOneDnn, "onednn", RING_HAVE_ONEDNN != 0},
};

const char* bf16_gemm_path_name(Bf16GemmPath p) { return choice_name(kPathNames, p); }

bool bf16_gemm_path_built(Bf16GemmPath p) { return choice_built(kPathNames, p); }

Bf16GemmFacts bf16_gemm_facts() {
  Bf16GemmFacts f;
  f.onednn_built = bf16_gemm_path_built(Bf16GemmPath::kOneDnn);
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return f;
  const unsigned max_subleaf = eax;
  // AMX-BF16 (EDX[22]) needs AMX-TILE (EDX[24]) and the OS's tile state (XCR0[17:18]).
  f.amx_bf16 = (edx & (1u << 22)) != 0 && (edx & (1u << 24)) != 0 && os_saves(0x60000);
  if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    f.avx512_bf16 = (eax & (1u << 5)) != 0 && isa_supported(Isa::kAvx512);
  }
  return f;
}

Bf16GemmChoice resolve_bf16_gemm_path(const std::string& env_value, const Bf16GemmFacts& facts) {
  Bf16GemmChoice choice;
  for (Bf16GemmPath p : kBf16GemmPaths) {
    if (env_value != bf16_gemm_path_name(p)) continue;
    if (p == Bf16GemmPath::kOneDnn && !facts.onednn_built) {
      choice.reason =
          "RING_BF16_GEMM=onednn: this build has no oneDNN (libdnnl-dev); using convert";
      choice.warning = true;
      return choice;
    }
    choice.value = p;
    choice.reason = "RING_BF16_GEMM=" + env_value;
    return choice;
  }
  std::string prefix;
  if (!env_value.empty() && env_value != "auto") {
    prefix = "RING_BF16_GEMM=" + env_value + ": unknown (expected onednn, convert or auto); ";
    choice.warning = true;
  }
  const bool hw = facts.avx512_bf16 || facts.amx_bf16;
  std::string cpu = hw ? std::string("CPU has") + (facts.avx512_bf16 ? " AVX512_BF16" : "") +
                             (facts.amx_bf16 ? " AMX-BF16" : "")
                       : "CPU has neither AVX512_BF16 nor AMX-BF16";
  if (!hw) {
    choice.reason = prefix + "auto: " + cpu + ": bf16 -> fp32 tiles, fp32 GEMM";
  } else if (!facts.onednn_built) {
    choice.reason = prefix + "auto: " + cpu + ", but this build has no oneDNN (libdnnl-dev)";
  } else {
    choice.value = Bf16GemmPath::kOneDnn;
    choice.reason = prefix + "auto: " + cpu + ": oneDNN bf16 matmul";
  }
  return choice;
}

Bf16GemmPath active_bf16_gemm_path() {
  return static_cast<Bf16GemmPath>(g_path.get(choose_path));
}

Status set_bf16_gemm_path(Bf16GemmPath p) {
  const int v = static_cast<int>(p);
  if (v < 0 || v > 1) return Status::kInvalidArgument;
  if (!bf16_gemm_path_built(p)) return Status::kUnsupported;
  g_path.set(v, choose_path);
  return Status::kOk;
}

Status bf16_gemm(Bf16GemmPath p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                 float beta, void* c, DType c_dtype, int64_t ldc, int threads,
                 std::string* error) {
  if (c_dtype != DType::kF32 && c_dtype != DType::kBF16) return Status::kInvalidArgument;
  switch (p) {
    case Bf16GemmPath::kConvert:
      return convert_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, c_dtype, ldc,
                          threads, error);
    case Bf16GemmPath::kOneDnn: {
#if RING_HAVE_ONEDNN
      // Debian's oneDNN runs on OpenMP and sizes its work (at primitive creation too) from
      // omp_get_max_threads() of the calling thread: set it for this call only.
      const int saved = omp_get_max_threads();
      if (saved != threads) omp_set_num_threads(threads);
      Status s = onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, c_dtype,
                             ldc, threads, error);
      if (saved != threads) omp_set_num_threads(saved);
      return s;
#else
      if (error) *error = "bf16 GEMM path onednn: this build has no oneDNN (libdnnl-dev)";
      return Status::kUnsupported;
#endif
    }
  }
  return Status::kInvalidArgument;
}

}  // namespace ring::kernels::cpu
