// The optimizer that ringd owns in host memory: fp32 master weights and AdamW moments
// (of the whole model, or with parallel.shard optimizer of this node's range only), the top-k
// residual, the gradient exchange between node daemons, global gradient-norm clipping and the
// update, overlapped with the workers' backward bucket by bucket.
//
//   ring::optim::LocalExchange one_node;                      // or ringd's transport exchange
//   NodeOptimizer opt(spec, layout, total_steps, threads, &one_node);
//   opt.set_weights_buffer(workers_params);                   // [layout.total()] fp32
//   opt.init_master(initial_params);                          // [layout.total()] fp32
//   opt.publish_all();                                        // every weight into the buffer
//   for (int64_t step = 1; step <= total_steps; ++step) {
//     opt.begin_step(step);
//     for (const auto& b : layout.buckets())                  // backward completion order
//       opt.bucket_ready(b.index, node_grad + b.begin);       // as each bucket completes
//     StepResult r = opt.finish_step();                       // waits; new weights in the buffer
//     // dense: every coordinate changed; lazy: only opt.changed() coordinates
//   }
//
// Math (the rule of common/contract/optimizer_rule.h, which the in-worker Trainer applies too, so
// an offloaded run reproduces the in-worker optimizer): the gradient g of step s (1-based) is the
// sum over nodes of each node's gradient; norm = ||g||_2 over the whole flat buffer (fp64 sum of
// squares); contract::clip_rule: with train.grad_clip c > 0 and norm > c, g *= float(c / (norm +
// 1e-6)); lr = contract::learning_rate(optimizer, s, total_steps); then Backend::adamw_step on
// each parameter tensor (ParamView) with contract::adamw_params (weight decay 0 where
// ParamView::decay is false). StepResult::grad_norm is the norm before clipping.
//
// Compression (optimizer.compression: topk), after optimizer.warmup_steps dense steps (steps
// s <= warmup_steps are dense): per bucket, acc = residual + g (error feedback) or g; the
// k = ceil(density * bucket floats) entries of largest |acc| (exact selection, kernels
// topk_abs: sampled threshold + one exact pass) are selected, entries equal to 0 dropped;
// residual = acc with the selected entries zeroed. Where this runs is optimizer.compress_at:
//   - owner (the default; shard full always): g is the job's gradient of the bucket, summed at
//     the owner of its range (contract::shard_ranges, bucket_owner): Exchange::reduce_sum in
//     node order (shard full: the workers' reduce-scatter did it). Only the owner selects, with
//     the residual of its range (range().size() floats, saved by the owner like the master).
//     Shard none then all-gathers the owner's sparse set (the others contribute an empty one),
//     so every node applies the same sparse gradient to its full state; shard optimizer and full
//     keep it at the owner, which updates the range and publishes it as below. The result is
//     the same for every node count and shard mode (bit for bit in process, where a sum is a
//     left fold in node order: one node fed the same sum gives the same bits), and a checkpoint
//     reshards exactly.
//   - sender: g is this node's gradient and every node selects with its own full-size residual
//     (layout.total() floats, saved per node); nodes exchange their (index, value) sets with
//     Exchange::allgather (shard optimizer: gather to the owner) and sum them in node order
//     (left fold from node 0) at each index. Only k pairs per node cross nodes, but the result
//     depends on the node count (and a resume on another one is approximate).
// All nodes hold bit-identical gradients, norms and master weights. The sparse gradient is
// then clipped as above and
//   - optimizer.update dense: applied by dense AdamW (zeros elsewhere: every coordinate moves
//     through its moments and weight decay);
//   - optimizer.update lazy: AdamW only at the union of the sent indices (same formula and
//     bias correction with the global step); the others, and their moments, stay untouched.
//     changed() lists exactly those coordinates.
//
// Overlap: bucket_ready() only queues the bucket; one pipeline thread takes buckets in order and,
// while the caller goes on, exchanges them (all-reduce dense, all-gather sparse), compresses
// them and sums their squares. The update needs the global norm when clipping can trigger
// (grad_clip > 0): then AdamW runs in finish_step over all buckets. With grad_clip = 0 every
// bucket is updated on the pipeline thread as soon as it is exchanged, so only the last
// bucket's work is exposed. StepResult says how much optimizer time was hidden.
//
// parallel.shard optimizer: node k owns the contiguous, bucket-aligned range
// contract::shard_ranges(layout, nodes)[k] (range()) and keeps master weights and moments of that
// range only (3 x range().size() floats), and the residual of its range (compress_at owner) or
// a full-size one (sender). Per bucket b with owner o = bucket_owner(ranges, b): dense, and
// top-k at the owner, the gradient is reduced to o (Exchange::reduce_sum, node order) and o
// selects; top-k at the sender, every node compresses as above and sends its sparse set to o
// only (Exchange::gather), which merges them in node order.
// Only o has the bucket's sum of squares (the others count 0); finish_step all-reduces the
// per-bucket sums (exact: one non-zero term each) and adds them in bucket order, so the norm has
// the bits of shard none. Only o updates the bucket. The new weights then reach every node's
// weights buffer: dense, an all-gather of the owned master ranges (Exchange::allgather_spans,
// straight into the buffer); lazy, an all-gather of the (offset, value) pairs each owner changed
// (uint32 offset in its bucket, a count per bucket), so changed() lists every node's changes. With
// the in-process exchange (sums in node order) the weights and norms are bit-identical to shard
// none for any node count; over the transport with two nodes too (a + b == b + a).
//
// parallel.shard full: ranges, state and checkpoints as shard optimizer, but the node gradient
// of range() is already the job's sum (the workers reduce-scattered it): no gradient reduce,
// no gather of sparse sets and no weight all-gather between nodes (only the per-bucket sums of
// squares are all-reduced, exact as above). Top-k selects at the owner from the summed gradient
// with a residual of range() (saved by the owner, not per node). Every step publishes the range
// densely into the weights buffer, which may hold the range alone (set_weights_buffer's
// params_first); a lazy step applies AdamW at the selected coordinates only.
//
// With grad_clip 0 the owner updates a bucket on the pipeline thread as soon as it has its sum
// and sends its new weights at once (the same gathers, per bucket), so they travel during the
// backward like the gradients; with clipping the update waits for the norm, and in finish_step
// the weights of the buckets updated so far are gathered (bucket by bucket, by a helper thread)
// while the owner updates the next ones. (The weights buffer may be written during a step: the
// workers copy it when the step starts, before any of their gradients can arrive.)
//
// Per step, a node sends: dense, 4 bytes x the floats of the buckets it does not own, plus
// 4 x range().size() to each other node; top-k at the sender, its sparse sets of the buckets it
// does not own; top-k at the owner, 4 bytes x the floats of the buckets it does not own (shard
// none: plus its sparse sets of the buckets it owns, to every other node); shard optimizer then
// (lazy) 8 bytes per coordinate it changed and 4 per bucket it owns, to each other node (dense
// update: its range).
//
// Threads: `threads` OpenMP threads (0: all cores) run every heavy loop (AdamW, top-k, sums)
// inside each bucket; buckets are processed in order by one pipeline thread, which is also the
// only thread that calls the Exchange until every bucket is through; then finish_step calls it
// from the caller's thread (the norm, the weights) or, overlapping the update with the weight
// gather, from one helper thread. Not thread-safe: one caller drives a NodeOptimizer
// (begin_step, bucket_ready..., finish_step).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "common/spec/spec.h"

