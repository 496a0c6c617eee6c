// Layout search (`ringctl plan --search`, docs/planning.md "Layout search"): the layouts of one
// spec on one cluster, the ones that validate and fit memory, ranked by simulated throughput.
//
//   sim::SearchOptions o;           // nodes, the simulator's options (cluster, rates)
//   sim::SearchResult r = sim::search_layouts(spec, load, o);
//   std::cout << sim::to_text(r, 5);
//
// The space: head_ranks U (divides the heads and the node's workers) x the ring of R groups
// (context_ranks = U x R), data replicas (the ranks left over), micro-batches, shard mode
// (offload cpu: none, optimizer, full), recompute full, selective or off, top-k or dense
// gradients (not with shard full: it has no node exchange). The spec has no bucket-size key:
// buckets are one per block (common/plan flat_layout), recompute is per layer.
//
// Three stages keep it fast: every layout is loaded with its keys as overrides (every rule of
// the spec applies) and planned (common/plan: memory fit); the ones that fit are screened by a
// shallow simulation (two and three layers, the step extended linearly: the simulator's own
// fold); the best `simulate_top` by that screen are simulated as `ringctl simulate` would, and
// ranked by tokens per second (then step time).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/plan/plan.h"
#include "common/spec/parse.h"
#include "sim/simulate.h"

namespace ring::sim {

// One point of the search space.
struct Layout {
  int64_t head_ranks = 1;     // U
  int64_t context_ranks = 1;  // U x R
  int64_t data_replicas = 1;
  int64_t micro_batches = 1;
  spec::ShardMode shard{};
  bool recompute = false;
  bool selective = false;  // with recompute: model.recompute_policy selective (else full)
  spec::Compression compression{};
  int64_t ring_groups() const { return context_ranks / head_ranks; }
  int64_t sequences() const { return data_replicas * micro_batches; }
  // The keys that make it, as --set overrides would ("parallel.head_ranks" = "8", ...).
  std::vector<spec::Override> keys() const;
  // "U=8 x R=64, D=1, M=1, shard full, recompute, topk"
  std::string describe() const;
};

// A layout's outcome.
struct Candidate {
  Layout layout;
  double worker_bytes = 0;  // plan: per worker (GPU memory with backend cuda)
  double gpu_node_bytes = 0;  // worker_bytes x workers per node
  double host_node_bytes = 0;  // plan: host memory per node
  double screen_step_s = 0, screen_tokens_per_s = 0;  // the shallow simulation
  bool simulated = false;  // by the full simulation (then result holds it)
  SimResult result;
  double exposed_comm_s = 0;  // ring, head all-to-all, shard full, gradient exchange (per step)
  std::string exposed_top;    // the largest of them
};

// Loads the user's spec with these extra overrides (after the user's own --set), every rule.
using SpecLoader = std::function<spec::LoadResult(const std::vector<spec::Override>&)>;

struct SearchOptions {
  int64_t nodes = 1;                // the cluster's nodes for the job
  SimOptions sim;                   // cluster and rates, as `ringctl simulate` builds them
  int64_t max_micro_batches = 4;    // micro-batches tried: 1, 2, 4, ... up to this
  int64_t sequences = 0;            // > 0: only layouts with data_replicas x micro_batches = this
  int simulate_top = 6;             // layouts simulated in full after the screen
  bool exhaustive = false;          // simulate every layout that fits (no screen)
  // The screen's SimOptions::fold_task_budget: a layout whose step graph is smaller is
  // simulated whole (the screen is then its simulation); a larger one is folded to about this
  // many tasks (at least two and three layers, the step extended linearly).
  int64_t screen_fold_budget = 400'000;
  // Simulations run at once (each layout's is independent); 0: one per core. The result does
  // not depend on it.
  int threads = 0;
};

struct SearchResult {
  int64_t nodes = 0, workers_per_node = 0;
  int64_t enumerated = 0, invalid = 0, no_fit = 0, screened = 0, simulated = 0;
  std::vector<Candidate> ranked;        // simulated layouts, best first
  std::vector<Candidate> fitting;       // every layout that fits (screen order)
  std::vector<std::string> invalid_examples;  // the first few rules that rejected layouts
  std::string best_no_fit;              // the layout that came closest to fitting, and why not
  double seconds = 0;                   // wall time of the search
};

// base: the user's spec as loaded (valid, resolved). Throws std::invalid_argument when no
// layout validates and fits (the message names the closest one and what it lacks).
SearchResult search_layouts(const spec::JobSpec& base, const SpecLoader& load,
                            const SearchOptions& o);

nlohmann::json to_json(const SearchResult& r, int top);
std::string to_text(const SearchResult& r, int top);

// The YAML text with each key set: its line's value replaced (a comment after it kept), or
// the key added at the end of its section, or the section appended. Keys are "section.name";
// values YAML scalars as --set takes them.
std::string set_yaml_keys(std::string_view text, const std::vector<spec::Override>& keys);

}  // namespace ring::sim
