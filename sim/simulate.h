// One training step of a spec on a simulated cluster (`ringctl simulate`).
//
//   sim::SimOptions o;                       // topology, rates, what-ifs
//   o.cluster.shape = sim::Shape::kFatTree;
//   o.rates = sim::preset_rates("H100");
//   sim::SimResult r = sim::simulate(spec, o);
//   std::cout << sim::to_text(r);
//
// The step is a task graph in the discrete-event engine (sim/engine.h): per rank and layer the
// projections, P attention blocks with the K/V hops of the ring between them (double-buffered:
// the hop of step s runs while block s is computed; step s+1 starts when block s, the incoming
// and the outgoing hop are done), the backward's K/V hops and dK/dV accumulators one hop behind,
// the LM head; then per gradient bucket, as soon as its layer's backward is done, the node
// gradient exchange and ringd's AdamW; the checkpoint amortised over its interval. With
// parallel.shard full: each block's all-gather before its use (prefetched one block ahead) and
// its gradient's reduce-scatter, point to point over all ranks, and no node exchange.
//
// Symmetry: every rank's hops are sized by one max-min solve of the whole job's ring traffic
// (all rings at once, so rings that share links slow each other down). When the ring's hop
// times, compute and sends repeat with a period g (g = the node's GPU count, or two nodes with
// the topology order's alternating local paths), only g positions of one ring are simulated,
// standing for all; the ring simulated is the slowest (or the one a straggler sits in). Small
// jobs are simulated in full instead, every rank of every ring, flows on the real links with
// fairness recomputed as they start and end (expand: auto picks by size).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/spec/spec.h"
#include "sim/cluster.h"
#include "sim/rates.h"
#include "sim/workload.h"

