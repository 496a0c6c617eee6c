// NodeOptimizer: see node_optimizer.h for the contract and the math.
#include "daemon/optim/node_optimizer.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <omp.h>

#include "common/contract/optimizer_rule.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"

namespace ring::optim {
namespace {

using kernels::Backend;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check(kernels::Status s, const char* op, int bucket = -1) {
  if (s != kernels::Status::kOk) {
    throw OptimError(std::string("NodeOptimizer: kernel ") + op +
                     (bucket >= 0 ? " on bucket " + std::to_string(bucket) : std::string()) +
                     " failed: " + kernels::status_string(s));
  }
}

// f(begin, end) on contiguous parts of [0, n), one per thread (boundaries multiples of 16 floats),
// for the streaming loops the kernels interface has no fused form of. Plain loops: the compiler
// vectorises them, and they are memory-bound.
template <class F>
void parallel_ranges(int64_t n, int threads, F&& f) {
  constexpr int64_t kGrain = 1 << 16;
  const int want = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n / kGrain)));
  if (want <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(want)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t chunk = ((n + nt - 1) / nt + 15) / 16 * 16;
    const int64_t b = std::min(n, id * chunk), e = std::min(n, b + chunk);
    f(b, e);
  }
}

// A parameter tensor inside a bucket, offsets relative to the bucket's first float.
struct TensorRef {
  int64_t offset = 0;  // from bucket.begin
  int64_t size = 0;
  bool decay = true;
};

// AdamW on single coordinates, the same arithmetic as the vector kernel of kernels/cpu
// (ops.cc AdamConsts, ops_isa.inc adamw_vec): constants folded in fp64, then per element
// m = fma(b1, m, (1-b1) g); v = fma(b2, v, (1-b2) g g); d = fma(sqrt v, 1/sqrt(bc2), eps);
// p = fma(-step_size, m / d, p decay). Every op is correctly rounded, so a coordinate gets the
// bits the dense kernel would give it (ring_optim is built with -ffp-contract=off).
struct SparseAdam {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_sqrt_bc2, decay;

  SparseAdam(const Backend::AdamWParams& hp) {
    double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
    double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
    beta1 = hp.beta1;
    one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
    beta2 = hp.beta2;
    one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
    eps = hp.eps;
    step_size = static_cast<float>(hp.lr / bc1);
    inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  }
  void apply(float g, float* p, float* m, float* v) const {
    const float mg = one_minus_beta1 * g;
    const float mm = std::fma(beta1, *m, mg);
    const float gg = g * g;
    const float vg = one_minus_beta2 * gg;
    const float vv = std::fma(beta2, *v, vg);
    const float d = std::fma(std::sqrt(vv), inv_sqrt_bc2, eps);
    const float q = mm / d;
    const float pd = *p * decay;
    *p = std::fma(-step_size, q, pd);
    *m = mm;
    *v = vv;
  }
};

}  // namespace

struct NodeOptimizer::Impl {
  Impl(const spec::JobSpec& sp, const contract::ParamLayout& lay, int64_t steps, int th,
       Exchange* ex, std::unique_ptr<Backend> be)
      : spec(sp), layout(lay), total_steps(steps), threads(th), exchange(ex),
        backend(std::move(be)) {}

  spec::JobSpec spec;
  contract::ParamLayout layout;
  int64_t total_steps;
  int threads;
  Exchange* exchange;
  std::unique_ptr<Backend> backend;
  int64_t total = 0;
  int nbuckets = 0;
  std::vector<ExchangeSpan> spans;  // this step's exchanges between nodes (pipeline thread)
  std::vector<contract::NodeRange> ranges;  // every node's (contract::shard_ranges)
  contract::NodeRange range;  // this node's range (checkpoints; the owned state with shard)
  bool sharded = false;       // parallel.shard optimizer or full: master, m, v of `range` only
  bool full = false;          // parallel.shard full: the node gradient of `range` is already the
                              // job's sum (the workers reduce-scattered it); nothing crosses nodes
                              // but the buckets' sums of squares
  int64_t state_begin = 0;    // flat offset of master[0], m[0], v[0] (range.begin when sharded)
  int64_t state_size = 0;     // floats of master, m, v
  float* weights = nullptr;   // the caller's weights buffer (set_weights_buffer)
  int64_t weights_first = 0;  // the flat offset of weights[0]
  std::vector<std::vector<TensorRef>> tensors;  // per bucket
  bool topk = false, error_feedback = false, lazy = false;
  bool at_owner = false;  // top-k selects at each range's owner from the nodes' summed
                          // gradient (optimizer.compress_at owner; shard full always)
  int64_t res_begin = 0;  // flat offset of residual[0] (range.begin at the owner)
  int64_t res_size = 0;   // floats of the residual (range.size() at the owner, else total)

  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* residual = nullptr;        // top-k with error feedback only ([res_size] from res_begin)
  std::vector<uint32_t> topk_idx;   // scratch [max bucket k]
  std::vector<float> topk_val;

  int64_t completed = 0;
  std::vector<int64_t> changed;

  // ---- the step in flight ----
  bool in_step = false;
  int64_t step = 0;
  bool compressed = false;
  bool update_on_pipeline = false;  // grad_clip == 0: buckets updated as they are exchanged
  bool publish_on_pipeline = false;  // shard optimizer, grad_clip == 0: and their weights sent
  bool step_all_changed = true;      // a dense update (false: lazy)
  double lr = 0;
  int next_bucket = 0;
  std::vector<float*> grad;      // per bucket: the caller's node_grad
  std::vector<double> ss;        // per bucket: sum of squares of the exchanged gradient
  std::vector<std::vector<uint32_t>> sparse_idx;  // per bucket: summed sparse gradient,
  std::vector<std::vector<float>> sparse_val;     // ascending offsets from bucket.begin
  int64_t bytes_sent = 0, selected = 0, bytes_weights = 0;
  double busy_s = 0;

