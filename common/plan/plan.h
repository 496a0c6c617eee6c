// Resource plan of a job, computed from the spec alone: memory per worker and per node, bytes
// communicated per step, and whether it fits the memory the spec's resources give.
// The formulas are documented in docs/planning.md; tests check them against hand computation
// and the host-memory lines against what ringd's NodeOptimizer, StepDriver and ShmRegion
// allocate (tests/plan).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/spec/spec.h"

namespace ring::plan {

// One line of a memory budget, in bytes.
struct Item {
  std::string name;
  double bytes = 0;
  std::string formula;  // how it was computed, in the spec's symbols
};

struct GpuModel {
  spec::GpuType type;
  const char* name;
  double capacity_bytes;  // what the device reports (cudaMemGetInfo total)
};
const std::vector<GpuModel>& gpu_models();
// Bytes set aside on every GPU for the CUDA context, NCCL and library workspaces.
inline constexpr double kGpuReserveBytes = 3.0 * (1ull << 30);

// The flat parameter buffer that ringd and the workers allocate (common/contract/layout.cc, which
// tests/spec checks this against): every tensor starts at a multiple of 16 floats; one gradient
// bucket for the final norm and LM head, one per transformer block, one for the embedding.
// Computed without allocating anything; counts saturate at INT64_MAX. Needs s.resolved.
struct FlatLayout {
  int64_t elements = 0;        // floats in the flat buffer, alignment included
  int64_t largest_bucket = 0;  // floats in the largest gradient bucket
  std::string largest_bucket_name;
  // Floats of every gradient bucket in layout order: head, layers.L-1 .. layers.0, embedding
  // (the blocks all have the same size). Empty when a size saturated.
  std::vector<int64_t> bucket_sizes;
};
FlatLayout flat_layout(const spec::JobSpec& s);

// Floats of each node's range when `nodes` nodes share buckets of these sizes: the division of
// contract::shard_ranges (contiguous runs of whole buckets minimising the largest; nodes past
// the last used one own nothing), which tests/plan checks this against.
std::vector<int64_t> shard_range_sizes(const std::vector<int64_t>& bucket_sizes, int64_t nodes);
// The same division as each node's first bucket, plus bucket_sizes.size() at the end: node k
// owns buckets [first[k], first[k + 1]).
std::vector<size_t> shard_first_buckets(const std::vector<int64_t>& bucket_sizes, int64_t nodes);

// Shard full (worker/ring/full_shard.h): every rank's shard of the flat layout, on sizes alone
// (contract::worker_shards: node k's range, shard_first_buckets, cut into workers_per_node
// pieces of ceil(range / workers_per_node) floats rounded up to 16; rank g = node g /
// workers_per_node, local g % workers_per_node), and how often the model gathers each bucket in
// one forward_backward (worker/model/model.cc): the embedding before the first layer (again at
// the head with tied embeddings), every layer before its forward and again before its backward
// (a recompute reuses the block acquired for the backward), the head once. Each gather moves
// the dtype the model computes with, e bytes a value (common/cp/shard_messages.h: 2 for bf16, 4
// for fp32): rank g receives e x (size - its part) bytes of a bucket, and sends e x its part to
// each other rank; each bucket's gradient is reduce-scattered once per micro-batch, fp32: rank g
// sends 4 x (size - its part) bytes. The message sizes are shard_messages.h's, as the store's.
struct FullShardLayout {
  std::vector<int64_t> bucket_begin;  // [buckets + 1] floats, layout order (head, layers
                                      // L-1..0, embedding)
  std::vector<int64_t> shard_begin, shard_end;  // [nodes x workers_per_node]
  std::vector<int> gathers;                     // [buckets] per micro-batch
  std::vector<int> owner;                       // [buckets] the node whose range holds it
  int64_t workers_per_node = 1;
  size_t gather_elem_bytes = 4;  // e: what a gather carries a value in (model.dtype)
  int64_t ranks() const { return static_cast<int64_t>(shard_begin.size()); }
  int64_t size(size_t b) const { return bucket_begin[b + 1] - bucket_begin[b]; }
  // Floats of bucket b inside rank g's shard.
  int64_t part(size_t b, int64_t g) const;
  // Bytes of the message carrying rank q's part of bucket b in a gather / a reduce-scatter
  // (0 when the part is empty), as the store sends it.
  double gather_message_bytes(size_t b, int64_t q) const;
  double scatter_message_bytes(size_t b, int64_t q) const;
  // Bytes rank g receives in the gathers / sends in the reduce-scatters of one micro-batch.
  double gathered_bytes(int64_t g) const;
  double scattered_bytes(int64_t g) const;
};
// Empty (no buckets) when the layout's size saturates.
FullShardLayout full_shard_layout(const spec::JobSpec& s);

// ringd's top-k selection per bucket: k = ceil(density x floats), at least 1, at most floats
// (daemon/optim NodeOptimizer::bucket_k).
int64_t bucket_topk(double density, int64_t floats);

// Bytes of a shared-memory segment of n floats for `workers` gradient slots: header, params
// [n] fp32, lazy index [n] uint64, slots [workers][n] fp32, each 64-byte aligned
// (common/contract/shm.cc ShmRegion::create).
double shm_bytes(int64_t n, int64_t workers);
// ringd's dense reduce to a bucket's owner (TransportExchange::reduce_sum) goes in windows of
// this many floats per sending node, double-buffered: the owner stages at most
// 2 x (nodes - 1) x window floats (about kReduceStageBudgetBytes) whatever the bucket size.
inline constexpr int64_t kReduceStageBudgetBytes = int64_t{256} << 20;
int64_t reduce_window_floats(int64_t nodes);
// The bytes the owner of a bucket of `floats` stages in that reduce: one window per other node
// (the bucket's size when it fits in one window), two when the bucket spans several windows.
double reduce_stage_bytes(int64_t nodes, int64_t floats);
// ckpt::Options::staging_bytes: the copy-on-modify budget of ringd's checkpointer.
inline constexpr double kCheckpointStagingBytes = 16.0 * (1 << 20);

// FLOPs of one optimizer step (docs/planning.md, "FLOPs per step"). Per sequence of N =
// data.seq_len tokens: model = 6 x params x N + 6 x layers x d_model x N^2 (dense GEMMs forward
// and backward, and causal attention: half of the full 12 x layers x d_model x N^2); hardware
// adds one forward of each with model.recompute: 2 x params x N + 2 x layers x d_model x N^2;
// with recompute_policy selective only the output projection and the MLP's gate/up:
// 2 x layers x d_model x (heads x head_dim + mlp_hidden x (2 swiglu, 1 gelu)) x N.
// Sequences per step: data_replicas x micro_batches. Recompute is never model FLOPs.
struct StepFlops {
  int64_t sequences = 0;                // per step
  double dense_per_sequence = 0;        // 6 x params x N
  double attention_per_sequence = 0;    // 6 x layers x d_model x N^2
  double model_per_step = 0;
  double recompute_per_step = 0;        // 0 without model.recompute
  double hardware_per_step = 0;         // model + recompute
};
// params: the model's parameter count (Plan::params). spec valid and resolved.
StepFlops step_flops(const spec::JobSpec& s, int64_t params);

// One shard mode's totals, for the comparison `ringctl plan` prints.
struct ModeTotals {
  spec::ShardMode mode{};
  double worker_total = 0;  // per worker (GPU with backend cuda, host with cpu)
  double host_total = 0;    // per node
  bool fits_device = false;
  bool fits_host = false;
};

struct Plan {
  // Model and shapes.
  int64_t params = 0;            // total parameter count
  int64_t params_per_layer = 0;  // one transformer block
  int64_t params_embedding = 0;  // embedding (+ untied LM head)
  int64_t tokens_per_rank = 0;   // seq_len / context_ranks
  int64_t ranks = 0;             // context_ranks (ring size)
  int storage_bytes = 4;         // bytes per value of model.dtype
  StepFlops flops;               // model and hardware FLOPs per step

