// CPU attention: tiled forward with an online softmax, exact merge, FlashAttention-2 backward.
//
// Layout of the work
//   - Query tiles of bq tokens x key tiles of kBk tokens. For GQA the `group` query heads that
//     share a kv head are processed together against one packed K/V tile: a tile holds
//     rows = group * bq query rows (token-major), so each K/V tile load serves the whole group.
//   - Per (query tile, key tile) the min/max of positions and document ids classify the pair:
//     skip (no allowed pair possible), full (every pair allowed: no mask work) or partial (build
//     an additive 0/-inf bias [bq, kBk] once for the group; if it allows nothing, skip too).
//     Blocks may be zigzag (two non-adjacent runs), so only min/max are used, never contiguity.
//   - Extra memory per thread is O(tile): packed Q/dO [rows, hdp], K/V tiles [kBk, hdp], scores
//     [rows, kBk]; never [q_len, kv_len].
//   - Forward: OpenMP over (kv head, query tile) items, heaviest query tiles first. Backward:
//     over (kv head, interleaved chunk of kv tiles) items; an item owns its dk/dv rows, and dq of
//     its query heads (when one chunk per head) or a private dq buffer reduced afterwards in a
//     fixed order, so results do not depend on scheduling.
//   - Tile kernels are compiled per ISA from attention_kernels.inc and picked per call from
//     cpu::active_isa() (cpuid, RING_CPU_ISA, cpu::set_isa: kernels/cpu/ops.h).
//   - bf16 q/k/v/dout (DType::kBF16) are widened to fp32 as tiles are packed; the rest is the
//     fp32 code, so a bf16 call equals, bit for bit, an fp32 call on the widened inputs.
#include "kernels/cpu/attention.h"

// GCC 12 warns inside its own AVX-512 intrinsics (_mm512_undefined_* pass-through operands, GCC
// bug 105593); the pragma must precede <immintrin.h> because the warning points into it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <type_traits>
#include <vector>

#include "common/numeric/bf16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

namespace ring::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr int64_t kBk = 64;       // keys per tile: a multiple of every vector width (16, 8, 1)
constexpr int64_t kPad = 16;      // head_dim is padded to a multiple of this in packed tiles
constexpr int64_t kMaxPanel = 4;  // most kv tiles per backward panel
constexpr int64_t kMaxElems = int64_t{1} << 40;  // sanity bound on tensor sizes (no overflow)

struct TileInfo {
  int64_t begin = 0, len = 0;        // tokens [begin, begin + len) of the block
  int64_t pos_min = 0, pos_max = 0;  // over the tile (valid when positions are used)
  int32_t doc_min = 0, doc_max = 0;  // over the tile (valid when document ids are given)
};

enum class TileKind { kSkip, kFull, kPartial };

struct Plan {
  const AttentionArgs* args = nullptr;
  int64_t group = 1;     // query heads per kv head
  int64_t bq = 64;       // query tokens per tile; a tile has group * bq rows
  int64_t hdp = 16;      // head_dim rounded up to kPad
  int64_t kv_panel = 1;  // backward: kv tiles processed together against one query tile
  bool docs = false;
  std::vector<TileInfo> q_tiles, k_tiles;
};

struct LocalStats {
  int64_t total = 0, skipped = 0, masked = 0;
  double flops = 0;
  void add(const LocalStats& o) {
    total += o.total;
    skipped += o.skipped;
    masked += o.masked;
    flops += o.flops;
  }
};

