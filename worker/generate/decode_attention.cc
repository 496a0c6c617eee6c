#include "worker/generate/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"

// GCC 12 warns inside its own avx512fintrin.h (bug 105593), as kernels/cpu/ops.cc notes.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace ring::gen {
#define RING_ISA_FILE "worker/generate/page_kernel_isa.inc"
#include "kernels/cpu/isa_each.inc"
}  // namespace ring::gen

namespace ring::gen {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

void merge_partial(int64_t head_dim, float* o_a, float* lse_a, const float* o_b, float lse_b) {
  if (lse_b == kNegInf) return;
  if (*lse_a == kNegInf) {
    std::copy(o_b, o_b + head_dim, o_a);
    *lse_a = lse_b;
    return;
  }
  const float m = std::max(*lse_a, lse_b);
  const float lse = m + std::log(std::exp(*lse_a - m) + std::exp(lse_b - m));
  const float wa = std::exp(*lse_a - lse), wb = std::exp(lse_b - lse);
  for (int64_t d = 0; d < head_dim; ++d) o_a[d] = wa * o_a[d] + wb * o_b[d];
  *lse_a = lse;
}

namespace {

template <typename T>
void page_partial_isa(int64_t m, int64_t hd, float scale, const float* q, const int32_t* q_doc,
                      int64_t tokens, const T* k, const T* v, const int32_t* docs, float* out,
                      float* lse, float* scores, float* inv) {
  switch (kernels::cpu::active_isa()) {
    case kernels::cpu::Isa::kAvx512:
      avx512::page_partial(m, hd, scale, q, q_doc, tokens, k, v, docs, out, lse, scores, inv);
      return;
    case kernels::cpu::Isa::kAvx2:
      avx2::page_partial(m, hd, scale, q, q_doc, tokens, k, v, docs, out, lse, scores, inv);
      return;
    case kernels::cpu::Isa::kScalar:
      break;
  }
  scalar::page_partial(m, hd, scale, q, q_doc, tokens, k, v, docs, out, lse, scores, inv);
}

}  // namespace

void page_partial(int64_t m, int64_t hd, float scale, const float* q, const int32_t* q_doc,
                  int64_t tokens, const float* k, const float* v, const int32_t* docs, float* out,
                  float* lse, float* scores, float* inv) {
  page_partial_isa(m, hd, scale, q, q_doc, tokens, k, v, docs, out, lse, scores, inv);
}

void page_partial(int64_t m, int64_t hd, float scale, const float* q, const int32_t* q_doc,
                  int64_t tokens, const uint16_t* k, const uint16_t* v, const int32_t* docs,
                  float* out, float* lse, float* scores, float* inv) {
  page_partial_isa(m, hd, scale, q, q_doc, tokens, k, v, docs, out, lse, scores, inv);
}

DecodeAttention::DecodeAttention(KvCache* cache, ThreadPool* pool, int64_t heads,
                                 int64_t kv_heads, int64_t head_dim)
    : cache_(cache),
      pool_(pool),
      heads_(heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      group_(heads / kv_heads),
      scale_(1.f / std::sqrt(static_cast<float>(head_dim))) {
  if (cache_->fast_on_device() &&
      !cache_->device()->supports(kernels::Op::kPagedDecode, cache_->dtype()))
    throw GenerateError(fmt::format(
        "the {} backend has no paged decode attention over {} pages (kernels/backend.h): it "
        "cannot hold the fast tier",
        cache_->device()->name(), cache_->dtype() == kernels::DType::kBF16 ? "bf16" : "fp32"));
}

DecodeAttention::~DecodeAttention() {
  if (kernels::Backend* dev = cache_->fast_on_device() ? cache_->device() : nullptr) {
    dev->synchronize();
    dev->free(dev_q_);
    dev->free(dev_meta_);
    dev->free(dev_out_);
    dev->free(dev_lse_);
  }
}

namespace {

void device_check(kernels::Backend* dev, kernels::Status st, const char* what) {
  if (st == kernels::Status::kOk) return;
  const std::string why = dev->last_error();
  throw GenerateError(fmt::format("decode attention on the {} backend: {} failed: {}{}",
                                  dev->name(), what, kernels::status_string(st),
                                  why.empty() ? "" : " (" + why + ")"));
}

}  // namespace

void DecodeAttention::reserve_device(int64_t rows) {
  if (rows <= dev_rows_) return;
  kernels::Backend* dev = cache_->device();
  const int64_t n = std::max(rows, 2 * dev_rows_);
  device_check(dev, dev->synchronize(), "synchronize");  // the old buffers may still be read
  dev->free(dev_q_);
  dev->free(dev_meta_);
  dev->free(dev_out_);
  dev->free(dev_lse_);
  dev_q_ = dev_out_ = dev_lse_ = nullptr;
  dev_meta_ = nullptr;
  dev_rows_ = 0;
  void* p = nullptr;
  device_check(dev, dev->alloc(static_cast<size_t>(n * head_dim_) * 4, &p), "alloc");
  dev_q_ = static_cast<float*>(p);
  device_check(dev, dev->alloc(static_cast<size_t>(3 * n) * 4, &p), "alloc");
  dev_meta_ = static_cast<int32_t*>(p);
  device_check(dev, dev->alloc(static_cast<size_t>(n * head_dim_) * 4, &p), "alloc");
  dev_out_ = static_cast<float*>(p);
  device_check(dev, dev->alloc(static_cast<size_t>(n) * 4, &p), "alloc");
  dev_lse_ = static_cast<float*>(p);
  dev_rows_ = n;
}

void DecodeAttention::build_tasks(const std::vector<SeqView>& seqs) {
  const int64_t B = static_cast<int64_t>(seqs.size()), hd = head_dim_;
  // Partials: sequence b, page i, query head h at (base[b] + i * heads + h). The buffers are
  // the object's, kept from call to call (every entry read is written first in each call).
  std::vector<int64_t>& base = base_;
  base.assign(static_cast<size_t>(B) + 1, 0);
  for (int64_t b = 0; b < B; ++b)
    base[b + 1] = base[b] + static_cast<int64_t>((*seqs[b].pages)[0].size()) * heads_;
  std::vector<float>& part_o = part_o_;
  std::vector<float>& part_lse = part_lse_;
  part_o.resize(static_cast<size_t>(base[B] * hd));
  part_lse.resize(static_cast<size_t>(base[B]));

  // One task per distinct page: the (sequence, page index) pairs that hold it, users_[first,
  // first + count) in sequence order. One sequence: a task per page, no lookups.
  std::vector<Task>& tasks = tasks_;
  tasks.clear();
  users_.clear();
  if (B == 1) {
    for (int64_t kh = 0; kh < kv_heads_; ++kh) {
      const auto& list = (*seqs[0].pages)[static_cast<size_t>(kh)];
      for (int64_t i = 0; i < static_cast<int64_t>(list.size()); ++i) {
        tasks.push_back(Task{list[static_cast<size_t>(i)], kh, Users{&users_, users_.size(), 1}});
        users_.emplace_back(0, i);
      }
    }
  } else {
    index_.clear();
    entry_task_.clear();
    std::vector<std::pair<int64_t, int64_t>> entries;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t kh = 0; kh < kv_heads_; ++kh) {
        const auto& list = (*seqs[b].pages)[static_cast<size_t>(kh)];
        for (int64_t i = 0; i < static_cast<int64_t>(list.size()); ++i) {
          auto [it, fresh] = index_.emplace(list[static_cast<size_t>(i)], tasks.size());
          if (fresh) tasks.push_back(Task{list[static_cast<size_t>(i)], kh, Users{&users_, 0, 0}});
          ++tasks[it->second].users.count;
          entry_task_.push_back(it->second);
          entries.emplace_back(b, i);
        }
      }
    }
    size_t first = 0;
    for (Task& t : tasks) {
      t.users.first = first;
      first += t.users.count;
      t.users.count = 0;
    }
    users_.resize(first);
    for (size_t e = 0; e < entries.size(); ++e) {
      Task& t = tasks[entry_task_[e]];
      users_[t.users.first + t.users.count++] = entries[e];
    }
  }
}