  // ---- pipeline thread ----
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> queue;
  int processed = 0;
  bool stop = false;
  std::exception_ptr error;
  std::thread pipeline;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (pipeline.joinable()) pipeline.join();
    for (float* p : {master, m, v, residual}) {
      if (p != nullptr) backend->free(p);
    }
  }

  float* alloc_zeroed(const char* what, int64_t n) {
    void* p = nullptr;
    if (backend->alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float), &p) !=
        kernels::Status::kOk) {
      throw OptimError(std::string("NodeOptimizer: cannot allocate ") + what + " (" +
                       std::to_string(n * 4) + " bytes)");
    }
    float* f = static_cast<float*>(p);
    // Zeroed by the threads that will stream it (first touch places the pages).
    check(backend->fill(n, 0.f, f), "fill");
    return f;
  }

  bool owns(int b) const { return !sharded || (b >= range.first_bucket && b < range.end_bucket); }
  int owner(int b) const { return sharded ? contract::bucket_owner(ranges, b) : exchange->node(); }

  // An exchange failure with the node and the bucket named (the exchange's message kept).
  template <class F>
  auto on_bucket(int b, const char* what, F&& f) {
    try {
      // The exchange's span for ringd's timeline (the vector's capacity is reserved: no
      // allocation on the pipeline thread).
      struct Span {
        Impl* s;
        int b;
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        ~Span() {
          if (s->spans.size() < s->spans.capacity())
            s->spans.push_back({b, t0, std::chrono::steady_clock::now()});
        }
      } span{this, b};
      return f();
    } catch (const std::exception& e) {
      throw OptimError("NodeOptimizer: node " + std::to_string(exchange->node()) + ", step " +
                       std::to_string(step) + ", bucket " + std::to_string(b) + ": " + what +
                       " failed: " + e.what());
    }
  }

  Backend::AdamWParams hparams(bool decay) const {
    const contract::AdamWParams a = contract::adamw_params(spec.optimizer, lr, step, decay);
    return Backend::AdamWParams{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step};
  }

  int64_t bucket_k(int64_t size) const {
    int64_t k = static_cast<int64_t>(std::ceil(spec.optimizer.density * static_cast<double>(size)));
    return std::clamp<int64_t>(k, size > 0 ? 1 : 0, size);
  }

  void run_pipeline() {
    for (;;) {
      int b;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (stop) return;
        b = queue.front();
        queue.pop_front();
        if (error) {  // a failed bucket poisons the rest of the step
          ++processed;
          cv.notify_all();
          continue;
        }
      }
      std::exception_ptr err;
      const auto t0 = Clock::now();
      try {
        exchange_bucket(b);
        if (update_on_pipeline && owns(b)) update_bucket(b, 1.f, false);
        // Shard optimizer without clipping: the owner's new weights of the bucket go out at
        // once, hidden behind the backward of the next buckets like the gradients. (Every
        // worker has copied this step's weights before its gradient of b could arrive.)
        if (publish_on_pipeline) {
          bytes_weights += step_all_changed ? publish_dense(b, b + 1) : publish_lazy(b, b + 1);
        }
      } catch (...) {
        err = std::current_exception();
      }
      const double dt = seconds_since(t0);
      {
        std::lock_guard<std::mutex> lock(mu);
        busy_s += dt;
        if (err && !error) error = err;
        ++processed;
      }
      cv.notify_all();
    }
  }

  // Exchange, compression and sum of squares of bucket b (pipeline thread).
  void exchange_bucket(int b) {
    const contract::GradBucket& bk = layout.buckets()[b];
    const int64_t size = bk.end - bk.begin;
    float* g = grad[b];
    if (full && !owns(b)) {
      // Shard full: another node's range; its owner has the job's sum already.
      ss[b] = 0;
      sparse_idx[b].clear();
      sparse_val[b].clear();
      return;
    }
    if (!compressed) {
      selected += size;
      if (full) {
        check(backend->sum_squares(size, g, &ss[b]), "sum_squares", b);
        return;
      }
      if (sharded) {
        const int o = owner(b);
        if (exchange->nodes() > 1)
          on_bucket(b, "reduce", [&] { exchange->reduce_sum(g, size, o); });
        if (o != exchange->node()) {
          bytes_sent += 4 * size;
          ss[b] = 0;  // the owner's sum counts
          return;
        }
        check(backend->sum_squares(size, g, &ss[b]), "sum_squares", b);
        return;
      }
      if (exchange->nodes() > 1)
        on_bucket(b, "all-reduce", [&] { exchange->allreduce_sum(g, size); });
      bytes_sent += 4 * size;
      check(backend->sum_squares(size, g, &ss[b]), "sum_squares", b);
      return;
    }
    if (at_owner) {
      select_at_owner(b);
      return;
    }
    // Top-k at the sender: this node selects from its own gradient (+ its full-size residual).
    const uint32_t count = select_topk(b, g, error_feedback ? residual + bk.begin : nullptr);
    selected += count;
    const int64_t payload_bytes = 4 + 8 * static_cast<int64_t>(count);
    const int o = owner(b);
    if (!sharded || o != exchange->node()) bytes_sent += payload_bytes;
    std::vector<uint32_t>& out_idx = sparse_idx[b];
    std::vector<float>& out_val = sparse_val[b];
    out_idx.clear();
    out_val.clear();
    if (exchange->nodes() == 1) {
      out_idx.assign(topk_idx.begin(), topk_idx.begin() + count);
      out_val.assign(topk_val.begin(), topk_val.begin() + count);
    } else {
      const std::vector<uint8_t> payload = sparse_payload(count);
      if (sharded) {
        // To the owner only; the others hold nothing of this bucket (sum of squares 0).
        std::vector<std::vector<uint8_t>> all = on_bucket(
            b, "gather", [&] { return exchange->gather(payload.data(), payload_bytes, o); });
        if (o == exchange->node()) merge(b, size, all);
      } else {
        std::vector<std::vector<uint8_t>> all = on_bucket(
            b, "all-gather", [&] { return exchange->allgather(payload.data(), payload_bytes); });
        merge(b, size, all);
      }
    }
    double s = 0;
    for (float x : out_val) s += static_cast<double>(x) * x;
    ss[b] = s;
  }

  // Top-k of bucket b from g [bucket floats] (the node's gradient, or at the owner the job's):
  // acc = res + g (error feedback; res is the bucket's residual, null without) or g; the
  // k = bucket_k entries of largest |acc| go into topk_idx / topk_val (ascending offsets, zeros
  // dropped); res = acc with them zeroed. Returns their count.
  uint32_t select_topk(int b, float* g, float* res) {
    const contract::GradBucket& bk = layout.buckets()[b];
    const int64_t size = bk.end - bk.begin;
    float* acc = g;
    if (res != nullptr) {
      acc = res;
      parallel_ranges(size, threads, [acc, g](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) acc[i] += g[i];
      });
    }
    const int64_t k = bucket_k(size);
    check(backend->topk_abs(size, k, acc, topk_idx.data(), topk_val.data()), "topk_abs", b);
    uint32_t count = 0;
    for (int64_t i = 0; i < k; ++i) {
      if (topk_val[i] != 0.f) {
        topk_idx[count] = topk_idx[i];
        topk_val[count] = topk_val[i];
        ++count;
      }
    }
    if (res != nullptr) {
      for (uint32_t i = 0; i < count; ++i) acc[topk_idx[i]] = 0.f;
    }
    return count;
  }

  // The wire form of the first `count` entries of topk_idx / topk_val:
  // [uint32 count][count x uint32 offset][count x float value].
  std::vector<uint8_t> sparse_payload(uint32_t count) const {
    std::vector<uint8_t> payload(4 + 8 * static_cast<size_t>(count));
    std::memcpy(payload.data(), &count, 4);
    std::memcpy(payload.data() + 4, topk_idx.data(), 4 * static_cast<size_t>(count));
    std::memcpy(payload.data() + 4 + 4 * static_cast<size_t>(count), topk_val.data(),
                4 * static_cast<size_t>(count));
    return payload;
  }

  // Top-k at the owner o of bucket b's range: the nodes' gradients are reduced to o in node
  // order (shard full: the workers' reduce-scatter did it), o selects from the sum + its
  // residual of the range and keeps the rest. Shard optimizer and full: o alone holds the
  // bucket's sparse gradient (and its sum of squares). Shard none: o's set is all-gathered (the
  // others send an empty set), so every node applies the same sparse gradient and computes the
  // same sum of squares.
  void select_at_owner(int b) {
    const contract::GradBucket& bk = layout.buckets()[b];
    const int64_t size = bk.end - bk.begin;
    float* g = grad[b];
    const int n = exchange->nodes();
    const int o = contract::bucket_owner(ranges, b);
    const bool mine = o == exchange->node();
    if (!full && n > 1) {
      on_bucket(b, "reduce", [&] { exchange->reduce_sum(g, size, o); });
      if (!mine) bytes_sent += 4 * size;
    }
    std::vector<uint32_t>& out_idx = sparse_idx[b];
    std::vector<float>& out_val = sparse_val[b];
    out_idx.clear();
    out_val.clear();
    uint32_t count = 0;
    if (mine) {
      count = select_topk(b, g, error_feedback ? residual + (bk.begin - res_begin) : nullptr);
      selected += count;
    }
    // Shard none counts its contribution to the all-gather even on one node (as at the sender).
    if (!sharded) bytes_sent += 4 + 8 * static_cast<int64_t>(count);
    if (!sharded && n > 1) {
      const std::vector<uint8_t> payload = sparse_payload(count);
      std::vector<std::vector<uint8_t>> all = on_bucket(b, "all-gather", [&] {
        return exchange->allgather(payload.data(), static_cast<int64_t>(payload.size()));
      });
      merge(b, size, all);
    } else if (mine) {
      out_idx.assign(topk_idx.begin(), topk_idx.begin() + count);
      out_val.assign(topk_val.begin(), topk_val.begin() + count);
    }
    double s = 0;
    for (float x : out_val) s += static_cast<double>(x) * x;
    ss[b] = s;
  }

  // Sums the nodes' sparse sets of bucket b in node order at each offset (k-way merge of
  // ascending lists; left fold from the lowest node that sent the offset).
  void merge(int b, int64_t size, const std::vector<std::vector<uint8_t>>& all) {
    const int n = static_cast<int>(all.size());
    if (n != exchange->nodes()) {
      throw OptimError("NodeOptimizer: allgather on bucket " + std::to_string(b) + " returned " +
                       std::to_string(n) + " contributions for " +
                       std::to_string(exchange->nodes()) + " nodes");
    }
    std::vector<const uint32_t*> idx(n);
    std::vector<const float*> val(n);
    std::vector<uint32_t> cnt(n), pos(n, 0);
    size_t total_count = 0;
    for (int j = 0; j < n; ++j) {
      const std::vector<uint8_t>& p = all[j];
      uint32_t c = 0;
      if (p.size() >= 4) std::memcpy(&c, p.data(), 4);
      if (p.size() < 4 || p.size() != 4 + 8 * static_cast<size_t>(c)) {
        throw OptimError("NodeOptimizer: node " + std::to_string(j) + " sent a malformed sparse "
                         "gradient for bucket " + std::to_string(b) + " (" +
                         std::to_string(p.size()) + " bytes)");
      }
      cnt[j] = c;
      idx[j] = reinterpret_cast<const uint32_t*>(p.data() + 4);
      val[j] = reinterpret_cast<const float*>(p.data() + 4 + 4 * static_cast<size_t>(c));
      for (uint32_t q = 0; q < c; ++q) {
        if (idx[j][q] >= size || (q > 0 && idx[j][q] <= idx[j][q - 1])) {
          throw OptimError("NodeOptimizer: node " + std::to_string(j) + " sent offset " +
                           std::to_string(idx[j][q]) + " out of order or outside bucket " +
                           std::to_string(b) + " of " + std::to_string(size) + " floats");
        }
      }
      total_count += c;
    }
    std::vector<uint32_t>& out_idx = sparse_idx[b];
    std::vector<float>& out_val = sparse_val[b];
    out_idx.reserve(total_count);
    out_val.reserve(total_count);
    for (;;) {
      uint32_t next = UINT32_MAX;
      bool any = false;
      for (int j = 0; j < n; ++j) {
        if (pos[j] < cnt[j] && (!any || idx[j][pos[j]] < next)) {
          next = idx[j][pos[j]];
          any = true;
        }
      }
      if (!any) break;
      bool first = true;
      float sum = 0.f;
      for (int j = 0; j < n; ++j) {
        if (pos[j] < cnt[j] && idx[j][pos[j]] == next) {
          sum = first ? val[j][pos[j]] : sum + val[j][pos[j]];
          first = false;
          ++pos[j];
        }
      }
      out_idx.push_back(next);
      out_val.push_back(sum);
    }
  }

  // AdamW on bucket b with the gradient scaled by `scale` when `clip` (the Trainer's order:
  // scale the gradient in fp32, then the update).
  void update_bucket(int b, float scale, bool clip) {
    const contract::GradBucket& bk = layout.buckets()[b];
    const int64_t size = bk.end - bk.begin;
    float* g = grad[b];
    if (compressed) {
      std::vector<float>& vals = sparse_val[b];
      if (clip) {
        for (float& x : vals) x *= scale;
      }
      if (lazy) {
        const std::vector<uint32_t>& idx = sparse_idx[b];
        const std::vector<TensorRef>& ts = tensors[b];
        size_t t = 0;
        SparseAdam with_decay(hparams(true)), no_decay(hparams(false));
        for (size_t q = 0; q < idx.size(); ++q) {
          const int64_t off = idx[q];
          while (t < ts.size() && off >= ts[t].offset + ts[t].size) ++t;
          if (t == ts.size() || off < ts[t].offset) continue;  // alignment gap: not a parameter
          const int64_t i = bk.begin + off - state_begin;
          (ts[t].decay ? with_decay : no_decay).apply(vals[q], master + i, m + i, v + i);
        }
        return;
      }
      // Dense update of the sparse gradient: scatter into the (consumed) node gradient.
      parallel_ranges(size, threads, [g](int64_t lo, int64_t hi) {
        std::memset(g + lo, 0, sizeof(float) * (hi - lo));
      });
      const std::vector<uint32_t>& idx = sparse_idx[b];
      for (size_t q = 0; q < idx.size(); ++q) g[idx[q]] = vals[q];
    } else if (clip) {
      // The Trainer's Backend::scale: g[i] * scale in fp32, the same bits.
      parallel_ranges(size, threads, [g, scale](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) g[i] *= scale;
      });
    }
    for (const TensorRef& t : tensors[b]) {
      const int64_t i = bk.begin + t.offset - state_begin;
      check(backend->adamw_step(t.size, hparams(t.decay), master + i, g + t.offset, m + i, v + i),
            "adamw_step", b);
    }
  }

  // Shard optimizer, after the norm: this thread updates the owned buckets in order while a
  // publisher thread, the only one to call the exchange meanwhile, gathers every bucket's new
  // weights in bucket order (an owned bucket once it is updated).
  void update_and_publish(const contract::ClipRule& clip) {
    std::mutex pm;
    std::condition_variable pcv;
    int updated = range.first_bucket;  // owned buckets [first_bucket, updated) are done
    bool abort = false;
    std::exception_ptr publish_error, update_error;
    std::thread publisher([&] {
      try {
        for (int b = 0; b < nbuckets; ++b) {
          if (owns(b)) {
            std::unique_lock<std::mutex> lock(pm);
            pcv.wait(lock, [&] { return updated > b || abort; });
            if (abort) return;
          }
          bytes_weights += step_all_changed ? publish_dense(b, b + 1) : publish_lazy(b, b + 1);
        }
      } catch (...) {
        publish_error = std::current_exception();
      }
    });
    try {
      for (int b = range.first_bucket; b < range.end_bucket; ++b) {
        update_bucket(b, clip.scale, clip.clipped);
        {
          std::lock_guard<std::mutex> lock(pm);
          updated = b + 1;
        }
        pcv.notify_all();
      }
    } catch (...) {
      update_error = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(pm);
        abort = true;
      }
      pcv.notify_all();
    }
    publisher.join();
    if (update_error) std::rethrow_exception(update_error);
    if (publish_error) std::rethrow_exception(publish_error);
  }

  // ---- the weights buffer ----
  // Every coordinate of buckets [b0, b1) (shard none: every coordinate): shard none copies the
  // master; shard optimizer copies its part and all-gathers the others' straight into the
  // buffer. Returns the bytes this node sent.
  int64_t publish_dense(int b0, int b1) {
    if (weights == nullptr) return 0;
    if (!sharded) {
      if (weights != master) {
        parallel_ranges(total, threads, [this](int64_t lo, int64_t hi) {
          std::memcpy(weights + lo, master + lo, sizeof(float) * (hi - lo));
        });
      }
      return 0;
    }
    if (b0 >= b1) return 0;
    // Floats [lo, hi) of the buckets (the whole layout for all of them).
    const int64_t lo = b0 == 0 ? 0 : layout.buckets()[b0].begin;
    const int64_t hi = b1 == nbuckets ? total : layout.buckets()[b1 - 1].end;
    const auto clamp = [lo, hi](int64_t x) { return std::clamp(x, lo, hi); };
    const int64_t mine_lo = clamp(range.begin), mine_hi = clamp(range.end);
    float* dst = weights + (mine_lo - weights_first);
    const float* src = master + (mine_lo - state_begin);
    parallel_ranges(mine_hi - mine_lo, threads, [dst, src](int64_t a, int64_t e) {
      std::memcpy(dst + a, src + a, sizeof(float) * (e - a));
    });
    const int n = exchange->nodes();
    // Shard full: the workers read only their shards, which lie in this node's range.
    if (n == 1 || full) return 0;
    std::vector<int64_t> offsets(n + 1);
    for (int k = 0; k < n; ++k) offsets[k] = clamp(ranges[k].begin);
    offsets[n] = hi;
    try {
      exchange->allgather_spans(weights, offsets);
    } catch (const std::exception& e) {
      throw OptimError("NodeOptimizer: node " + std::to_string(exchange->node()) + ", step " +
                       std::to_string(step) + ": weight all-gather of buckets [" +
                       std::to_string(b0) + ", " + std::to_string(b1) + ") failed: " + e.what());
    }
    return 4 * (mine_hi - mine_lo) * (n - 1);
  }

  // The changed coordinates of buckets [b0, b1) in a lazy step: shard none copies them from the
  // master (changed already lists them); shard optimizer all-gathers what each owner changed,
  // writes it into the buffer and appends every node's changes to `changed` (node order =
  // ascending, the ranges being in node order). Payload per owned bucket, in bucket order:
  // [uint32 count][count x uint32 offset from the bucket's begin, ascending][count x float
  // value]. Returns the bytes this node sent.
  int64_t publish_lazy(int b0, int b1) {
    if (!sharded) {
      if (weights != nullptr && weights != master) {
        for (int64_t i : changed) weights[i] = master[i];
      }
      return 0;
    }
    const int n = exchange->nodes();
    const int my0 = std::max(b0, range.first_bucket), my1 = std::min(b1, range.end_bucket);
    size_t bytes = 0;
    for (int b = my0; b < my1; ++b) bytes += 4 + 8 * sparse_idx[b].size();
    std::vector<uint8_t> payload(bytes);
    uint8_t* w = payload.data();
    for (int b = my0; b < my1; ++b) {
      const std::vector<uint32_t>& idx = sparse_idx[b];
      const uint32_t c = static_cast<uint32_t>(idx.size());
      const float* base = master + (layout.buckets()[b].begin - state_begin);
      std::memcpy(w, &c, 4);
      std::memcpy(w + 4, idx.data(), 4 * static_cast<size_t>(c));
      float* vals = reinterpret_cast<float*>(w + 4 + 4 * static_cast<size_t>(c));
      for (uint32_t q = 0; q < c; ++q) std::memcpy(vals + q, base + idx[q], 4);
      w += 4 + 8 * static_cast<size_t>(c);
    }
    std::vector<std::vector<uint8_t>> all;
    try {
      all = exchange->allgather(payload.data(), static_cast<int64_t>(payload.size()));
    } catch (const std::exception& e) {
      throw OptimError("NodeOptimizer: node " + std::to_string(exchange->node()) + ", step " +
                       std::to_string(step) + ": changed-weights all-gather of buckets [" +
                       std::to_string(b0) + ", " + std::to_string(b1) + ") failed: " + e.what());
    }
    if (static_cast<int>(all.size()) != n) {
      throw OptimError("NodeOptimizer: changed-weights all-gather returned " +
                       std::to_string(all.size()) + " contributions for " + std::to_string(n) +
                       " nodes");
    }
    for (int k = 0; k < n; ++k) {
      const std::vector<uint8_t>& p = all[k];
      size_t at = 0;
      const int k0 = std::max(b0, ranges[k].first_bucket), k1 = std::min(b1, ranges[k].end_bucket);
      for (int b = k0; b < k1; ++b) {
        const contract::GradBucket& bk = layout.buckets()[b];
        uint32_t c = 0;
        if (p.size() - at >= 4) std::memcpy(&c, p.data() + at, 4);
        if (p.size() - at < 4 || p.size() - at - 4 < 8 * static_cast<size_t>(c)) {
          throw OptimError("NodeOptimizer: node " + std::to_string(k) +
                           " sent malformed changed weights for bucket " + std::to_string(b) +
                           " (" + std::to_string(p.size()) + " bytes)");
        }
        const uint8_t* offs = p.data() + at + 4;
        const uint8_t* vals = offs + 4 * static_cast<size_t>(c);
        for (uint32_t q = 0; q < c; ++q) {
          uint32_t off;
          float val;
          std::memcpy(&off, offs + 4 * static_cast<size_t>(q), 4);
          std::memcpy(&val, vals + 4 * static_cast<size_t>(q), 4);
          const int64_t i = bk.begin + off;
          if (i >= bk.end || (!changed.empty() && i <= changed.back())) {
            throw OptimError("NodeOptimizer: node " + std::to_string(k) + " sent changed offset " +
                             std::to_string(off) + " out of order or outside bucket " +
                             std::to_string(b));
          }
          changed.push_back(i);
          weights[i] = val;
        }
        at += 4 + 8 * static_cast<size_t>(c);
      }
      if (at != p.size()) {
        throw OptimError("NodeOptimizer: node " + std::to_string(k) + " sent " +
                         std::to_string(p.size() - at) + " bytes of changed weights too many");
      }
    }
    return static_cast<int64_t>(payload.size()) * (n - 1);
  }
};