namespace ring::optim {

// Bad arguments or calls out of order (the message names the argument, bucket or step and the
// rule broken), a kernel failure, or an Exchange failure (its message is kept).
class OptimError : public std::runtime_error {
 public:
  explicit OptimError(const std::string& message) : std::runtime_error(message) {}
};

// The collectives between the node daemons of one job. Every node calls the same methods in the
// same order (NodeOptimizer does so from one thread per node). Implementations report failure by
// throwing (any std::exception; NodeOptimizer rethrows it as OptimError from finish_step) and
// never wait without a deadline.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int node() const = 0;   // this node, 0 .. nodes()-1
  virtual int nodes() const = 0;  // >= 1
  // In place: x[i] = sum over nodes of their x[i]. Every node gets identical bits.
  virtual void allreduce_sum(float* x, int64_t n) = 0;
  virtual void allreduce_sum(double* x, int64_t n) = 0;
  // Each node contributes `bytes` bytes (the count may differ by node); returns every node's
  // contribution, indexed by node (this node's own included).
  virtual std::vector<std::vector<uint8_t>> allgather(const void* data, int64_t bytes) = 0;

  // The collectives of parallel.shard optimizer, where one node owns each bucket. The defaults
  // express them with the three above (correct, not economical); the exchanges of this project
  // override them with point-to-point traffic.
  //
  // Reduce to `root`: root's x[i] = sum over nodes of their x[i], a left fold in node order
  // (node 0 first); the other nodes' x is unspecified afterwards.
  virtual void reduce_sum(float* x, int64_t n, int root);
  // Each node sends `bytes` bytes (the count may differ by node) to `root`: root gets every
  // node's contribution indexed by node (its own included), the others an empty vector.
  virtual std::vector<std::vector<uint8_t>> gather(const void* data, int64_t bytes, int root);
  // All-gather of disjoint spans in place: `offsets` has nodes() + 1 ascending entries and node k
  // owns x[offsets[k] .. offsets[k+1]); on entry each node's own span holds its data, on return
  // every node's x holds every span (x outside [offsets[0], offsets[nodes()]) is not touched).
  virtual void allgather_spans(float* x, const std::vector<int64_t>& offsets);
};