std::vector<double> DecodeAttention::lse_lower_bounds(const std::vector<int64_t>& first,
                                                      int64_t B) const {
  const int64_t g = group_;
  const std::vector<int64_t>& base = base_;
  const std::vector<float>& part_lse = part_lse_;
  const std::vector<Task>& tasks = tasks_;
  std::vector<double> low(static_cast<size_t>(B * heads_), -INFINITY);
  for (int64_t t : first)
    for (const auto& [b, i] : tasks[static_cast<size_t>(t)].users)
      for (int64_t r = 0; r < g; ++r) {
        const int64_t h = tasks[static_cast<size_t>(t)].kv_head * g + r;
        const double pl = part_lse[static_cast<size_t>(base[b] + i * heads_ + h)];
        double& l = low[static_cast<size_t>(b * heads_ + h)];
        if (pl == -INFINITY) continue;
        const double m = std::max(l, pl);
        l = m + std::log(std::exp(l - m) + std::exp(pl - m));
      }
  return low;
}

void DecodeAttention::merge_partials(const std::vector<SeqView>& seqs, float* out, float* lse) {
  const int64_t B = static_cast<int64_t>(seqs.size()), hd = head_dim_, g = group_;
  const std::vector<int64_t>& base = base_;
  const std::vector<float>& part_o = part_o_;
  const std::vector<float>& part_lse = part_lse_;
  // Merge in page order, per (sequence, head): cheap next to the pages, so on this thread (one
  // parallel region per layer: on a loaded machine every region's join costs a time slice).
  for (int64_t bh = 0; bh < B * heads_; ++bh) {
    const int64_t b = bh / heads_, h = bh % heads_;
    float* o = out + bh * hd;
    float* l = lse + bh;
    std::fill(o, o + hd, 0.f);
    *l = kNegInf;
    const int64_t pages = (base[b + 1] - base[b]) / heads_;
    for (int64_t i = 0; i < pages; ++i) {
      const int64_t at = base[b] + i * heads_ + h;
      merge_partial(hd, o, l, part_o.data() + at * hd, part_lse[static_cast<size_t>(at)]);
    }
  }
  // Attention mass per page: the share of each head's softmax it holds.
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pages = (base[b + 1] - base[b]) / heads_;
    for (int64_t i = 0; i < pages; ++i) {
      for (int64_t h = 0; h < heads_; ++h) {
        const float pl = part_lse[static_cast<size_t>(base[b] + i * heads_ + h)];
        if (pl == kNegInf) continue;
        const PageId id = (*seqs[b].pages)[static_cast<size_t>(h / g)][static_cast<size_t>(i)];
        cache_->add_mass(id, std::exp(static_cast<double>(pl) - lse[b * heads_ + h]));
      }
    }
  }
}