NodeOptimizer::NodeOptimizer(const spec::JobSpec& spec, const contract::ParamLayout& layout,
                             int64_t total_steps, int threads, Exchange* exchange)
{
  if (total_steps < 1) {
    throw OptimError("NodeOptimizer: total_steps must be >= 1, got " +
                     std::to_string(total_steps));
  }
  if (threads < 0) {
    throw OptimError("NodeOptimizer: threads must be >= 0 (0: all cores), got " +
                     std::to_string(threads));
  }
  if (exchange == nullptr) throw OptimError("NodeOptimizer: exchange must not be null");
  if (exchange->nodes() < 1 || exchange->node() < 0 || exchange->node() >= exchange->nodes()) {
    throw OptimError("NodeOptimizer: exchange says node " + std::to_string(exchange->node()) +
                     " of " + std::to_string(exchange->nodes()) + " nodes");
  }
  const spec::OptimizerSection& o = spec.optimizer;
  const bool topk = o.compression == spec::Compression::kTopk;
  if (topk && !(o.density > 0 && o.density <= 1)) {
    throw OptimError("NodeOptimizer: optimizer.density must be in (0, 1], got " +
                     std::to_string(o.density));
  }
  if (o.update == spec::UpdateMode::kLazy && !topk) {
    throw OptimError("NodeOptimizer: optimizer.update: lazy needs optimizer.compression: topk");
  }
  if (topk && o.compress_at == spec::CompressAt::kSender &&
      spec.parallel.shard == spec::ShardMode::kFull) {
    throw OptimError(
        "NodeOptimizer: optimizer.compress_at: sender cannot be used with parallel.shard: full "
        "(the summed gradient of a range exists only at its owner)");
  }
  std::string error;
  auto backend = kernels::create_backend("cpu", threads, &error);
  if (!backend) throw OptimError("NodeOptimizer: cannot create the CPU backend: " + error);
  impl_ = std::make_unique<Impl>(spec, layout, total_steps,
                                 threads > 0 ? threads : kernels::cpu::hardware_threads(),
                                 exchange, std::move(backend));
  Impl& s = *impl_;
  s.total = layout.total();
  s.ranges = contract::shard_ranges(layout, exchange->nodes());
  s.range = s.ranges[exchange->node()];
  s.full = spec.parallel.shard == spec::ShardMode::kFull;
  s.sharded = spec.parallel.shard == spec::ShardMode::kOptimizer || s.full;
  s.state_begin = s.sharded ? s.range.begin : 0;
  s.state_size = s.sharded ? s.range.size() : s.total;
  s.nbuckets = static_cast<int>(layout.buckets().size());
  s.spans.reserve(static_cast<size_t>(4 * s.nbuckets));
  s.topk = topk;
  s.error_feedback = topk && o.error_feedback;
  s.lazy = o.update == spec::UpdateMode::kLazy;
  s.at_owner = topk && (s.full || o.compress_at == spec::CompressAt::kOwner);
  s.res_begin = s.at_owner ? s.range.begin : 0;
  s.res_size = s.at_owner ? s.range.size() : s.total;
  s.tensors.resize(s.nbuckets);
  int64_t max_k = 0;
  for (const contract::GradBucket& b : layout.buckets()) {
    if (b.end - b.begin > (int64_t{1} << 32) - 1) {
      throw OptimError("NodeOptimizer: bucket " + b.name + " has " +
                       std::to_string(b.end - b.begin) + " floats; at most 2^32-1 supported");
    }
    for (const contract::ParamView& pv : layout.views()) {
      if (pv.offset >= b.begin && pv.offset < b.end) {
        s.tensors[b.index].push_back(TensorRef{pv.offset - b.begin, pv.size, pv.decay});
      }
    }
    std::sort(s.tensors[b.index].begin(), s.tensors[b.index].end(),
              [](const TensorRef& a, const TensorRef& c) { return a.offset < c.offset; });
    if (topk) max_k = std::max(max_k, s.bucket_k(b.end - b.begin));
  }
  s.master = s.alloc_zeroed("master weights", s.state_size);
  s.m = s.alloc_zeroed("adam_m", s.state_size);
  s.v = s.alloc_zeroed("adam_v", s.state_size);
  if (s.error_feedback) s.residual = s.alloc_zeroed("residual", s.res_size);
  s.topk_idx.resize(std::max<int64_t>(max_k, 1));
  s.topk_val.resize(std::max<int64_t>(max_k, 1));
  s.grad.assign(s.nbuckets, nullptr);
  s.ss.assign(s.nbuckets, 0.0);
  s.sparse_idx.resize(s.nbuckets);
  s.sparse_val.resize(s.nbuckets);
  s.pipeline = std::thread([p = impl_.get()] { p->run_pipeline(); });
}