// Per-thread scratch, 64-byte aligned and zeroed once so padded lanes are always finite.
struct Workspace {
  float* qp = nullptr;      // [rows, hdp] packed queries
  float* dop = nullptr;     // [rows, hdp] packed dout
  float* kp = nullptr;      // [kv_panel, kBk, hdp] K tiles
  float* kt = nullptr;      // [kv_panel, hdp, kBk] K tiles transposed
  float* vp = nullptr;      // [kBk, hdp] V tile
  float* vt = nullptr;      // [kv_panel, hdp, kBk] V tiles transposed
  float* s = nullptr;       // [rows, kBk] scores / probabilities
  float* dp = nullptr;      // [rows, kBk] dP / dS
  float* o = nullptr;       // [rows, hdp] unnormalised output accumulator
  float* dq_t = nullptr;    // [rows, hdp] dQ of one tile pair
  float* dk_acc = nullptr;  // [kv_panel, kBk, hdp]
  float* dv_acc = nullptr;  // [kv_panel, kBk, hdp]
  float* m = nullptr;       // [rows] running max (base 2)
  float* l = nullptr;       // [rows] running sum
  float* lse2 = nullptr;    // [rows] lse * log2(e)
  float* delta = nullptr;   // [rows]
  float* bias = nullptr;    // [bq, kBk] 0 / -inf mask of a partial tile
  float* block = nullptr;

  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { std::free(block); }

  // Returns false when out of memory.
  bool init(const Plan& p) {
    const int64_t rows = p.group * p.bq;
    const auto round = [](int64_t n) { return (n + 15) / 16 * 16; };  // keep 64-byte alignment
    const int64_t tile = kBk * p.hdp, panel = p.kv_panel * tile;
    const int64_t sizes[] = {
        rows * p.hdp, rows * p.hdp, panel, panel, tile, panel, rows * kBk, rows * kBk, rows * p.hdp,
        rows * p.hdp, panel,        panel, rows,  rows, rows,  rows,       p.bq * kBk};
    int64_t total = 0;
    for (int64_t s : sizes) total += round(s);
    block = static_cast<float*>(std::aligned_alloc(64, total * sizeof(float)));
    if (block == nullptr) return false;
    std::memset(block, 0, total * sizeof(float));
    float** fields[] = {&qp,   &dop,    &kp,     &kt, &vp, &vt,   &s,     &dp,  &o,
                        &dq_t, &dk_acc, &dv_acc, &m,  &l,  &lse2, &delta, &bias};
    float* at = block;
    for (size_t i = 0; i < std::size(fields); ++i) {
      *fields[i] = at;
      at += round(sizes[i]);
    }
    return true;
  }
};

struct BackwardIo {
  const void* dout = nullptr;    // [q_len, heads, head_dim], stored as the args' dtype
  const float* lse = nullptr;    // [q_len, heads]
  const float* delta = nullptr;  // [q_len, heads]
  float* dq_base = nullptr;      // dq of the item's first query head, token stride dq_tstride
  int64_t dq_tstride = 0;
  float* dk = nullptr;  // [kv_len, kv_heads, head_dim]
  float* dv = nullptr;
};

TileInfo make_tile(const AttentionArgs& a, bool query, bool docs, int64_t begin, int64_t len) {
  TileInfo t;
  t.begin = begin;
  t.len = len;
  const int64_t* pos = query ? a.q_pos : a.k_pos;
  const int32_t* doc = query ? a.q_doc : a.k_doc;
  if (a.causal) {
    t.pos_min = std::numeric_limits<int64_t>::max();
    t.pos_max = std::numeric_limits<int64_t>::min();
    for (int64_t i = begin; i < begin + len; ++i) {
      t.pos_min = std::min(t.pos_min, pos[i]);
      t.pos_max = std::max(t.pos_max, pos[i]);
    }
  }
  if (docs) {
    t.doc_min = std::numeric_limits<int32_t>::max();
    t.doc_max = std::numeric_limits<int32_t>::min();
    for (int64_t i = begin; i < begin + len; ++i) {
      t.doc_min = std::min(t.doc_min, doc[i]);
      t.doc_max = std::max(t.doc_max, doc[i]);
    }
  }
  return t;
}