void DecodeAttention::count_tasks(const std::vector<char>& skipped, int64_t device_rows,
                                  DecodeStats* stats) const {
  const int64_t hd = head_dim_;
  const std::vector<Task>& tasks = tasks_;
  if (stats != nullptr) {
    stats->device_rows += device_rows;
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const Task& t = tasks[ti];
      ++stats->tasks;
      if (skipped[ti]) {
        ++stats->skipped_tasks;
        continue;
      }
      switch (cache_->tier_of(t.page)) {
        case Tier::kFast: ++stats->fast_tasks; break;
        case Tier::kHost: ++stats->host_tasks; break;
        case Tier::kDisk: ++stats->disk_tasks; break;
      }
      if (t.users.size() > 1) ++stats->shared_tasks;
      stats->kv_bytes += cache_->page(t.page).q8 != nullptr && cache_->tier_of(t.page) != Tier::kFast
                             ? 2 * cache_->page(t.page).tokens * hd
                             : 2 * cache_->page(t.page).tokens * hd * cache_->value_bytes();
    }
  }
}

void DecodeAttention::forward(const std::vector<SeqView>& seqs, const float* q, float* out,
                              float* lse, DecodeStats* stats, double skip_threshold,
                              float* skipped_bound) {
  const int64_t B = static_cast<int64_t>(seqs.size()), hd = head_dim_, g = group_;
  build_tasks(seqs);
  const std::vector<int64_t>& base = base_;
  std::vector<float>& part_o = part_o_;
  std::vector<float>& part_lse = part_lse_;
  std::vector<Task>& tasks = tasks_;
  const int64_t pt = cache_->page_tokens();
  auto compute = [&](int64_t t) {
    const Task& task = tasks[static_cast<size_t>(t)];
    const Page& page = cache_->page(task.page);
    const int64_t m = static_cast<int64_t>(task.users.size()) * g;
    thread_local std::vector<float> qm, om, lm, sc, inv;
    thread_local std::vector<int32_t> dm;
    qm.resize(static_cast<size_t>(m * hd));
    om.resize(static_cast<size_t>(m * hd));
    lm.resize(static_cast<size_t>(m));
    inv.resize(static_cast<size_t>(m));
    dm.resize(static_cast<size_t>(m));
    sc.resize(static_cast<size_t>(m * std::max<int64_t>(pt, 1)));
    for (size_t u = 0; u < task.users.size(); ++u) {
      const int64_t b = task.users[u].first;
      const float* src = q + (b * heads_ + task.kv_head * g) * hd;
      std::copy(src, src + g * hd, qm.data() + static_cast<int64_t>(u) * g * hd);
      for (int64_t r = 0; r < g; ++r) dm[u * g + r] = seqs[static_cast<size_t>(b)].doc;
    }
    thread_local std::vector<float> deq;
    if (cache_->needs_dequant(task.page)) {
      // An int8 host page (opt-in): dequantized into this thread's scratch as it is read.
      deq.resize(static_cast<size_t>(2 * pt * hd));
      cache_->dequantize(task.page, deq.data());
      page_partial(m, hd, scale_, qm.data(), dm.data(), page.tokens, deq.data(),
                   deq.data() + pt * hd, page.docs.data(), om.data(), lm.data(), sc.data(),
                   inv.data());
    } else if (cache_->dtype() == kernels::DType::kBF16) {
      page_partial(m, hd, scale_, qm.data(), dm.data(), page.tokens,
                   static_cast<const uint16_t*>(cache_->k_of(task.page)),
                   static_cast<const uint16_t*>(cache_->v_of(task.page)), page.docs.data(),
                   om.data(), lm.data(), sc.data(), inv.data());
    } else {
      page_partial(m, hd, scale_, qm.data(), dm.data(), page.tokens,
                   static_cast<const float*>(cache_->k_of(task.page)),
                   static_cast<const float*>(cache_->v_of(task.page)), page.docs.data(),
                   om.data(), lm.data(), sc.data(), inv.data());
    }
    for (size_t u = 0; u < task.users.size(); ++u) {
      const auto [b, i] = task.users[u];
      for (int64_t r = 0; r < g; ++r) {
        const int64_t h = task.kv_head * g + r;
        const int64_t at = base[b] + i * heads_ + h;
        const int64_t row = static_cast<int64_t>(u) * g + r;
        std::copy(om.data() + row * hd, om.data() + (row + 1) * hd, part_o.data() + at * hd);
        part_lse[static_cast<size_t>(at)] = lm[static_cast<size_t>(row)];
      }
    }
  };
  // Runs tasks `list`: with a device fast tier, the fast pages' rows go to the backend's kernel
  // (asynchronous) while the CPU threads compute the others, then the kernel's partials are
  // copied back (waiting for it) into the partial arrays.
  int64_t device_rows = 0;
  auto run = [&](const std::vector<int64_t>& list) {
    if (!cache_->fast_on_device()) {
      pool_->parallel_for(static_cast<int64_t>(list.size()),
                          [&](int64_t x) { compute(list[static_cast<size_t>(x)]); });
      return;
    }
    kernels::Backend* dev = cache_->device();
    std::vector<int64_t> on_cpu, on_dev;
    for (int64_t t : list)
      (cache_->tier_of(tasks[static_cast<size_t>(t)].page) == Tier::kFast ? on_dev : on_cpu)
          .push_back(t);
    // Rows of the kernel: (task, user, query head of the group); at[r]: its partial's index.
    std::vector<float> hq;
    std::vector<int32_t> meta;
    std::vector<int64_t> at;
    for (int64_t t : on_dev) {
      const Task& task = tasks[static_cast<size_t>(t)];
      const Page& page = cache_->page(task.page);
      for (const auto& [b, i] : task.users)
        for (int64_t r = 0; r < g; ++r) {
          const int64_t h = task.kv_head * g + r;
          const float* src = q + (b * heads_ + h) * hd;
          hq.insert(hq.end(), src, src + hd);
          at.push_back(base[b] + i * heads_ + h);
          meta.push_back(seqs[static_cast<size_t>(b)].doc);
          meta.push_back(static_cast<int32_t>(page.fast_slot));
          meta.push_back(static_cast<int32_t>(page.tokens));
        }
    }
    const int64_t rows = static_cast<int64_t>(at.size());
    if (rows > 0) {
      reserve_device(rows);
      // meta as [3, rows]: q_doc, slot, tokens.
      std::vector<int32_t> planar(static_cast<size_t>(3 * rows));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < 3; ++c)
          planar[static_cast<size_t>(c * rows + r)] = meta[static_cast<size_t>(r * 3 + c)];
      device_check(dev, dev->copy_to_device(dev_q_, hq.data(), hq.size() * 4), "copy_to_device");
      device_check(dev, dev->copy_to_device(dev_meta_, planar.data(), planar.size() * 4),
                   "copy_to_device");
      kernels::PagedDecodeArgs a;
      a.rows = rows;
      a.head_dim = hd;
      a.page_tokens = cache_->page_tokens();
      a.scale = scale_;
      a.dtype = cache_->dtype();
      a.pool = cache_->device_pool();
      a.pool_docs = cache_->device_docs();
      a.q = dev_q_;
      a.q_doc = dev_meta_;
      a.slot = dev_meta_ + rows;
      a.tokens = dev_meta_ + 2 * rows;
      device_check(dev, dev->paged_decode_attention(a, dev_out_, dev_lse_),
                   "paged_decode_attention");
    }
    // Host and disk pages on the CPU threads while the device works.
    pool_->parallel_for(static_cast<int64_t>(on_cpu.size()),
                        [&](int64_t x) { compute(on_cpu[static_cast<size_t>(x)]); });
    if (rows > 0) {
      std::vector<float> ho(static_cast<size_t>(rows * hd)), hl(static_cast<size_t>(rows));
      device_check(dev, dev->copy_to_host(ho.data(), dev_out_, ho.size() * 4), "copy_to_host");
      device_check(dev, dev->copy_to_host(hl.data(), dev_lse_, hl.size() * 4), "copy_to_host");
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t x = at[static_cast<size_t>(r)];
        std::copy(ho.data() + r * hd, ho.data() + (r + 1) * hd, part_o.data() + x * hd);
        part_lse[static_cast<size_t>(x)] = hl[static_cast<size_t>(r)];
      }
      device_rows += rows;
    }
    // The fast tier's copies issued before this layer are complete: their sources may change.
    cache_->sync_fast();
  };
  std::vector<char> skipped(tasks.size(), 0);
  if (skip_threshold <= 0.0) {
    std::vector<int64_t> all(tasks.size());
    for (size_t t = 0; t < tasks.size(); ++t) all[t] = static_cast<int64_t>(t);
    run(all);
  } else {
    // Approximate mode. Phase 1: the tasks holding some sequence's last page (always computed)
    // give each (sequence, head) a lower bound L on its final lse.
    std::vector<int64_t> first, rest;
    for (size_t t = 0; t < tasks.size(); ++t) {
      bool last = false;
      for (const auto& [b, i] : tasks[t].users)
        last = last || i + 1 == static_cast<int64_t>((*seqs[b].pages)[0].size());
      (last ? first : rest).push_back(static_cast<int64_t>(t));
    }
    run(first);
    const std::vector<double> low = lse_lower_bounds(first, B);
    // Phase 2: a page is skipped when, for every query row using it, its softmax mass is below
    // the threshold for certain: mass <= tokens x exp(scale x max_j q.k_j - L), with
    // max_j q.k_j <= sum_d max(q_d kmin_d, q_d kmax_d) (the page's per-channel key bounds).
    std::vector<int64_t> rest_run;
    std::vector<double> bound(static_cast<size_t>(B * heads_), 0.0);
    for (int64_t t : rest) {
      const Task& task = tasks[static_cast<size_t>(t)];
      const Page& page = cache_->page(task.page);
      bool skip = page.tokens > 0;
      std::vector<std::pair<int64_t, double>> fracs;
      for (const auto& [b, i] : task.users) {
        for (int64_t r = 0; r < g && skip; ++r) {
          const int64_t h = task.kv_head * g + r;
          const float* qr = q + (b * heads_ + h) * hd;
          double ub = 0;
          for (int64_t d = 0; d < hd; ++d)
            ub += std::max(static_cast<double>(qr[d]) * page.kmin[static_cast<size_t>(d)],
                           static_cast<double>(qr[d]) * page.kmax[static_cast<size_t>(d)]);
          const double l = low[static_cast<size_t>(b * heads_ + h)];
          const double frac =
              l == -INFINITY ? INFINITY
                             : std::exp(std::log(static_cast<double>(page.tokens)) +
                                        static_cast<double>(scale_) * ub - l);
          if (!(frac < skip_threshold)) skip = false;
          fracs.emplace_back(b * heads_ + h, frac);
        }
      }
      if (!skip) {
        rest_run.push_back(t);
        continue;
      }
      skipped[static_cast<size_t>(t)] = 1;
      for (const auto& [bh, frac] : fracs) bound[static_cast<size_t>(bh)] += frac;
      for (const auto& [b, i] : task.users)
        for (int64_t r = 0; r < g; ++r) {
          const int64_t at = base[b] + i * heads_ + task.kv_head * g + r;
          part_lse[static_cast<size_t>(at)] = -INFINITY;  // an empty partial: merged as nothing
        }
    }
    run(rest_run);
    if (skipped_bound != nullptr)
      for (size_t i = 0; i < bound.size(); ++i) skipped_bound[i] = static_cast<float>(bound[i]);
  }
  merge_partials(seqs, out, lse);
  count_tasks(skipped, device_rows, stats);
}

}  // namespace ring::gen