// One node: sums are the identity and allgather returns the node's own bytes.
class LocalExchange final : public Exchange {
 public:
  int node() const override { return 0; }
  int nodes() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  std::vector<std::vector<uint8_t>> allgather(const void* data, int64_t bytes) override;
  void reduce_sum(float*, int64_t, int) override {}
  std::vector<std::vector<uint8_t>> gather(const void* data, int64_t bytes, int) override {
    return allgather(data, bytes);
  }
  void allgather_spans(float*, const std::vector<int64_t>&) override {}
};

// Several nodes in one process (tests, benchmarks): endpoint(i) is node i's Exchange, to be
// driven from its own thread. Sums are left folds in node order (node 0 first), so every node
// gets identical bits. A collective waits for all nodes at most `timeout_s` seconds, then throws
// OptimError naming the nodes that did not arrive.
class InProcessExchange {
 public:
  explicit InProcessExchange(int nodes, double timeout_s = 60.0);
  ~InProcessExchange();
  InProcessExchange(const InProcessExchange&) = delete;
  InProcessExchange& operator=(const InProcessExchange&) = delete;
  Exchange* endpoint(int node);
  int nodes() const;

 private:
  struct Shared;
  class Endpoint;
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

// One exchange of a bucket between nodes (reduce, all-reduce or all-gather), on the steady
// clock: ringd's timeline shows them.
struct ExchangeSpan {
  int bucket = 0;
  std::chrono::steady_clock::time_point begin, end;
};

struct StepResult {
  int64_t step = 0;          // the 1-based step just taken
  double lr = 0;             // learning rate used
  double grad_norm = 0;      // global L2 norm of the applied (summed, compressed) gradient, before clipping
  bool clipped = false;      // grad_clip > 0 and grad_norm > grad_clip
  bool compressed = false;   // top-k this step (false: dense, e.g. during warm-up)
  bool all_changed = true;   // every coordinate may have changed (dense update); false: lazy,
                             // exactly NodeOptimizer::changed() changed
  int64_t changed_count = 0;   // coordinates updated (layout.total() when all_changed)
  int64_t selected = 0;        // entries this node selected (top-k: at the sender, what it
                               // sent; at the owner, of its range's buckets), or
                               // layout.total() (dense)
  int64_t bytes_sent = 0;      // payload this node contributed to the exchange this step: 4 per
                               // float dense, 8 per (uint32 index, float value) sparse, plus a
                               // 4-byte count per bucket; shard none: counted also with one node;
                               // shard optimizer: what leaves this node (to the buckets' owners,
                               // and bytes_weights), 0 with one node; top-k at the owner: 4 per
                               // float of the buckets it does not own (reduced to their owners)
                               // plus, shard none, its payload of each bucket's all-gather
  int64_t bytes_weights = 0;   // shard optimizer: of bytes_sent, this node's part of the weight
                               // all-gather (its range, or its changed (uint32 offset, float)
                               // pairs, to each other node); 0 with shard none
  int64_t bytes_dense = 0;     // what a dense exchange of the same gradient sends (4 x total)
  double optimizer_s = 0;      // seconds of optimizer work this step (exchange waits included):
                               // pipeline busy time + update time in finish_step
  double exposed_s = 0;        // seconds finish_step took (what the caller waited)
  std::vector<ExchangeSpan> exchanges;  // the step's bucket exchanges between nodes
  double hidden_fraction() const {  // share of optimizer_s overlapped with the caller's work
    return optimizer_s > 0 ? std::max(0.0, 1.0 - exposed_s / optimizer_s) : 0.0;
  }
};

// A named state tensor of the optimizer, for checkpoints: one per parameter (ParamView) and kind.
// Write the `saved` ones out as they are; to restore, fill `data` (size floats) of each and call
// restore_step(). Checkpoints name every tensor, so a reader needs no knowledge of the flat layout
// and a job resumes on another node count or shard mode (docs/checkpoints.md).
struct StateTensor {
  std::string name;            // kind + "/" + param: "master/layers.0.attn.wq"
  std::string kind;            // "master", "adam_m", "adam_v", "residual" (top-k with error feedback)
  std::string param;           // the parameter (contract::ParamView::name)
  std::vector<int64_t> shape;  // the parameter's shape
  int64_t offset = 0;          // the parameter's offset in the flat layout (floats)
  float* data = nullptr;
  int64_t size = 0;            // floats (product of shape)
  // residual with compress_at sender: every node has its own (the error feedback of what that
  // node sent), saved by each node; the others (the residual at the owner included) have one
  // owner in the job (contract::shard_ranges).
  bool per_node = false;
  // This node writes it into its checkpoint shard: the tensors of its range (range()) and its
  // per-node ones. With shard none a node holds every tensor but saves only its range's.
  bool saved = true;
};

class NodeOptimizer {
 public:
  // spec: validated. layout: the model's flat layout (copied). total_steps: the lr schedule's
  // horizon (>= 1). threads: >= 0 (0: all cores). exchange: not null, outlives this object.
  // Allocates 3 x layout.total() floats (shard optimizer: 3 x range().size()), plus a residual
  // (top-k with error feedback) of range().size() floats at the owner, layout.total() at the
  // sender. Throws OptimError (compress_at sender with shard full, among others).
  NodeOptimizer(const spec::JobSpec& spec, const contract::ParamLayout& layout, int64_t total_steps,
                int threads, Exchange* exchange);
  ~NodeOptimizer();
  NodeOptimizer(const NodeOptimizer&) = delete;
  NodeOptimizer& operator=(const NodeOptimizer&) = delete;

