// parallel.shard full on one rank: the model's BlockStore over the job's W ranks (one flat group
// of data replicas x context ranks, as TorchTitan's dp_shard_cp).
//
// Rank g keeps only its shard [begin, end) of the flat layout (contract::worker_shards: its
// node's range cut among the node's workers), copied from ringd's segment each step. A block
// (a gradient bucket: head, one layer, the embedding) is all-gathered just before the model uses
// it: every rank sends the part of the block inside its shard to every other rank, point to
// point on the all-rank communicator's progress engine (world_progress), so the gather of the
// NEXT block (acquire's `next`) runs while the current one computes; the buffer is handed back
// at release. A block's gradient, once the backward has finished it (grads_done), is
// reduce-scattered the same way: each rank sends every other rank the part of the block inside
// that rank's shard, and sums what it receives while the backward goes on with the next block
// (one reduce-scatter in flight while the next block's gradient is written). The sum is taken in
// the order shard none sums the same gradients - per node, its workers in local-rank order, then
// the nodes in node order, each a left fold - so one node and two nodes give shard none's bits.
// Micro-batches: each batch's sum is added to the shard's gradient; after the last one,
// deliver(bucket, begin, end, grad) hands the finished part [begin, end) of each bucket
// (possibly empty) in bucket order.
//
// What travels (common/cp/shard_messages.h, the sizes `ringctl plan` and `simulate` count):
// with `gather` bf16 (a bf16 model, docs/precision.md) each rank rounds its fp32 shard to bf16
// once per step as it takes it (set_shard_weights; the one rounding, common/numeric/bf16.h: the value the model would round the
// block to) and the gathers carry 2 bytes a value; the model takes the block as bf16
// (acquire_bf16) and widens it into its slot, so the loss and gradients are those of an fp32
// gather, bit for bit. The reduce-scatters carry fp32 and sum in fp32 whatever the dtype: the
// fixed left fold in shard none's order is what makes shard full's gradient the bits of shard
// none's (ringd sums fp32 slots in that order), and a bf16 part would round every rank's
// gradient before the sum.
//
// Memory per rank: the shard's weights (as the gathers carry them: fp32, or bf16 only) and
// gradient (fp32), and block buffers of the largest bucket each: 2 gathered blocks
// (in use, prefetched) at the gather's element size (4 or 2 bytes) and 1 block gradient (fp32),
// plus with tied embeddings 1 gathered block (the embedding beside the head) and 1 gradient (the
// embedding's, held through the backward): 2 + tied gathered and 1 + tied gradient buffers at
// the peak; plus with W > 1 reduce-scatter buffers of one part each (this shard's part of a
// bucket, at most its size, fp32): min(2, W - 1) receive buffers, the running sum, and with
// several nodes a node's running sum. All of that is host memory: the transfers take host
// buffers. (A bf16 model also holds its own fp32 + bf16 copy of each block it uses: model.h.)
//
// A device backend (`stage`, e.g. CUDA): the model's blocks must live in its memory, so the
// store stages them. A gathered block is copied to a device buffer (of the gather's dtype) when
// the model acquires it (the host buffer is free again at once), and a block gradient is written
// by the model into a zeroed device buffer and copied back to a host buffer when done, before
// its reduce-scatter. The backend's copies are ordered after the kernels already queued (the
// CUDA backend copies on its compute stream and waits), so a released device buffer is never
// overwritten while a kernel still reads it. Device memory at the peak: the blocks in use (1 +
// tied, at the gather's element size) and the gradients being written (1 + tied, fp32); host
// memory as above.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "kernels/backend.h"
#include "worker/model/buffer.h"
#include "worker/model/model.h"
#include "worker/ring/progress.h"

namespace ring::cp {

// How long each rank spent in the gathers and reduce-scatters of a pass, and how much of it was
// spent waiting (not hidden behind compute).
struct ShardStats {
  int64_t gathers = 0, scatters = 0;
  double gather_wait_s = 0;   // acquire() blocked on a gather
  double scatter_wait_s = 0;  // blocked on a reduce-scatter (buffer reuse, end of the pass)
  // In flight: from posting a gather (reduce-scatter) to the completion of its last transfer,
  // as the progress engine saw it (so at most a progress round late). hidden = in flight -
  // waited: the transfer time the compute covered.
  double gather_flight_s = 0, scatter_flight_s = 0;
  // Bytes this rank posted to other ranks (common/cp/shard_messages.h): bytes_sent is the sum.
  int64_t gather_bytes_sent = 0, scatter_bytes_sent = 0;
  int64_t bytes_sent = 0;
};

class FullShardStore final : public model::BlockStore {
 public:
  // deliver(bucket, begin, end, grad): the job's summed gradient of floats [begin, end) (this
  // rank's part of the bucket) at grad[0 .. end-begin); called in bucket order in the last
  // micro-batch only.
  using DeliverFn = std::function<void(int bucket, int64_t begin, int64_t end, const float* grad)>;

  // shards: every rank's (worker_shards), rank: this rank g, workers_per_node: to sum in shard
  // none's order. engine: the progress engine of a communicator of all W ranks, rank g = its
  // rank there (its transport takes host buffers). stage: the model's backend when its memory is
  // not host memory (blocks are staged through it, see above); null for the CPU backend.
  // gather: the dtype the weight gathers carry, kF32 (acquire) or kBF16 (acquire_bf16; for a
  // model of dtype bf16 only, which rounds its blocks to bf16 anyway), the same on every rank.
  // Throws std::invalid_argument on inconsistent arguments.
  FullShardStore(const contract::ParamLayout& layout, std::vector<contract::WorkerShard> shards,
                 int rank, int workers_per_node, ProgressEngine* engine, int timeout_ms,
                 kernels::Backend* stage = nullptr, kernels::DType gather = kernels::DType::kF32);
  ~FullShardStore() override;

