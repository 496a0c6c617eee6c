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
// (one reduce-scatter in flight while the next block's gradient is written). The sum is taken in the order shard none sums the same
// gradients - per node, its workers in local-rank order, then the nodes in node order, each a
// left fold - so one node and two nodes give shard none's bits. Micro-batches: each batch's sum
// is added to the shard's gradient; after the last one, deliver(bucket, begin, end, grad) hands
// the finished part [begin, end) of each bucket (possibly empty) in bucket order.
//
// Memory per rank (floats): shard weights + shard gradient (its size each), and block buffers
// of the largest bucket each: 2 gathered blocks (in use, prefetched) and 1 block gradient,
// plus with tied embeddings 1 gathered (the embedding beside the head) and 1 gradient (the
// embedding's, held through the backward): 3 + 2 x tied buffers at the peak; plus with W > 1
// reduce-scatter buffers of one part each (this shard's part of a bucket, at most its size):
// min(2, W - 1) receive buffers, the running sum, and with several nodes a node's running sum.
// All of that is host memory: the transfers take host buffers.
//
// A device backend (`stage`, e.g. CUDA): the model's blocks must live in its memory, so the
// store stages them. A gathered block is copied to a device buffer when the model acquires it
// (the host buffer is free again at once), and a block gradient is written by the model into a
// zeroed device buffer and copied back to a host buffer when done, before its reduce-scatter.
// The backend's copies are ordered after the kernels already queued (the CUDA backend copies on
// its compute stream and waits), so a released device buffer is never overwritten while a kernel
// still reads it. Device memory at the peak: the blocks in use and the gradient being written,
// 2 + 2 x tied buffers of the largest bucket; host memory as above.
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
  // not host memory (blocks are staged through it, see above); null for the CPU backend. Throws
  // std::invalid_argument on inconsistent arguments.
  FullShardStore(const contract::ParamLayout& layout, std::vector<contract::WorkerShard> shards,
                 int rank, int workers_per_node, ProgressEngine* engine, int timeout_ms,
                 kernels::Backend* stage = nullptr);
  ~FullShardStore() override;

  const contract::WorkerShard& shard() const { return shards_[rank_]; }
  // This rank's weights [shard().size()], to fill before each step.
  float* shard_weights() { return weights_.data(); }

  // Before each forward_backward: whether this is the step's first and last micro-batch, and
  // where the finished gradients go (used when last).
  void begin_batch(bool first, bool last, DeliverFn deliver);

  const ShardStats& stats() const { return stats_; }

  const float* acquire(int b, int next) override;
  void release(int b) override;
  float* grads(int b) override;
  void grads_done(int b) override;
  void end_pass() override;

 private:
  struct Gather {
    int bucket = -1;
    std::vector<float>* buf = nullptr;
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
  // A block handed to the model: its host buffer, or with staging its device buffer.
  struct Block {
    int bucket = -1;
    std::vector<float>* host = nullptr;
    float* dev = nullptr;
    float* data() const { return dev ? dev : host->data(); }
  };
  // Receives of a reduce-scatter in flight at once: the parts arrive into a window of buffers
  // and are summed in rank order as they come, so a rank holds 2 + kWindow parts, not W.
  static constexpr int kWindow = 2;
  std::vector<float>* take_buffer();
  void give_back(std::vector<float>* buf);
  float* take_device_buffer();
  void give_back(const Block& b);
  void check(kernels::Status st, const char* what, int b) const;
  // The part of bucket b inside rank q's shard: [lo, hi) (empty: lo == hi).
  std::pair<int64_t, int64_t> part(int b, int q) const;
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
  std::vector<float> weights_, grad_;  // [shard size]
  std::vector<std::unique_ptr<std::vector<float>>> pool_;  // every block buffer
  std::vector<std::vector<float>*> free_;
  std::deque<Gather> gathers_;                 // posted, not yet acquired (or acquired: held)
  std::vector<Block> held_;                    // acquired weights
  std::vector<Block> grads_;                   // handed-out block gradients
  kernels::Backend* stage_ = nullptr;
  std::vector<std::unique_ptr<model::DeviceArray<float>>> dev_pool_;  // staging: every buffer
  std::vector<float*> dev_free_;
  std::deque<Scatter> scatters_;               // reduce-scatters in flight, bucket order
  std::vector<std::vector<float>> window_;     // [kWindow] receive buffers [largest part]
  std::vector<float> sum_, node_sum_;          // [largest part]: the running sums
  bool first_ = true, last_ = true;
  DeliverFn deliver_;
  ShardStats stats_;
};

}  // namespace ring::cp