NodeOptimizer::~NodeOptimizer() = default;

void NodeOptimizer::init_master(const float* params, int64_t params_first) {
  Impl& s = *impl_;
  if (s.in_step) throw OptimError("NodeOptimizer::init_master: called during step " +
                                  std::to_string(s.step));
  if (params == nullptr && s.total > 0) {
    throw OptimError("NodeOptimizer::init_master: params must not be null");
  }
  if (params_first < 0 || params_first > s.state_begin) {
    throw OptimError("NodeOptimizer::init_master: params start at float " +
                     std::to_string(params_first) + ", after the state's first float " +
                     std::to_string(s.state_begin));
  }
  if (s.state_size > 0) {
    std::memcpy(s.master, params + (s.state_begin - params_first),
                static_cast<size_t>(s.state_size) * sizeof(float));
  }
  check(s.backend->fill(s.state_size, 0.f, s.m), "fill");
  check(s.backend->fill(s.state_size, 0.f, s.v), "fill");
  if (s.residual) check(s.backend->fill(s.res_size, 0.f, s.residual), "fill");
  s.completed = 0;
  s.changed.clear();
}

void NodeOptimizer::begin_step(int64_t step) {
  Impl& s = *impl_;
  if (s.in_step) {
    throw OptimError("NodeOptimizer::begin_step(" + std::to_string(step) + "): step " +
                     std::to_string(s.step) + " is still in flight (call finish_step first)");
  }
  if (step != s.completed + 1) {
    throw OptimError("NodeOptimizer::begin_step(" + std::to_string(step) + "): the next step is " +
                     std::to_string(s.completed + 1));
  }
  if (s.sharded && s.weights == nullptr) {
    throw OptimError("NodeOptimizer::begin_step(" + std::to_string(step) +
                     "): parallel.shard optimizer needs a weights buffer (set_weights_buffer) "
                     "to gather into");
  }
  const spec::OptimizerSection& o = s.spec.optimizer;
  s.step = step;
  s.compressed = s.topk && step > o.warmup_steps;
  s.update_on_pipeline = !contract::clipping_enabled(s.spec.train.grad_clip);
  // Shard full publishes the owned range densely even in a lazy step (each worker copies its
  // whole shard every step; the lazy index would serve nobody).
  s.step_all_changed = !(s.compressed && s.lazy) || s.full;
  s.publish_on_pipeline = s.sharded && s.update_on_pipeline;
  if (s.sharded) s.changed.clear();  // the publishing appends to it
  s.lr = contract::learning_rate(o, step, s.total_steps);
  s.next_bucket = 0;
  s.bytes_sent = 0;
  s.bytes_weights = 0;
  s.spans.clear();
  s.selected = 0;
  std::fill(s.grad.begin(), s.grad.end(), nullptr);
  std::fill(s.ss.begin(), s.ss.end(), 0.0);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.processed = 0;
    s.busy_s = 0;
    s.error = nullptr;
  }
  s.in_step = true;
}