  const contract::WorkerShard& shard() const { return shards_[rank_]; }
  // This rank's weights for the step, w[0 .. shard().size()), fp32 (ringd's master): copied, or
  // with a bf16 gather rounded to bf16 here, once (the one rounding), and only that kept.
  void set_shard_weights(const float* w);
  kernels::DType gather_dtype() const { return gather_; }

  // Before each forward_backward: whether this is the step's first and last micro-batch, and
  // where the finished gradients go (used when last).
  void begin_batch(bool first, bool last, DeliverFn deliver);

  const ShardStats& stats() const { return stats_; }

  // acquire: an fp32 gather's block (a bf16 gather's throws std::logic_error); acquire_bf16: a
  // bf16 gather's block, or null (nothing acquired) with an fp32 gather.
  const float* acquire(int b, int next) override;
  const uint16_t* acquire_bf16(int b, int next) override;
  void release(int b) override;
  float* grads(int b) override;
  void grads_done(int b) override;
  void end_pass() override;

 private:
  // Host buffers of one element type, [largest bucket] each, kept for the store's life.
  template <typename T>
  struct Pool {
    std::vector<std::unique_ptr<std::vector<T>>> all;
    std::vector<std::vector<T>*> free;
    std::vector<T>* take(int64_t size);
    void give_back(std::vector<T>* b) { free.push_back(b); }
  };
  // A gathered block in host memory: fp32 or bf16 values, as the gather carries them.
  struct HostBlock {
    std::vector<float>* f32 = nullptr;
    std::vector<uint16_t>* bf16 = nullptr;
    void* data() const { return f32 ? static_cast<void*>(f32->data()) : bf16->data(); }
  };
  struct Gather {
    int bucket = -1;
    HostBlock buf;
    std::vector<int> handles;
    ProgressEngine::Clock::time_point posted{};
  };
  struct Scatter {
    int bucket = -1;
    std::vector<float>* buf = nullptr;  // the block gradient (sent from)
    std::vector<int> sends;
    std::vector<int> from;              // the other ranks, ascending: the receive order
    size_t posted = 0;                  // receives posted so far (from[0 .. posted))
    std::vector<int> handle;            // [kWindow]: the receive in each window buffer
    ProgressEngine::Clock::time_point posted_at{}, last_done{};
  };
  // A block handed to the model: its host buffer (weights: HostBlock; a gradient: grad), or with
  // staging its device buffer (dev: float or uint16_t, as the gather carries a block).
  struct Block {
    int bucket = -1;
    HostBlock host;
    std::vector<float>* grad = nullptr;
    void* dev = nullptr;
    void* data() const { return dev ? dev : grad ? grad->data() : host.data(); }
  };
  // Receives of a reduce-scatter in flight at once: the parts arrive into a window of buffers
  // and are summed in rank order as they come, so a rank holds 2 + kWindow parts, not W.
  static constexpr int kWindow = 2;
  size_t gather_elem() const;  // bytes of a value a gather carries
  HostBlock take_block();
  void give_back(const HostBlock& h);
  void* take_device_buffer(bool bf16);
  void give_back(const Block& b);
  void check(kernels::Status st, const char* what, int b) const;
  // The part of bucket b inside rank q's shard: [lo, hi) (empty: lo == hi).
  std::pair<int64_t, int64_t> part(int b, int q) const;
  const void* acquire_block(int b, int next);
  void start_gather(int b);
  void finish_gather(Gather& g);
  void start_scatter(int b, std::vector<float>* buf);
  void finish_scatter(Scatter& s);
  // Waits for a request; returns when it completed (the engine's done_at).
  ProgressEngine::Clock::time_point wait(int handle, const char* what, int peer, int b);

  contract::ParamLayout layout_;
  std::vector<contract::WorkerShard> shards_;
  int rank_, world_, per_node_;
  ProgressEngine* engine_;
  int timeout_ms_;
  int64_t max_bucket_ = 0;
  std::vector<float> weights_;          // [shard size] with an fp32 gather
  std::vector<uint16_t> weights_bf16_;  // [shard size] with a bf16 gather
  std::vector<float> grad_;             // [shard size]
  Pool<float> pool_;                    // block gradients, fp32 gathered blocks
  Pool<uint16_t> pool_bf16_;            // bf16 gathered blocks
  std::deque<Gather> gathers_;                 // posted, not yet acquired (or acquired: held)
  std::vector<Block> held_;                    // acquired weights
  std::vector<Block> grads_;                   // handed-out block gradients
  kernels::Backend* stage_ = nullptr;
  kernels::DType gather_ = kernels::DType::kF32;
  // Staging: every device buffer, [largest bucket] of floats or of bf16, and the free ones.
  std::vector<std::unique_ptr<model::DeviceArray<float>>> dev_pool_;
  std::vector<std::unique_ptr<model::DeviceArray<uint16_t>>> dev_pool_bf16_;
  std::vector<void*> dev_free_, dev_free_bf16_;
  std::deque<Scatter> scatters_;               // reduce-scatters in flight, bucket order
  std::vector<std::vector<float>> window_;     // [kWindow] receive buffers [largest part]
  std::vector<float> sum_, node_sum_;          // [largest part]: the running sums
  bool first_ = true, last_ = true;
  DeliverFn deliver_;
  ShardStats stats_;
};

}  // namespace ring::cp