  // Per worker (GPU memory with backend cuda, host memory with backend cpu).
  std::vector<Item> worker;
  double worker_total = 0;
  double activations_no_recompute = 0;  // saved activations, all layers, without recompute
  double activations_recompute = 0;     // with per-layer recompute
  double activations_selective = 0;     // with recompute_policy selective
  double kv_local_per_layer = 0;        // this rank's K+V for one layer
  double kv_local_total = 0;            // this rank's K+V, all layers

  // Whole sequence.
  double kv_sequence_per_layer = 0;  // K+V of all seq_len tokens for one layer
  double kv_sequence_total = 0;      // ... for all layers

  // Sharding (parallel.shard over resources.nodes; G = nodes x workers_per_node).
  spec::ShardMode shard{};
  int64_t flat_floats = 0;     // n: the flat layout's floats, alignment gaps included
  int64_t largest_bucket = 0;  // floats
  int64_t largest_range = 0;   // floats of the largest node's range (n with shard none)
  int64_t worker_shard = 0;    // shard full: floats of the largest worker shard (its node's
                               // range cut among workers_per_node, 64-byte aligned); else n
  int64_t topk_bucket_k = 0;   // the largest bucket's k (top-k only)
  bool topk_at_owner = false;  // top-k selects at each range's owner (optimizer.compress_at
                               // owner, or shard full); false: at each sender, or no top-k
  int64_t residual_floats = 0;  // error feedback: one node's residual, the largest range at the
                                // owner (any shard mode), n at the sender; 0 without