void NodeOptimizer::bucket_ready(int bucket, float* node_grad) {
  Impl& s = *impl_;
  if (!s.in_step) {
    throw OptimError("NodeOptimizer::bucket_ready(" + std::to_string(bucket) +
                     "): no step in flight (call begin_step first)");
  }
  if (bucket != s.next_bucket) {
    throw OptimError("NodeOptimizer::bucket_ready(" + std::to_string(bucket) +
                     "): buckets must come in order; expected bucket " +
                     (s.next_bucket < s.nbuckets ? std::to_string(s.next_bucket)
                                                 : std::string("none (all ") +
                                                       std::to_string(s.nbuckets) + " handed over)"));
  }
  const contract::GradBucket& b = s.layout.buckets()[bucket];
  if (node_grad == nullptr && b.end > b.begin && !(s.full && !s.owns(bucket))) {
    throw OptimError("NodeOptimizer::bucket_ready(" + std::to_string(bucket) +
                     "): node_grad must not be null");
  }
  s.grad[bucket] = node_grad;
  ++s.next_bucket;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(bucket);
  }
  s.cv.notify_all();
}

StepResult NodeOptimizer::finish_step() {
  Impl& s = *impl_;
  const auto t0 = Clock::now();
  if (!s.in_step) throw OptimError("NodeOptimizer::finish_step: no step in flight");
  if (s.next_bucket != s.nbuckets) {
    throw OptimError("NodeOptimizer::finish_step: step " + std::to_string(s.step) + " got " +
                     std::to_string(s.next_bucket) + " of " + std::to_string(s.nbuckets) +
                     " buckets (bucket_ready missing)");
  }
  std::exception_ptr err;
  double busy;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.processed == s.nbuckets; });
    err = s.error;
    busy = s.busy_s;
  }
  s.in_step = false;
  if (err) {
    try {
      std::rethrow_exception(err);
    } catch (const OptimError&) {
      throw;
    } catch (const std::exception& e) {
      throw OptimError(std::string("NodeOptimizer: step ") + std::to_string(s.step) +
                       ": exchange failed: " + e.what());
    }
  }
  const auto t_update = Clock::now();
  if (s.sharded && s.exchange->nodes() > 1) {
    // Each bucket's sum of squares is its owner's; the others hold 0, so the sum over nodes is
    // exact and the bucket-order sum below has the bits of shard none.
    try {
      s.exchange->allreduce_sum(s.ss.data(), s.nbuckets);
    } catch (const std::exception& e) {
      throw OptimError("NodeOptimizer: node " + std::to_string(s.exchange->node()) + ": step " +
                       std::to_string(s.step) +
                       ": all-reduce of the buckets' sums of squares failed: " + e.what());
    }
  }
  double ss = 0;
  for (double x : s.ss) ss += x;
  const contract::ClipRule clip = contract::clip_rule(ss, s.spec.train.grad_clip);
  const bool all_changed = s.step_all_changed;
  // Shard optimizer with clipping over several nodes: the weights of the buckets updated so far
  // travel while the next ones are updated.
  const bool overlap = s.sharded && !s.update_on_pipeline && s.weights != nullptr &&
                       s.exchange->nodes() > 1;
  if (overlap) {
    s.update_and_publish(clip);
  } else if (!s.update_on_pipeline) {
    for (int b = 0; b < s.nbuckets; ++b) {
      if (s.owns(b)) s.update_bucket(b, clip.scale, clip.clipped);
    }
  }
  if (!s.sharded) {  // shard optimizer: the publishing gathers every node's changes
    s.changed.clear();
    if (!all_changed) {
      for (int b = 0; b < s.nbuckets; ++b) {
        const contract::GradBucket& bk = s.layout.buckets()[b];
        for (uint32_t off : s.sparse_idx[b]) s.changed.push_back(bk.begin + off);
      }
    }
  }
  // The new weights into the weights buffer (shard optimizer: gathered from the owners),
  // unless the pipeline sent them bucket by bucket.
  s.completed = s.step;
  if (s.weights != nullptr && !s.publish_on_pipeline && !overlap) {
    s.bytes_weights += all_changed ? s.publish_dense(0, s.nbuckets) : s.publish_lazy(0, s.nbuckets);
  }
  s.bytes_sent += s.bytes_weights;
  const double update_s = seconds_since(t_update);

  StepResult r{.step = s.step,
               .lr = s.lr,
               .grad_norm = clip.norm,
               .clipped = clip.clipped,
               .compressed = s.compressed,
               .all_changed = all_changed,
               .changed_count = all_changed ? s.total : static_cast<int64_t>(s.changed.size()),
               .selected = s.selected,
               .bytes_sent = s.bytes_sent,
               .bytes_weights = s.bytes_weights,
               .bytes_dense = 4 * s.total,
               .optimizer_s = busy + update_s};
  r.exposed_s = seconds_since(t0);
  r.exchanges = s.spans;
  return r;
}