Plan make_plan(const AttentionArgs& a) {
  Plan p;
  p.args = &a;
  p.group = a.heads / a.kv_heads;
  p.hdp = (a.head_dim + kPad - 1) / kPad * kPad;
  // Query rows per tile (group * bq): as many as keep packed Q, the output accumulator and the
  // scores in L2 (~64K floats of Q + O at head_dim 64), so each packed K/V tile serves many
  // rows; 16..128 tokens.
  const int64_t rows = 32768 / std::max<int64_t>(p.hdp, 64);
  p.bq = std::clamp<int64_t>(rows / p.group, 16, 128);
  // Backward: K/V tiles handled together per gathered query tile (fewer Q/dO gathers and dq
  // scatters per FLOP), bounded so their packed copies and dK/dV accumulators stay in L2.
  p.kv_panel = std::clamp<int64_t>(256 / p.hdp, 1, kMaxPanel);
  p.docs = a.q_doc != nullptr;
  for (int64_t b = 0; b < a.q_len; b += p.bq) {
    p.q_tiles.push_back(make_tile(a, true, p.docs, b, std::min(p.bq, a.q_len - b)));
  }
  for (int64_t b = 0; b < a.kv_len; b += kBk) {
    p.k_tiles.push_back(make_tile(a, false, p.docs, b, std::min(kBk, a.kv_len - b)));
  }
  return p;
}

TileKind classify(const Plan& p, const TileInfo& q, const TileInfo& k) {
  bool full = true;
  if (p.args->causal) {
    if (k.pos_min > q.pos_max) return TileKind::kSkip;  // every key is after every query
    full = k.pos_max <= q.pos_min;
  }
  if (p.docs) {
    if (k.doc_max < q.doc_min || k.doc_min > q.doc_max) return TileKind::kSkip;
    full = full && q.doc_min == q.doc_max && k.doc_min == k.doc_max && q.doc_min == k.doc_min;
  }
  return full ? TileKind::kFull : TileKind::kPartial;
}

// bias [q.len, kBk]: 0 where query i may attend key j, -inf otherwise (and for j >= k.len, the
// padding of a short last tile). full: only the padding is masked. Returns the allowed count.
int64_t build_bias(const Plan& p, const TileInfo& q, const TileInfo& k, bool full, float* bias) {
  const AttentionArgs& a = *p.args;
  int64_t allowed = 0;
  for (int64_t i = 0; i < q.len; ++i) {
    float* row = bias + i * kBk;
    const int64_t qi = q.begin + i;
    for (int64_t j = 0; j < kBk; ++j) {
      bool ok = j < k.len;
      if (ok && !full) {
        const int64_t kj = k.begin + j;
        if (a.causal && a.k_pos[kj] > a.q_pos[qi]) ok = false;
        if (p.docs && a.k_doc[kj] != a.q_doc[qi]) ok = false;
      }
      row[j] = ok ? 0.f : -kInf;
      allowed += ok;
    }
  }
  return allowed;
}

}  // namespace

// ---- per-ISA tile kernels -----------------------------------------------------------------
namespace isa_scalar {
namespace {
// Portable fallback: one float per "vector"; runs on any x86-64 (and any other) CPU.
struct V {
  static constexpr int kW = 1;
  using R = float;
  static R zero() { return 0.f; }
  static R set1(float x) { return x; }
  static R load(const float* p) { return *p; }
  static void store(float* p, R x) { *p = x; }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R max(R a, R b) { return a > b ? a : b; }
  static R fmadd(R a, R b, R c) { return a * b + c; }
  static float hsum(R x) { return x; }
  static float hmax(R x) { return x; }
  static R exp2(R x) { return x < -126.f ? 0.f : std::exp2(std::min(x, 127.f)); }
  static R load_bf16(const uint16_t* p) { return ::ring::numeric::bf16_to_f32(*p); }
};
constexpr int kR = 4;
constexpr int kCV = 4;
#include "kernels/cpu/attention_kernels.inc"
}  // namespace
}  // namespace isa_scalar