  // Master weights = params [layout.total()] (shard optimizer: its range() part only); moments
  // and residual zero; step() = 0.
  // params_first: the flat offset of params[0] (shard full passes its range, params_first =
  // range().begin); params must cover what the node keeps.
  void init_master(const float* params, int64_t params_first = 0);

  // Where the full weights [layout.total()] fp32 go (not owned; e.g. the shared memory the
  // workers read): every finish_step writes the new weights into it (dense: all of them; lazy:
  // the changed() coordinates), so the caller publishes them without a copy. Required with shard
  // optimizer (where they are gathered from the owners) before publish_all or a step; optional
  // with shard none. Set the same way on every node.
  // params_first: the flat offset of params[0]; shard full, whose workers read only the
  // node's range, takes a buffer of range() alone (params_first = range().begin).
  void set_weights_buffer(float* params, int64_t params_first = 0);
  int64_t weights_first() const;  // params_first of the weights buffer
  // Collective (every node, between steps): every coordinate of the current weights into the
  // weights buffer, as the first step of an attempt needs after init_master or a restore.
  // Returns the bytes this node sent (shard optimizer: its range to each other node).
  int64_t publish_all();

  // Starts step `step` (1-based); step == step() + 1, else OptimError.
  void begin_step(int64_t step);
  // The node's gradient of bucket `bucket` (summed over the node's workers and normalised, as
  // the in-worker Trainer would use it): node_grad[0 .. end-begin) of layout.buckets()[bucket].
  // Buckets must come in index order 0, 1, ..., each once. The optimizer uses node_grad as
  // scratch: it may overwrite it, and the caller must keep it alive and not touch it until
  // finish_step() returns. Returns at once (the work runs on the pipeline thread). Shard full:
  // node_grad is read for the buckets of range() only and may be null for the others.
  void bucket_ready(int bucket, float* node_grad);
  // Waits for the step's work and applies the update; all buckets must have been handed over.
  // Rethrows a pipeline or exchange failure as OptimError: the state is then undefined until
  // restored from a checkpoint.
  StepResult finish_step();