const float* NodeOptimizer::master() const {
  return impl_->master;
}
const float* NodeOptimizer::weights() const {
  if (impl_->weights != nullptr) return impl_->weights;
  return impl_->sharded ? nullptr : impl_->master;
}
bool NodeOptimizer::sharded() const {
  return impl_->sharded;
}
int64_t NodeOptimizer::state_bytes() const {
  const Impl& s = *impl_;
  return 4 * (3 * s.state_size + (s.residual != nullptr ? s.res_size : 0));
}

void NodeOptimizer::set_weights_buffer(float* params, int64_t params_first) {
  Impl& s = *impl_;
  if (s.in_step) {
    throw OptimError("NodeOptimizer::set_weights_buffer: called during step " +
                     std::to_string(s.step));
  }
  // Only shard full publishes just its range (no gather into the rest of the buffer).
  if (params_first != 0 && !(s.full && params_first == s.range.begin)) {
    throw OptimError("NodeOptimizer::set_weights_buffer: a buffer from float " +
                     std::to_string(params_first) +
                     " needs shard full and this node's range start (" +
                     std::to_string(s.range.begin) + ")");
  }
  s.weights = params;
  s.weights_first = params_first;
}

int64_t NodeOptimizer::weights_first() const {
  return impl_->weights_first;
}

