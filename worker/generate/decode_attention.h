// Exact decode attention over the paged KV cache, and the log-sum-exp merge.
//
// For one layer and a batch of sequences each with one new query token: every page the batch
// references (a shared prefix page once, whatever the number of sequences holding it) is a task;
// a task computes, in place where the page lives (fast copy or host/disk backing: never copied
// for the computation), the partial (o, lse) of every query head of every sequence that holds
// it, as a matrix product Q [m, head_dim] x K^T [head_dim, tokens] (m = sequences x query heads
// of the K/V head) then P V. Tasks run on a pool of CPU threads. Each sequence's partials are
// then merged in page order with the rule ring attention uses (kernels/backend.h
// attention_merge):
//   m = max(lse_a, lse_b); lse = m + log(exp(lse_a - m) + exp(lse_b - m))
//   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b        (empty partials: lse = -inf)
// Each query row's arithmetic is the same whatever the batch, the page's tier or the thread that
// runs it, and the merge order is fixed (page order), so neither prefix sharing nor promotion
// changes a single bit of the result.
//
// Device fast tier (a cache whose fast pool is backend memory): the fast pages' partials come
// from the backend's paged decode kernel (kernels/backend.h paged_decode_attention), one query
// row per (page, sequence, query head), launched asynchronously; the CPU threads compute the
// host and disk pages' partials in place meanwhile; then the results are copied back (which
// waits for the kernel) and every partial is merged on the host in page order with the same
// merge_partial. The merge is the same bit for bit; the fast partials carry the kernel's own
// rounding, so results then depend on placement within that rounding.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "worker/generate/kv_cache.h"
#include "worker/generate/thread_pool.h"

namespace ring::gen {

// Merges (o_b, lse_b) into (o_a, lse_a) for one query head: o [head_dim].
void merge_partial(int64_t head_dim, float* o_a, float* lse_a, const float* o_b, float lse_b);

// One page's partial for m query rows: q [m, head_dim], keys/values [tokens, head_dim]; row r
// may attend to key j iff docs[j] == q_doc[r]. out [m, head_dim] normalised, lse [m] (natural
// log, -inf when no key is allowed). Scratch: scores [m x tokens], inv [m]. Vectorised for the
// CPU backend's active ISA (AVX-512, AVX2+FMA, scalar); exp is the kernels' Cephes expf.
void page_partial(int64_t m, int64_t head_dim, float scale, const float* q, const int32_t* q_doc,
                  int64_t tokens, const float* k, const float* v, const int32_t* docs, float* out,
                  float* lse, float* scores, float* inv);
// The same over a bf16 page (keys/values as bf16 bits): each value is widened to fp32 exactly as
// it is read, so the result is bit for bit the fp32 overload's on the widened values.
void page_partial(int64_t m, int64_t head_dim, float scale, const float* q, const int32_t* q_doc,
                  int64_t tokens, const uint16_t* k, const uint16_t* v, const int32_t* docs,
                  float* out, float* lse, float* scores, float* inv);

// A sequence as decode attention sees it in one layer: its pages of each K/V head in order.
struct SeqView {
  const std::vector<std::vector<PageId>>* pages = nullptr;  // [kv_heads][page index]
  int32_t doc = 0;                                          // the query token's document
};

struct DecodeStats {
  int64_t tasks = 0, fast_tasks = 0, host_tasks = 0, disk_tasks = 0;
  int64_t shared_tasks = 0;  // tasks serving more than one sequence
  int64_t kv_bytes = 0;      // K/V bytes read (each page once)
  int64_t skipped_tasks = 0; // approximate mode: pages not computed
  int64_t device_rows = 0;   // device fast tier: query rows computed by the backend's kernel
};

class DecodeAttention {
 public:
  // With a device fast tier (cache->fast_on_device()), its backend runs the fast pages.
  DecodeAttention(KvCache* cache, ThreadPool* pool, int64_t heads, int64_t kv_heads,
                  int64_t head_dim);
  ~DecodeAttention();
  DecodeAttention(const DecodeAttention&) = delete;
  DecodeAttention& operator=(const DecodeAttention&) = delete;
  // q [B, heads, head_dim] (RoPE applied) -> out [B, heads, head_dim], lse [B, heads]. Adds each
  // page's attention mass (exp(lse_page - lse), summed over heads and sequences) to its
  // promotion statistic.
  //
  // skip_threshold > 0: the APPROXIMATE mode. Each sequence's last page is computed first; its
  // lse L is a lower bound of the final lse. Another page is skipped when for every query row
  // using it tokens x exp(scale x sum_d max(q_d kmin_d, q_d kmax_d) - L) < skip_threshold (an
  // upper bound of its share of the softmax, from the page's per-channel key bounds);
  // skipped_bound [B, heads] (if given) receives the sum of those bounds over skipped pages: a
  // bound on the softmax mass left out of each (sequence, head). 0: exact.
  void forward(const std::vector<SeqView>& seqs, const float* q, float* out, float* lse,
               DecodeStats* stats = nullptr, double skip_threshold = 0.0,
               float* skipped_bound = nullptr);

 private:
  // Device tier: backend buffers for `rows` query rows (grown on demand).
  void reserve_device(int64_t rows);
  // forward()'s steps: the partials' offsets (base_) and one task per distinct page (tasks_,
  // users_); each (sequence, head)'s lower bound on its lse from the tasks `first` computed; the
  // partials merged in page order into out and lse, each page's attention mass told to the
  // cache; the call's counts into *stats.
  void build_tasks(const std::vector<SeqView>& seqs);
  std::vector<double> lse_lower_bounds(const std::vector<int64_t>& first, int64_t batch) const;
  void merge_partials(const std::vector<SeqView>& seqs, float* out, float* lse);
  void count_tasks(const std::vector<char>& skipped, int64_t device_rows, DecodeStats* stats) const;

  // The (sequence, page index) pairs a task serves: (*all)[first, first + count).
  struct Users {
    const std::vector<std::pair<int64_t, int64_t>>* all = nullptr;
    size_t first = 0, count = 0;
    size_t size() const { return count; }
    const std::pair<int64_t, int64_t>& operator[](size_t u) const { return (*all)[first + u]; }
    const std::pair<int64_t, int64_t>* begin() const { return all->data() + first; }
    const std::pair<int64_t, int64_t>* end() const { return begin() + count; }
  };
  // One task per distinct page of the batch.
  struct Task {
    PageId page;
    int64_t kv_head;
    Users users;
  };

  KvCache* cache_;
  ThreadPool* pool_;
  int64_t heads_, kv_heads_, head_dim_, group_;
  float scale_;
  // Device tier scratch (backend memory): q [rows, head_dim], meta [3, rows] (q_doc, slot,
  // tokens), out [rows, head_dim], lse [rows].
  // forward()'s buffers, kept between calls (a step at 1M tokens has thousands of pages per
  // layer): partial offsets, partials, tasks and their users, the page -> task index.
  std::vector<int64_t> base_;
  std::vector<float> part_o_, part_lse_;
  std::vector<Task> tasks_;
  std::vector<std::pair<int64_t, int64_t>> users_;
  std::unordered_map<PageId, size_t> index_;
  std::vector<size_t> entry_task_;
  int64_t dev_rows_ = 0;
  float* dev_q_ = nullptr;
  int32_t* dev_meta_ = nullptr;
  float* dev_out_ = nullptr;
  float* dev_lse_ = nullptr;
};

}  // namespace ring::gen