  // fp32 master weights this node keeps: [layout.total()] with shard none; with shard optimizer
  // range().size() floats, master()[i] being flat offset range().begin + i.
  const float* master() const;
  // The full weights after the last step [layout.total()]: the weights buffer when one is set,
  // else (shard none) master(); null with shard optimizer and no buffer.
  const float* weights() const;
  // Whether parallel.shard optimizer is on (the state of range() only).
  bool sharded() const;
  // Bytes of optimizer state this node holds (master, moments, residual).
  int64_t state_bytes() const;
  // Lazy steps: ascending flat indices of the coordinates the last step changed, on every node
  // (empty after a dense step, where every coordinate did; see StepResult::all_changed).
  const std::vector<int64_t>& changed() const;
  // Last completed step (0 before the first).
  int64_t step() const;
  const contract::ParamLayout& layout() const;

  // Checkpoint state: every tensor this node holds (the load targets), kinds in the order
  // master, adam_m, adam_v, residual and parameters in layout order within each; the data
  // pointers stay valid for the object's life. Shard optimizer: master, adam_m and adam_v of the
  // parameters in range() only (all saved). The residual: of the parameters in range() (at the
  // owner, every shard mode) or every residual tensor (per node, at the sender).
  std::vector<StateTensor> state_tensors();
  // This node's range of the layout (contract::shard_ranges over the exchange's nodes): what it
  // saves in checkpoints and, with parallel.shard optimizer, the only part of the state it keeps.
  const contract::NodeRange& range() const;
  // One kind's whole buffer ("master", "adam_m", "adam_v", "residual"): data[i] is flat offset
  // begin + i, for i < end - begin (alignment gaps included): [0, layout.total()), or with shard
  // optimizer range() for master and moments, and range() for the residual at the owner. data is
  // null for a kind this optimizer does not keep (residual without error feedback).
  struct StateBuffer {
    float* data = nullptr;
    int64_t begin = 0, end = 0;
  };
  StateBuffer state_buffer(const std::string& kind);
  // After filling the state tensors from a checkpoint: the next step is completed_step + 1.
  void restore_step(int64_t completed_step);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ring::optim