int64_t NodeOptimizer::publish_all() {
  Impl& s = *impl_;
  if (s.in_step) {
    throw OptimError("NodeOptimizer::publish_all: called during step " + std::to_string(s.step));
  }
  if (s.sharded && s.weights == nullptr) {
    throw OptimError(
        "NodeOptimizer::publish_all: parallel.shard optimizer needs a weights "
        "buffer (set_weights_buffer)");
  }
  return s.publish_dense(0, s.nbuckets);
}
const std::vector<int64_t>& NodeOptimizer::changed() const {
  return impl_->changed;
}
int64_t NodeOptimizer::step() const {
  return impl_->completed;
}
const contract::ParamLayout& NodeOptimizer::layout() const {
  return impl_->layout;
}

std::vector<StateTensor> NodeOptimizer::state_tensors() {
  Impl& s = *impl_;
  std::vector<StateTensor> out;
  const std::pair<const char*, float*> kinds[] = {
      {"master", s.master}, {"adam_m", s.m}, {"adam_v", s.v}, {"residual", s.residual}};
  for (const auto& [kind, base] : kinds) {
    if (base == nullptr) continue;
    // The top-k residual is the sender's (per node, full size) with compress_at sender; at
    // the owner (compress_at owner, shard full) it is the owner's, of its range, like the
    // master.
    const bool is_residual = base == s.residual;
    const bool per_node = is_residual && !s.at_owner;
    const int64_t first = is_residual ? s.res_begin : s.state_begin;
    for (const contract::ParamView& pv : s.layout.views()) {
      // Shard optimizer: master and moments of this node's range only; the owner's residual
      // of its range only (every shard mode).
      if (!per_node && (s.sharded || is_residual) && !s.range.contains(pv.offset)) continue;
      StateTensor t;
      t.kind = kind;
      t.param = pv.name;
      t.name = std::string(kind) + "/" + pv.name;
      t.shape = pv.shape;
      t.offset = pv.offset;
      t.data = base + pv.offset - first;
      t.size = pv.size;
      t.per_node = per_node;
      t.saved = per_node || s.range.contains(pv.offset);
      out.push_back(std::move(t));
    }
  }
  return out;
}

NodeOptimizer::StateBuffer NodeOptimizer::state_buffer(const std::string& kind) {
  Impl& s = *impl_;
  float* p = kind == "master"   ? s.master
             : kind == "adam_m" ? s.m
             : kind == "adam_v" ? s.v
             : kind == "residual" ? s.residual
                                  : throw OptimError("NodeOptimizer::state_buffer: unknown kind '" + kind + "'");
  if (p == nullptr) return {};
  if (p == s.residual) return {p, s.res_begin, s.res_begin + s.res_size};
  return {p, s.state_begin, s.state_begin + s.state_size};
}

const contract::NodeRange& NodeOptimizer::range() const {
  return impl_->range;
}

void NodeOptimizer::restore_step(int64_t completed_step) {
  Impl& s = *impl_;
  if (s.in_step) {
    throw OptimError("NodeOptimizer::restore_step: step " + std::to_string(s.step) +
                     " is in flight");
  }
  if (completed_step < 0) {
    throw OptimError("NodeOptimizer::restore_step: completed_step must be >= 0, got " +
                     std::to_string(completed_step));
  }
  s.completed = completed_step;
  s.changed.clear();
}

}  // namespace ring::optim