#if defined(__x86_64__) && defined(__GNUC__)
#define RING_ATTN_X86 1
// Cephes exp2f minimax polynomial on [-0.5, 0.5]: 2^f = 1 + f * P(f), relative error < 2e-7.
#define RING_EXP2_C5 1.535336188319500e-4f
#define RING_EXP2_C4 1.339887440266574e-3f
#define RING_EXP2_C3 9.618437357674640e-3f
#define RING_EXP2_C2 5.550332471162809e-2f
#define RING_EXP2_C1 2.402264791363012e-1f
#define RING_EXP2_C0 6.931472028550421e-1f

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace isa_avx2 {
namespace {
struct V {
  static constexpr int kW = 8;
  using R = __m256;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R load_bf16(const uint16_t* p) { return simd::avx2::load_bf16(p); }
  static float hsum(R x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(R x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // 2^x; exactly 0 for x < -126 (and -inf), which is how masked scores vanish.
  static R exp2(R x) {
    const R keep = _mm256_cmp_ps(x, _mm256_set1_ps(-126.f), _CMP_GE_OQ);
    const R xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.f)), _mm256_set1_ps(127.f));
    const R fi = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const R f = _mm256_sub_ps(xc, fi);
    R poly = _mm256_set1_ps(RING_EXP2_C5);
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(RING_EXP2_C4));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(RING_EXP2_C3));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(RING_EXP2_C2));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(RING_EXP2_C1));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(RING_EXP2_C0));
    poly = _mm256_fmadd_ps(poly, f, _mm256_set1_ps(1.f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fi), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(poly, _mm256_castsi256_ps(e)), keep);
  }
};
constexpr int kR = 6;  // 6 x 2 ymm accumulators + 2 B vectors + 1 broadcast <= 16 registers
constexpr int kCV = 2;
#include "kernels/cpu/attention_kernels.inc"
}  // namespace
}  // namespace isa_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,fma")
namespace isa_avx512 {
namespace {
struct V {
  static constexpr int kW = 16;
  using R = __m512;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R load_bf16(const uint16_t* p) { return simd::avx512::load_bf16(p); }
  static float hsum(R x) { return _mm512_reduce_add_ps(x); }
  static float hmax(R x) { return _mm512_reduce_max_ps(x); }
  static R exp2(R x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.f), _CMP_GE_OQ);
    const R xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-126.f)), _mm512_set1_ps(127.f));
    const R fi = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const R f = _mm512_sub_ps(xc, fi);
    R poly = _mm512_set1_ps(RING_EXP2_C5);
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(RING_EXP2_C4));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(RING_EXP2_C3));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(RING_EXP2_C2));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(RING_EXP2_C1));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(RING_EXP2_C0));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.f));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fi), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, poly, _mm512_castsi512_ps(e));
  }
};
constexpr int kR = 6;  // 6 x 4 zmm accumulators + 4 B vectors + 1 broadcast <= 32 registers
constexpr int kCV = 4;
#include "kernels/cpu/attention_kernels.inc"
}  // namespace
}  // namespace isa_avx512
#pragma GCC pop_options
#endif  // x86-64

namespace {

using ForwardItem = void (*)(const Plan&, int64_t, int64_t, Workspace&, float*, float*,
                            LocalStats&);
using BackwardItem = void (*)(const Plan&, const BackwardIo&, int64_t, int64_t, int64_t,
                              Workspace&, LocalStats&);

// One ISA's tile kernels per storage type, indexed by DType (kF32 = 0, kBF16 = 1).
struct IsaKernels {
  ForwardItem forward_item[2];
  BackwardItem backward_item[2];
};

// The kernels of the ISA the CPU ops use now (cpu::active_isa(): the best the CPU and OS
// support, lowered by RING_CPU_ISA at first use or by cpu::set_isa).
const IsaKernels& isa_kernels() {
  static const IsaKernels scalar{
      {isa_scalar::forward_item<float>, isa_scalar::forward_item<uint16_t>},
      {isa_scalar::backward_item<float>, isa_scalar::backward_item<uint16_t>}};
#ifdef RING_ATTN_X86
  static const IsaKernels avx2{
      {isa_avx2::forward_item<float>, isa_avx2::forward_item<uint16_t>},
      {isa_avx2::backward_item<float>, isa_avx2::backward_item<uint16_t>}};
  static const IsaKernels avx512{
      {isa_avx512::forward_item<float>, isa_avx512::forward_item<uint16_t>},
      {isa_avx512::backward_item<float>, isa_avx512::backward_item<uint16_t>}};
  switch (active_isa()) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    case Isa::kScalar:
      break;
  }
#endif
  return scalar;
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : omp_get_max_threads();
}

bool size_ok(int64_t a, int64_t b, int64_t c) {
  return a >= 0 && b >= 0 && c >= 0 &&
         (a == 0 || b == 0 || c == 0 || (a <= kMaxElems / b && a * b <= kMaxElems / c));
}