namespace ring::sim {

enum class RingOrderChoice { kSpec, kNatural, kTopology };
enum class Expand { kAuto, kFull, kReduced };

struct Straggler {
  int64_t rank = 0;     // global rank
  double factor = 1;    // its compute takes factor x as long
};
struct SlowLink {
  int64_t node = 0;     // job node index: every NIC link of the node
  double factor = 1;    // bandwidth / factor
};

struct SimOptions {
  ClusterOptions cluster;  // shape, bandwidths; nodes: at least the job's
  Rates rates;
  RingOrderChoice ring_order = RingOrderChoice::kSpec;
  std::optional<int64_t> stagger_us;  // overrides parallel.stagger_us
  std::vector<Straggler> stragglers;
  std::vector<SlowLink> slow_links;
  Expand expand = Expand::kAuto;
  int64_t full_task_limit = 3'000'000;  // expand auto: full simulation up to this many tasks
  bool keep_trace = false;              // keep every task for write_trace
  // A deeper task graph than this is folded: two depths are simulated and the step extended
  // linearly in the layer count (layers are alike). Bounds memory (about 150 bytes a task).
  int64_t fold_task_budget = 6'000'000;
};

struct HopStats {
  int64_t count = 0;
  double bytes = 0;            // per hop (largest)
  double mean_s = 0, min_s = 0, max_s = 0;  // the flow: both sides posted to delivered
  // From the sender's post to delivery, as the worker's timeline records a ring_send (includes
  // waiting for the receiver to post): K/V hops posted at the sender's step start, dK/dV
  // accumulators once the block's partial and the incoming accumulator are in
  double posted_mean_s = 0, posted_median_s = 0;
};

struct PhaseTime {
  std::string name;
  double seconds = 0;
};

struct SimResult {
  std::string cluster;         // description
  std::string rates_source;
  std::string mode;            // "full" or "reduced (g of P positions, ring r of D)"
  std::string ring_order;      // "natural" / "topology (tree-dfs)" ...
  std::vector<int64_t> ring_nodes;  // one ring of one rank per node: its job nodes in ring order
  int64_t ranks = 0, ring_size = 0, rings = 0, nodes = 0;
  // parallel.head_ranks U: groups of U ranks inside a node; ring_size is then R (the groups) and
  // rings U per replica (one per head slot).
  int64_t head_ranks = 1;
  int64_t simulated_positions = 0;
  int64_t tasks = 0, events = 0;
  double step_s = 0;
  double tokens_per_s = 0;
  std::vector<double> layer_forward_s, layer_backward_s;  // per layer, representative rank
  double forward_s = 0, backward_s = 0, head_s = 0;
  double attention_compute_s = 0, projection_compute_s = 0;  // per rank, whole step
  HopStats hop_forward, hop_backward_kv, hop_dkv;
  std::vector<double> hop_layer0_forward_s;  // every hop of layer 0's forward, representative rank
  double ring_bytes_per_rank = 0;
  double effective_ring_bw = 0;   // K/V block bytes / mean forward hop time
  double bottleneck_ring_bw = 0;  // K/V block bytes / slowest forward hop (the ring's pace)
  // The representative rank's ring communication, per micro-batch: the time some ring transfer
  // it sends or receives is in flight (union of their intervals: each transfer once, the last
  // dK/dV trip home included); hidden: the part of it during which the rank computes (at most
  // its compute, at most the transfers); exposed: the rest.
  double ring_comm_s = 0, ring_exposed_s = 0;
  double hidden_share = 0;        // of ring communication, behind compute
  // Head all-to-all inside the group (head_ranks > 1), the representative rank per micro-batch:
  // its all-to-alls in flight (posted to its sends and receives done: forward gather and return,
  // backward gather and return, a recompute's forward pair); exposed: the part not behind its
  // compute (all of it: the executor blocks on them); the bytes it sends.
  int64_t a2a_count = 0;
  double a2a_bytes_per_rank = 0;
  double a2a_s = 0, a2a_exposed_s = 0;
  double exchange_s = 0, exchange_exposed_s = 0;
  double optimizer_s = 0, optimizer_exposed_s = 0;
  double checkpoint_amortised_s = 0;
  bool checkpoint_hidden = false;
  // parallel.shard full (worker/ring/full_shard.h), the representative rank over the step (every
  // micro-batch): block all-gathers (in flight: posted to the last byte in; exposed: the time
  // its compute waited for them) and gradient reduce-scatters (in flight: posted to its last
  // transfer done; exposed: the time it blocked finishing them); bytes it received in the
  // gathers and sent in the reduce-scatters.
  bool shard_full = false;
  int64_t shard_gathers = 0, shard_scatters = 0;
  double shard_gathered_bytes = 0, shard_scattered_bytes = 0;
  double shard_gather_s = 0, shard_gather_exposed_s = 0;
  double shard_scatter_s = 0, shard_scatter_exposed_s = 0;
  double shard_hidden_share = 1;  // of gather + reduce-scatter time, behind compute
  std::vector<PhaseTime> critical_path;  // seconds per phase on the critical path
  // Accounting (docs/simulation.md, "Accounting"). FLOPs per step as `ringctl plan` counts them
  // (plan::step_flops: 6 x params x N + 6 x layers x d_model x N^2 per sequence; hardware adds
  // recompute's forward). compute_only_step_s: the busiest simulated rank's kernels (every
  // compute task on its device, all micro-batches) back to back at the rates, nothing waiting:
  // the step's critical path with communication free. mfu = model FLOPs / (step_s x ranks x
  // peak_flops_per_gpu), the peak the device's for the spec's dtype. rates: the rates simulated,
  // with the kernel efficiencies assumed and their sources.
  int64_t micro_batches = 1;
  std::string dtype;
  double model_flops_per_step = 0, hardware_flops_per_step = 0;
  double compute_only_step_s = 0;
  double peak_flops_per_gpu = 0;
  double mfu = 0;
  Rates rates;
  std::vector<std::string> notes;
  // For --trace: every task (kept when SimOptions::keep_trace).
  struct TraceEvent {
    std::string name;
    int pid = 0, tid = 0;
    double start = 0, end = 0;
    double bytes = 0;
    int layer = -1, step = -1;
  };
  std::vector<TraceEvent> trace;
};

// spec valid and resolved. Throws std::invalid_argument / topology::TopologyError on options
// that cannot be simulated (a what-if naming a rank or node the job does not have, ...).
SimResult simulate(const spec::JobSpec& spec, const SimOptions& options);

nlohmann::json to_json(const SimResult& r);
std::string to_text(const SimResult& r);
// Chrome / Perfetto trace JSON ("traceEvents", times in microseconds).
void write_trace(const SimResult& r, const std::string& path);

// Alpha-beta building blocks, also used by the tests: ring collectives over n participants whose
// every ring hop has latency alpha and bandwidth bw; bytes = the whole buffer.
double ring_allreduce_time(int64_t n, double bytes, double alpha, double bw);
double ring_allgather_time(int64_t n, double bytes_per_participant, double alpha, double bw);
double ring_reduce_scatter_time(int64_t n, double bytes, double alpha, double bw);

// Adds a ring collective to an engine: participants[k] sends to participants[k+1 mod n] over
// routes[k] (engine route ids); steps x chunk bytes; every participant's step j+1 waits for its
// own send and its receive of step j. Returns a join task that completes with the collective.
// `after` (if >= 0) must complete before the first step.
class Engine;
int add_ring_collective(Engine& e, const std::vector<int>& routes, int64_t steps, double chunk,
                        int after, int phase, int track_base);

}  // namespace ring::sim