  // Per node host memory, in three parts: ringd's own allocations, the node's shared-memory
  // segment (counted once per node, however many processes map it), and the workers' host
  // memory (all of it with backend cpu; their host-side copies with a device backend).
  std::vector<Item> host_ringd, host_shm, host_workers;
  double host_ringd_total = 0, host_shm_total = 0, host_workers_total = 0;
  std::vector<Item> host;  // the three parts in that order
  double host_total = 0;
  std::vector<Item> worker_host;  // per worker, host memory with a device backend
  double worker_host_total = 0;

  // Every shard mode's totals with the rest of the spec unchanged (offload cpu only: none
  // otherwise), in the order none, optimizer, full.
  std::vector<ModeTotals> modes;

  // Communication per step.
  int64_t head_ranks = 1;               // U: parallel.head_ranks
  int64_t ring_groups = 0;              // R = context_ranks / U: positions of the ring
  double ring_bytes_per_hop = 0;        // one K/V block (one layer) of the ring that runs
  double ring_bytes_per_step = 0;       // sent by one rank over a whole step (fwd + bwd)
  // Head-parallel attention (U > 1): what one rank sends to its group's other members per step
  // (all-to-alls of q/k/v, (o, lse), dout and the gradients; inside one node).
  double a2a_bytes_per_step = 0;
  // Ring traffic that leaves a node per step: the sum over the node's ranks whose ring
  // neighbour is on another node, the busiest node (inter-node links).
  double inter_node_ring_bytes_per_node = 0;
  // The same spec with one ring over every rank (head_ranks 1), for comparison.
  double single_ring_bytes_per_step = 0;
  double single_inter_node_ring_bytes_per_node = 0;
  double grad_payload_dense = 0;        // one node's gradient, fp32
  double grad_payload_topk = 0;         // one node's top-k (index, value) set
  double grad_sent_dense_per_node = 0;  // ring all-reduce between nodes
  double grad_sent_topk_per_node = 0;   // top-k steps, what one node sends to the others: at
                                        // the sender, its sparse sets to every other node; at
                                        // the owner (shard none, optimizer), the two below
  double grad_topk_reduce_scatter_per_node = 0;  // at the owner: the dense gradient of the
                                                 // ranges it does not own, (n - range) x 4
  double grad_topk_sparse_per_node = 0;  // at the owner, shard none: its ranges' sparse sets to
                                         // every other node, (nodes - 1) x 8 x its k
  int64_t topk_k = 0;
  // Shard full (0 otherwise), per step (every micro-batch), for the rank that moves the most
  // (FullShardLayout): the weights it receives in the block all-gathers of the forward and the
  // backward, in the model's dtype (bf16 for a bf16 spec), about 2 x (n - shard) x b, and the
  // fp32 gradient parts it sends in the reduce-scatters, about (n - shard) x 4
  // (worker/ring/full_shard.h). The nodes' ringd then exchange no gradient: the two lines
  // above are 0.
  double shard_gathered_per_rank = 0;
  double shard_scattered_per_rank = 0;

  // Fit.
  std::string device_name;  // "H100-80G" or "host"
  double device_capacity = 0;
  double device_usable = 0;
  bool fits_device = false;
  double host_capacity = 0;
  bool fits_host = false;
  bool fits() const { return fits_device && fits_host; }
};

// spec must be valid and resolved (load_spec_* does both).
Plan make_plan(const spec::JobSpec& spec);

nlohmann::json to_json(const Plan& p, const spec::JobSpec& spec);
std::string to_text(const Plan& p, const spec::JobSpec& spec);

// "16.384 GB", "512 B", "1.5 MB": decimal units (10^3 steps), as in the plan output.
std::string human_bytes(double bytes);
// "812", "50.2 K", "124 M", "6.74 B": a count with three significant digits (parameters).
std::string human_count(double n);

}  // namespace ring::plan