// Shared checks of forward and backward: sizes, pointers, dtype.
Status check_args(const AttentionArgs& a) {
  if (a.q_len < 0 || a.kv_len < 0 || a.heads <= 0 || a.kv_heads <= 0 || a.head_dim <= 0) {
    return Status::kInvalidArgument;
  }
  if (a.heads % a.kv_heads != 0) return Status::kInvalidArgument;
  if (!size_ok(a.q_len, a.heads, a.head_dim) || !size_ok(a.kv_len, a.kv_heads, a.head_dim)) {
    return Status::kInvalidArgument;
  }
  if (!std::isfinite(a.scale)) return Status::kInvalidArgument;
  if ((a.q_doc == nullptr) != (a.k_doc == nullptr)) return Status::kInvalidArgument;
  if (a.q_len > 0 && (a.q == nullptr || (a.causal && a.q_pos == nullptr))) {
    return Status::kInvalidArgument;
  }
  if (a.kv_len > 0 && (a.k == nullptr || a.v == nullptr || (a.causal && a.k_pos == nullptr))) {
    return Status::kInvalidArgument;
  }
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16) return Status::kInvalidArgument;
  return Status::kOk;
}

void add_stats(AttentionStats* stats, const LocalStats& s) {
  if (stats == nullptr) return;
  stats->tiles_total += s.total;
  stats->tiles_skipped += s.skipped;
  stats->tiles_masked += s.masked;
  stats->flops += s.flops;
}

bool init_workspaces(const Plan& p, std::vector<Workspace>& ws) {
  for (Workspace& w : ws) {
    if (!w.init(p)) return false;
  }
  return true;
}

}  // namespace

Status attention_forward(const AttentionArgs& a, float* out, float* lse, AttentionStats* stats,
                         int threads) {
  if (Status s = check_args(a); s != Status::kOk) return s;
  if (a.q_len > 0 && (out == nullptr || lse == nullptr)) return Status::kInvalidArgument;
  if (a.q_len == 0) return Status::kOk;

  const Plan p = make_plan(a);
  const ForwardItem forward = isa_kernels().forward_item[static_cast<int>(a.dtype)];
  const int64_t n_qt = static_cast<int64_t>(p.q_tiles.size());

  // Heaviest query tiles first (causal and document masks make the work uneven), so the
  // dynamic schedule ends balanced. Work estimate: kv tiles not skipped by min/max.
  std::vector<int64_t> work(n_qt, 0), order(n_qt);
  for (int64_t i = 0; i < n_qt; ++i) {
    for (const TileInfo& kt : p.k_tiles)
      work[i] += classify(p, p.q_tiles[i], kt) != TileKind::kSkip;
  }
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return work[x] > work[y]; });

  const int64_t n_items = n_qt * a.kv_heads;
  const int nt = static_cast<int>(std::min<int64_t>(resolve_threads(threads), n_items));
  std::vector<Workspace> ws(nt);
  if (!init_workspaces(p, ws)) return Status::kOutOfMemory;

  LocalStats total;
#pragma omp parallel num_threads(nt)
  {
    LocalStats st;
    Workspace& w = ws[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t it = 0; it < n_items; ++it) {
      forward(p, it % a.kv_heads, order[it / a.kv_heads], w, out, lse, st);
    }
#pragma omp critical(ring_attention_stats)
    total.add(st);
  }
  add_stats(stats, total);
  return Status::kOk;
}

