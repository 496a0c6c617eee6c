// A backend's paged decode attention (kernels/backend.h paged_decode_attention) against the CPU
// decode attention's page kernel (worker/generate/decode_attention.h page_partial) on random
// pages in the backend's memory: GQA (several query heads per K/V head), several pages per head,
// a partially filled last page, keys of two documents (the query may see only its own) and one
// row whose document has no key at all (an empty partial: out 0, lse -inf). Also the merge of
// every page's partial (merge_partial, in page order) per query head. With a bf16 pool
// (PagedCase::dtype) the backend reads the bf16 bits and the page kernel the same values widened
// to fp32, so the tolerance is the fp32 one: bf16 only changes which numbers are in the pool.
//
// Tolerance (the caller's): per row, |out - want| <= out_tol x max_d |want_d| and
// |lse - want| <= lse_tol x max(1, |want|).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/numeric/bf16.h"
#include "kernels/backend.h"
#include "worker/generate/decode_attention.h"

namespace ring::gen::testing {

struct PagedCase {
  int64_t head_dim = 64;
  int64_t kv_heads = 2;
  int64_t group = 4;        // query heads per K/V head
  int64_t pages = 3;        // pages per K/V head
  int64_t page_tokens = 64;
  int64_t last_fill = 37;   // rows of each head's last page
  uint64_t seed = 1;
  kernels::DType dtype = kernels::DType::kF32;  // the pool's storage
};

inline void check_paged_decode(kernels::Backend* be, const PagedCase& c, double out_tol,
                               double lse_tol) {
  const int64_t hd = c.head_dim, pt = c.page_tokens, slots = c.kv_heads * c.pages;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> pool(static_cast<size_t>(slots * 2 * pt * hd));
  for (float& x : pool) x = 1.5f * nd(rng);
  // bf16: the pool as stored (bits for the backend) and as read (widened, for the page kernel).
  std::vector<uint16_t> pool_bits;
  if (c.dtype == kernels::DType::kBF16) {
    for (float& x : pool) {
      pool_bits.push_back(numeric::f32_to_bf16(x));
      x = numeric::bf16_to_f32(pool_bits.back());
    }
  }
  std::vector<int32_t> docs(static_cast<size_t>(slots * pt));
  for (int32_t& d : docs) d = (rng() % 4 == 0) ? 0 : 1;  // the query's document is 1
  const int64_t heads = c.kv_heads * c.group;
  std::vector<float> q(static_cast<size_t>(heads * hd));
  for (float& x : q) x = 1.5f * nd(rng);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));

  // Rows: (kv head h, page p, query head r of the group), then one row of document 7.
  std::vector<float> rq;
  std::vector<int32_t> rdoc, rslot, rtok;
  for (int64_t h = 0; h < c.kv_heads; ++h)
    for (int64_t p = 0; p < c.pages; ++p)
      for (int64_t r = 0; r < c.group; ++r) {
        const float* src = q.data() + (h * c.group + r) * hd;
        rq.insert(rq.end(), src, src + hd);
        rdoc.push_back(1);
        rslot.push_back(static_cast<int32_t>(h * c.pages + p));
        rtok.push_back(static_cast<int32_t>(p + 1 == c.pages ? c.last_fill : pt));
      }
  rq.insert(rq.end(), q.begin(), q.begin() + hd);
  rdoc.push_back(7);
  rslot.push_back(0);
  rtok.push_back(static_cast<int32_t>(pt));
  const int64_t rows = static_cast<int64_t>(rdoc.size());

  // The backend's memory.
  auto up = [&](const void* src, size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(be->alloc(bytes, &p), kernels::Status::kOk) << be->last_error();
    EXPECT_EQ(be->copy_to_device(p, src, bytes), kernels::Status::kOk) << be->last_error();
    return p;
  };
  void* d_pool = pool_bits.empty() ? up(pool.data(), pool.size() * 4)
                                    : up(pool_bits.data(), pool_bits.size() * 2);
  void* d_docs = up(docs.data(), docs.size() * 4);
  void* d_q = up(rq.data(), rq.size() * 4);
  void* d_doc = up(rdoc.data(), rdoc.size() * 4);
  void* d_slot = up(rslot.data(), rslot.size() * 4);
  void* d_tok = up(rtok.data(), rtok.size() * 4);
  void* d_out = nullptr;
  void* d_lse = nullptr;
  ASSERT_EQ(be->alloc(static_cast<size_t>(rows * hd) * 4, &d_out), kernels::Status::kOk);
  ASSERT_EQ(be->alloc(static_cast<size_t>(rows) * 4, &d_lse), kernels::Status::kOk);
  kernels::PagedDecodeArgs a;
  a.rows = rows;
  a.head_dim = hd;
  a.page_tokens = pt;
  a.scale = scale;
  a.dtype = c.dtype;
  a.pool = d_pool;
  a.pool_docs = static_cast<const int32_t*>(d_docs);
  a.q = static_cast<const float*>(d_q);
  a.q_doc = static_cast<const int32_t*>(d_doc);
  a.slot = static_cast<const int32_t*>(d_slot);
  a.tokens = static_cast<const int32_t*>(d_tok);
  ASSERT_EQ(be->paged_decode_attention(a, static_cast<float*>(d_out), static_cast<float*>(d_lse)),
            kernels::Status::kOk)
      << be->last_error();
  std::vector<float> out(static_cast<size_t>(rows * hd)), lse(static_cast<size_t>(rows));
  ASSERT_EQ(be->copy_to_host(out.data(), d_out, out.size() * 4), kernels::Status::kOk);
  ASSERT_EQ(be->copy_to_host(lse.data(), d_lse, lse.size() * 4), kernels::Status::kOk);
  for (void* p : {d_pool, d_docs, d_q, d_doc, d_slot, d_tok, d_out, d_lse}) be->free(p);

  // The CPU page kernel, page by page, and the merged result per query head.
  std::vector<float> want_o(static_cast<size_t>(c.group * hd)), want_l(static_cast<size_t>(c.group));
  std::vector<float> sc(static_cast<size_t>(c.group * pt)), inv(static_cast<size_t>(c.group));
  std::vector<int32_t> qdoc(static_cast<size_t>(c.group), 1);
  std::vector<float> mo_w(static_cast<size_t>(heads * hd), 0.f), ml_w(static_cast<size_t>(heads), -INFINITY);
  std::vector<float> mo_g(static_cast<size_t>(heads * hd), 0.f), ml_g(static_cast<size_t>(heads), -INFINITY);
  auto close = [&](const float* got, float got_l, const float* want, float want_l2, const char* what,
                   int64_t where) {
    double mx = 0;
    for (int64_t d = 0; d < hd; ++d) mx = std::max(mx, std::fabs(static_cast<double>(want[d])));
    for (int64_t d = 0; d < hd; ++d)
      EXPECT_LE(std::fabs(static_cast<double>(got[d]) - want[d]), out_tol * mx)
          << what << " " << where << " dim " << d;
    EXPECT_LE(std::fabs(static_cast<double>(got_l) - want_l2),
              lse_tol * std::max(1.0, std::fabs(static_cast<double>(want_l2))))
        << what << " " << where << " lse";
  };
  int64_t row = 0;
  for (int64_t h = 0; h < c.kv_heads; ++h)
    for (int64_t p = 0; p < c.pages; ++p) {
      const int64_t s = h * c.pages + p;
      const int64_t n = p + 1 == c.pages ? c.last_fill : pt;
      const float* k = pool.data() + s * 2 * pt * hd;
      page_partial(c.group, hd, scale, q.data() + h * c.group * hd, qdoc.data(), n, k, k + pt * hd,
                   docs.data() + s * pt, want_o.data(), want_l.data(), sc.data(), inv.data());
      for (int64_t r = 0; r < c.group; ++r, ++row) {
        close(out.data() + row * hd, lse[static_cast<size_t>(row)], want_o.data() + r * hd,
              want_l[static_cast<size_t>(r)], "row", row);
        const int64_t qh = h * c.group + r;
        merge_partial(hd, mo_w.data() + qh * hd, ml_w.data() + qh, want_o.data() + r * hd,
                      want_l[static_cast<size_t>(r)]);
        merge_partial(hd, mo_g.data() + qh * hd, ml_g.data() + qh, out.data() + row * hd,
                      lse[static_cast<size_t>(row)]);
      }
    }
  for (int64_t qh = 0; qh < heads; ++qh)
    close(mo_g.data() + qh * hd, ml_g[static_cast<size_t>(qh)], mo_w.data() + qh * hd,
          ml_w[static_cast<size_t>(qh)], "merged head", qh);
  // The row whose document has no key: an empty partial.
  EXPECT_EQ(lse[static_cast<size_t>(row)], -INFINITY);
  for (int64_t d = 0; d < hd; ++d) EXPECT_EQ(out[static_cast<size_t>(row * hd + d)], 0.f);
}

}  // namespace ring::gen::testing
