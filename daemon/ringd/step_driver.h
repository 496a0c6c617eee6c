// ringd's step driver: one step of the node at a time. It publishes the weights into the
// shared memory (the optimizer writes them there: set_weights_buffer; the first step of an
// attempt gathers all of them, later steps name the coordinates the last lazy step changed in
// the shared index), sums each gradient
// bucket over the node's workers in local-rank order once every worker delivered it and hands it
// to the NodeOptimizer, finishes the step (the optimizer's result and the step's record), and
// keeps the checkpoint results of the run (which step's checkpoint is durable, which failed).
// When steps begin and end, and when checkpoints are taken, is the attempt's business
// (attempt.h); the Daemon wires the two.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"
#include "daemon/optim/node_optimizer.h"
#include "daemon/ringd/supervisor.h"
#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "common/contract/shm.h"
#include "common/contract/step_stats.h"

namespace ring::ringd {

class StepDriver {
 public:
  explicit StepDriver(const contract::ParamLayout& layout)
      : layout_(layout), node_grad_(static_cast<size_t>(layout.total()), 0.f) {}
  // parallel.shard full: this node's range and its workers' shards (contract::worker_shards, in
  // local-rank order). The workers' slots hold their shards of the job's summed gradient, so the
  // node gradient is the range's only ([range] floats), copied together from the slots; the
  // buckets outside the range reach the optimizer as null.
  StepDriver(const contract::ParamLayout& layout, const contract::NodeRange& range,
             std::vector<contract::WorkerShard> shards)
      : layout_(layout), node_grad_(static_cast<size_t>(range.size()), 0.f), full_(true),
        range_(range), shards_(std::move(shards)) {}

  // A new attempt (start from nothing until a resume or an init sets the weights).
  void reset();
  // Resumed from a checkpoint of `step` with the loader's `cursor`.
  void resumed(int64_t step, nlohmann::json cursor);
  // Rank 0's initial weights are in the shared memory's params: they become the master.
  void init_master(optim::NodeOptimizer& opt, const contract::ShmRegion& shm);

  int64_t done_step() const { return done_step_; }   // last completed step
  int64_t cur_step() const { return cur_step_; }     // step in flight (0: none)
  bool have_master() const { return have_master_; }
  const nlohmann::json& cursor() const { return cursor_; }  // loader cursor after done_step()

  // The next step: the weights into `shm` (the first step of an attempt: every coordinate,
  // a collective of all nodes that throws what NodeOptimizer::publish_all throws; later the last
  // step's finish_step wrote them and a lazy step's changed coordinates go into the index), the
  // workers' step progress cleared, the optimizer begun. Returns the number of coordinates
  // published (-1: all of them).
  int64_t begin_step(std::vector<Worker>& workers, contract::ShmRegion& shm,
                     optim::NodeOptimizer& opt);
  // Worker `w` delivered bucket `b`: "" or what is wrong (out of order). Every bucket that all
  // workers delivered now is summed and handed to the optimizer, `before_update` first (the
  // optimizer is about to change the state a checkpoint may still be writing).
  std::string on_bucket(std::vector<Worker>& workers, Worker& w, int b,
                        const contract::ShmRegion& shm, optim::NodeOptimizer& opt,
                        const std::function<void()>& before_update);
  // Every bucket handed over and every worker done: finish_step may run.
  bool step_complete(const std::vector<Worker>& workers) const;

  struct Finished {
    optim::StepResult result;
    contract::StepStats stats;
    double wall_s = 0;
    nlohmann::json record;  // the steps.jsonl line (without per-run extras)
    contract::control::Done done;  // rank 0's report
  };
  // The optimizer's end of the step (throws what it throws) and the step's record; the step is
  // then done (done_step(), cursor()).
  Finished finish_step(const std::vector<Worker>& workers, optim::NodeOptimizer& opt,
                       int attempt);

  // ---- checkpoint results of the run (this node's view: ok = its shard is durable, and on
  // node 0 the commit done)
  void record(const ckpt::SaveResult& r);
  // The checkpoint of done_step() failed and none of that step succeeded since: its error.
  const std::string* failed_at_done_step() const;

 private:
  const contract::ParamLayout& layout_;
  std::vector<float> node_grad_;
  bool full_ = false;
  contract::NodeRange range_;
  std::vector<contract::WorkerShard> shards_;
  bool have_master_ = false;
  int64_t done_step_ = 0;
  int64_t cur_step_ = 0;
  int buckets_ready_ = 0;  // node buckets handed to the optimizer this step
  bool last_all_changed_ = true;
  bool publish_all_ = true;  // the attempt's first step: every weight into the shared memory
  nlohmann::json cursor_;
  std::chrono::steady_clock::time_point step_t0_;
  std::map<int64_t, std::string> ckpt_failed_;
  std::set<int64_t> ckpt_ok_;
};

// The resume point of an attempt: the newest complete checkpoint at or below `max_step` in `dir`,
// the same step on every node. Each node loads its newest; with several nodes they agree over
// `ex` on the smallest step any of them loaded and load that one (one node without any: none of
// them resumes, r.message says why). `job`: the job's layout, to refuse another model
// (ckpt::load_latest).
ckpt::LoadResult load_agreed_checkpoint(const std::string& dir, int node_rank, int nodes,
                                        const std::vector<ckpt::LoadTarget>& targets,
                                        int64_t max_step, optim::Exchange& ex,
                                        const ckpt::Layout* job = nullptr);

// FNV-1a 64 of `bytes` bytes with ringd's own offset basis 1469598103934665603 (--hash-weights:
// a cheap fingerprint of the master weights, comparable across runs and nodes).
uint64_t fnv1a(const void* data, size_t bytes);

}  // namespace ring::ringd