Status attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a, float* lse_a,
                       const float* out_b, const float* lse_b, int threads) {
  if (tokens < 0 || heads <= 0 || head_dim <= 0 || !size_ok(tokens, heads, head_dim)) {
    return Status::kInvalidArgument;
  }
  if (tokens == 0) return Status::kOk;
  if (out_a == nullptr || lse_a == nullptr || out_b == nullptr || lse_b == nullptr) {
    return Status::kInvalidArgument;
  }
  const int64_t rows = tokens * heads;
#pragma omp parallel for num_threads(resolve_threads(threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float la = lse_a[r], lb = lse_b[r];
    float* oa = out_a + r * head_dim;
    const float* ob = out_b + r * head_dim;
    if (lb == -kInf) continue;  // empty b: a unchanged (also when both are empty)
    if (la == -kInf) {          // empty a: take b
      std::memcpy(oa, ob, head_dim * sizeof(float));
      lse_a[r] = lb;
      continue;
    }
    // lse = max + log(1 + exp(min - max)); weights exp(l_x - lse) in double, rounded once.
    const double m = std::max(la, lb), d = -std::fabs(static_cast<double>(la) - lb);
    const double l = m + std::log1p(std::exp(d));
    const float wa = static_cast<float>(std::exp(la - l));
    const float wb = static_cast<float>(std::exp(lb - l));
    for (int64_t x = 0; x < head_dim; ++x) oa[x] = wa * oa[x] + wb * ob[x];
    lse_a[r] = static_cast<float>(l);
  }
  return Status::kOk;
}

namespace {

float widen(float x) { return x; }
float widen(uint16_t x) { return numeric::bf16_to_f32(x); }

// delta[r] = sum_x dout[r, x] * out[r, x] in double; T: dout's storage (bf16 widened exactly).
template <typename T>
void delta_rows(int64_t rows, int64_t head_dim, const float* out, const T* g, float* delta,
                int threads) {
#pragma omp parallel for num_threads(resolve_threads(threads)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t x = 0; x < head_dim; ++x) {
      acc += static_cast<double>(widen(g[r * head_dim + x])) * out[r * head_dim + x];
    }
    delta[r] = static_cast<float>(acc);
  }
}

}  // namespace

Status attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
                                  const float* out, const void* dout, float* delta, int threads) {
  if (tokens < 0 || heads <= 0 || head_dim <= 0 || !size_ok(tokens, heads, head_dim)) {
    return Status::kInvalidArgument;
  }
  if (tokens > 0 && (out == nullptr || dout == nullptr || delta == nullptr)) {
    return Status::kInvalidArgument;
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) return Status::kInvalidArgument;
  if (dtype == DType::kBF16) {
    delta_rows(tokens * heads, head_dim, out, static_cast<const uint16_t*>(dout), delta, threads);
  } else {
    delta_rows(tokens * heads, head_dim, out, static_cast<const float*>(dout), delta, threads);
  }
  return Status::kOk;
}

Status attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                          const float* delta, float* dq, float* dk, float* dv,
                          AttentionStats* stats, int threads) {
  if (Status s = check_args(a); s != Status::kOk) return s;
  if (a.q_len > 0 && (dout == nullptr || lse == nullptr || delta == nullptr || dq == nullptr)) {
    return Status::kInvalidArgument;
  }
  if (a.kv_len > 0 && (dk == nullptr || dv == nullptr)) return Status::kInvalidArgument;
  if (a.q_len == 0 || a.kv_len == 0) return Status::kOk;

  const Plan p = make_plan(a);
  const BackwardItem backward = isa_kernels().backward_item[static_cast<int>(a.dtype)];
  const int64_t n_kt = static_cast<int64_t>(p.k_tiles.size());
  const int want = resolve_threads(threads);
  // Items (kv head, chunk): chunks per head so that the item count is a multiple of the thread
  // count (balanced). One chunk per head: the item owns its heads' dq. Several: each item gets
  // a private dq [q_len, group, head_dim] summed afterwards (chunks x dq extra memory).
  const int64_t chunks = std::clamp<int64_t>(want / std::gcd<int64_t>(a.kv_heads, want), 1, n_kt);
  const int64_t n_items = a.kv_heads * chunks;
  const int nt = static_cast<int>(std::min<int64_t>(want, n_items));
  const int64_t item_dq = a.q_len * p.group * a.head_dim;
  std::vector<float> dq_buf;
  std::vector<Workspace> ws(nt);
  try {
    if (chunks > 1) dq_buf.assign(static_cast<size_t>(n_items * item_dq), 0.f);
  } catch (const std::bad_alloc&) {
    return Status::kOutOfMemory;
  }
  if (!init_workspaces(p, ws)) return Status::kOutOfMemory;

  BackwardIo base;
  base.dout = dout;
  base.lse = lse;
  base.delta = delta;
  base.dk = dk;
  base.dv = dv;

  LocalStats total;
#pragma omp parallel num_threads(nt)
  {
    LocalStats st;
    Workspace& w = ws[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t kh = it / chunks, chunk = it % chunks;
      BackwardIo io = base;
      if (chunks == 1) {
        io.dq_base = dq + kh * p.group * a.head_dim;
        io.dq_tstride = a.heads * a.head_dim;
      } else {
        io.dq_base = dq_buf.data() + it * item_dq;
        io.dq_tstride = p.group * a.head_dim;
      }
      backward(p, io, kh, chunk, chunks, w, st);
    }
    if (chunks > 1) {
      // dq[i, kh*group:(kh+1)*group, :] += sum over chunks, in chunk order (deterministic).
      const int64_t span = p.group * a.head_dim;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < a.q_len; ++i) {
        for (int64_t kh = 0; kh < a.kv_heads; ++kh) {
          float* d = dq + (i * a.heads + kh * p.group) * a.head_dim;
          for (int64_t c = 0; c < chunks; ++c) {
            const float* s = dq_buf.data() + (kh * chunks + c) * item_dq + i * span;
            for (int64_t x = 0; x < span; ++x) d[x] += s[x];
          }
        }
      }
    }
#pragma omp critical(ring_attention_stats)
    total.add(st);
  }
  add_stats(stats, total);
  return Status::kOk;
}

namespace {

// The rows of paged_decode_attention; T: the pool's storage (bf16 widened exactly at each read,
// then the fp32 arithmetic of the fp32 pool).
template <typename T>
void decode_rows(const PagedDecodeArgs& a, float* out, float* lse, int threads) {
  const int64_t hd = a.head_dim, pt = a.page_tokens;
  const auto* pool = static_cast<const T*>(a.pool);
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* k = pool + static_cast<int64_t>(a.slot[r]) * 2 * pt * hd;
    const T* v = k + pt * hd;
    const int32_t* docs = a.pool_docs + static_cast<int64_t>(a.slot[r]) * pt;
    const float* q = a.q + r * hd;
    float* o = out + r * hd;
    const int64_t n = a.tokens[r];
    float m = -std::numeric_limits<float>::infinity();
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      if (docs[j] != a.q_doc[r]) continue;
      float dot = 0.f;
      for (int64_t d = 0; d < hd; ++d) dot += q[d] * widen(k[j * hd + d]);
      s[static_cast<size_t>(j)] = dot * a.scale;
      m = std::max(m, s[static_cast<size_t>(j)]);
    }
    std::fill(o, o + hd, 0.f);
    if (m == -std::numeric_limits<float>::infinity()) {
      lse[r] = m;
      continue;
    }
    float l = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      if (docs[j] != a.q_doc[r]) continue;
      const float p = std::exp(s[static_cast<size_t>(j)] - m);
      l += p;
      for (int64_t d = 0; d < hd; ++d) o[d] += p * widen(v[j * hd + d]);
    }
    for (int64_t d = 0; d < hd; ++d) o[d] /= l;
    lse[r] = m + std::log(l);
  }
}

}  // namespace

Status paged_decode_attention(const PagedDecodeArgs& a, float* out, float* lse, int threads) {
  if (a.rows < 0 || a.head_dim <= 0 || a.page_tokens <= 0) return Status::kInvalidArgument;
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16) return Status::kInvalidArgument;
  if (a.rows == 0) return Status::kOk;
  if (a.pool == nullptr || a.pool_docs == nullptr || a.q == nullptr || a.q_doc == nullptr ||
      a.slot == nullptr || a.tokens == nullptr || out == nullptr || lse == nullptr)
    return Status::kInvalidArgument;
  for (int64_t r = 0; r < a.rows; ++r)
    if (a.slot[r] < 0 || a.tokens[r] < 0 || a.tokens[r] > a.page_tokens)
      return Status::kInvalidArgument;
  if (a.dtype == DType::kBF16) {
    decode_rows<uint16_t>(a, out, lse, threads);
  } else {
    decode_rows<float>(a, out, lse, threads);
  }
  return Status::kOk;
}

}  // namespace ring::kernels::cpu
