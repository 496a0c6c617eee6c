// ringd's checkpoints of a run: the attempt's Checkpointer (common/checkpoint) over the
// optimizer's state, the checkpoints started at step boundaries, their results told as log lines
// and events (ring-coord resumes from the steps reported saved) and kept in the StepDriver, the
// wait for node 0's commit after a stop, and the message that fails a run whose last checkpoint
// failed. When a checkpoint is taken is the attempt's business (attempt.h).
//
// Each node saves only its range's tensors (StateTensor::saved: contract::shard_ranges) and its
// own per-node ones, with the job's layout recorded (checkpoint_layout); a resume loads every
// tensor the node holds from whichever shard has it, so a checkpoint resumes on any node count
// and shard mode (docs/checkpoints.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/layout.h"
#include "common/spec/spec.h"
#include "common/checkpoint/checkpoint.h"
#include "daemon/optim/node_optimizer.h"

namespace ring::ringd {

// The layout record of a job's checkpoints: spec.parallel.shard, the node ranges
// (contract::shard_ranges of the model's flat layout over `nodes`), the layout's size and the
// model config (resolved: kv_heads, head_dim, mlp_hidden filled). Throws what the model config
// throws for a spec it cannot take.
ckpt::Layout checkpoint_layout(const spec::JobSpec& spec, int nodes);
ckpt::Layout checkpoint_layout(const spec::JobSpec& spec, const contract::ParamLayout& layout,
                               int nodes);

// model.init_from: the master weights of this node (the "master" tensors of `tensors`: all of
// them with shard none, its range with shard optimizer) are loaded by name from the checkpoint at
// `path` (a step directory: that step exactly; a checkpoint directory: its newest complete step),
// whatever node count and shard mode wrote it; the other tensors are left alone. Throws
// ckpt::CheckpointMismatch naming the tensor that is missing or of another shape (or, with `job`,
// the model config that differs) and ckpt::CheckpointError when `path` holds no readable
// checkpoint. Returns what was loaded (loaded is true).
ckpt::LoadResult load_init_from(const std::string& path,
                                const std::vector<optim::StateTensor>& tensors, int node_rank,
                                int nodes, const ckpt::Layout* job);

// A resume was asked for and did not load what was asked: nothing at all (no checkpoint of the
// current lineage, one node without any), or not the step ring-coord named. `retry`: something
// was damaged or unreadable (perhaps a transient read error), so a later attempt may succeed;
// otherwise every attempt would find the same.
class ResumeFailure : public std::runtime_error {
 public:
  ResumeFailure(const std::string& what, bool retry) : std::runtime_error(what), retry_(retry) {}
  bool retry() const { return retry_; }

 private:
  bool retry_;
};

class Checkpoints {
 public:
  struct Hooks {
    std::function<void(const std::string&)> log;                            // ringd's log line
    std::function<void(const std::string&, nlohmann::json)> event;          // an event
    std::function<void(const ckpt::SaveResult&)> record;                    // StepDriver::record
  };
  // `base`: dir ("" : checkpoints are off), keep_last, node_rank, nodes, spec_hash, layout (the
  // job's: checkpoint_layout; its tag is the attempt's, set by open()).
  Checkpoints(ckpt::Options base, Hooks hooks) : base_(std::move(base)), hooks_(std::move(hooks)) {}

  const std::string& dir() const { return base_.dir; }
  // A Checkpointer for the attempt (open() was called and close() not yet).
  bool active() const { return ck_ != nullptr; }

  // The run's id, agreed by every node over `ex` (node 0's random one) at the first attempt:
  // checkpoint tags are "<run>-<attempt>", so no two runs' partial directories or lineages mix.
  void agree_run(optim::Exchange& ex);
  const std::string& run() const { return run_; }
  // The attempt starts from nothing (no resume, or model.init_from): its checkpoints have no
  // parent. Node 0 makes the lineage empty (`latest` "none") when the directory holds
  // checkpoints, which are then superseded, and says so.
  void start_fresh();
  // A checkpoint of this run was saved by this node (so a local restart resumes).
  bool saved_any() const { return saved_any_; }
  // Whether any node sees a checkpoint (complete or damaged) on the directory's current lineage,
  // agreed over `ex` (every node calls it). A directory that cannot be listed counts as having
  // one: the resume then fails naming why instead of starting afresh over it.
  bool lineage_has_checkpoint(optim::Exchange& ex);

  // The attempt's Checkpointer over the optimizer's state tensors this node saves (`saved`);
  // nothing when the dir is "". Its tag is "<run>-<attempt>", its parent the checkpoint
  // resume() loaded (none after start_fresh()). Throws CheckpointError on bad options.
  void open(int attempt, const std::vector<optim::StateTensor>& tensors);
  // A checkpoint of `step` begins (in the background); nothing when not active().
  void start(int64_t step, nlohmann::json meta);
  int64_t last_started() const { return last_started_; }  // -1: none yet
  // Blocks until the checkpoint in flight is done and reports it; `step`'s, saved, is the one a
  // stop waits for (close()).
  void wait(int64_t step);
  // Reports the checkpoints finished meanwhile (never blocks).
  void poll();
  // The optimizer is about to change the state a checkpoint in flight is still writing: waits
  // for it and reports it. Returns how long it waited, or nothing when none was in flight.
  std::optional<std::chrono::steady_clock::duration> drain_before_update();
  // The attempt is over: every checkpoint of it, the one in flight included, is reported; on a
  // stop (`stop_requested`) a node other than 0 whose shard of `done_step` is saved waits for
  // node 0's commit (await_commit); the Checkpointer goes.
  void close(bool stop_requested, int64_t done_step);

  // An attempt's resume point: the newest complete checkpoint at or below `max_step` that every
  // node has (agreed over `ex`) is loaded into `tensors` (all of them, saved or not, found by
  // name in whichever shard holds them; per_node ones by LoadTarget's rule; a format 1
  // checkpoint sliced at each tensor's flat offset), `restore` sets the run's state from it,
  // then it is told ("resuming from ..." and the resumed event); what was skipped, a checkpoint
  // of another spec, none at all or checkpoints off are said too. Returns the load's result
  // (loaded false: start from step 0). Only the current lineage is considered; a resume from
  // an older step than the lineage's head branches it: node 0 moves `latest` back to the step
  // loaded, and the newer ones are superseded (said in the log and a `lineage_branched` event).
  // `exact`: ring-coord named max_step, so a checkpoint of another step is loaded only when the
  // named one is damaged. Throws ResumeFailure when nothing (or, with `exact`, not the step)
  // loads on some node, ckpt::CheckpointMismatch for a checkpoint of another model, and what
  // the load or `restore` throws.
  ckpt::LoadResult resume(const std::vector<optim::StateTensor>& tensors, int64_t max_step,
                          bool exact, optim::Exchange& ex,
                          const std::function<void(const ckpt::LoadResult&)>& restore);

  // Logs a finished checkpoint, records it and sends its event. Returns r.ok.
  bool report(const ckpt::SaveResult& r);
  // Node 0 commits a checkpoint once every node's shard is there: waits (bounded, 10 s) for
  // `step`'s final directory, so that exiting does not let srun kill node 0 mid-commit.
  void await_commit(int64_t step, std::chrono::milliseconds bound = std::chrono::seconds(10));

  // The run ends at `done_step` and that step's checkpoint failed with `error` (null: it did
  // not): the message that fails the run ("" when none), naming the newest complete one.
  std::string final_error(const std::string* error, bool stop, int64_t done_step) const;
  // "<path> (step N)", "none (in <dir>)" or "unknown (<why>)".
  std::string newest_complete() const;

 private:
  void branch_at(const ckpt::LoadResult& r);

  ckpt::Options base_;
  Hooks hooks_;
  std::unique_ptr<ckpt::Checkpointer> ck_;
  int64_t last_started_ = -1;
  int64_t stop_saved_ = -1;  // step of a checkpoint written and waited for (on a stop)
  std::string run_;                        // agree_run
  std::optional<ckpt::CheckpointRef> parent_;  // what the attempt resumed from
  bool saved_any_ = false;
};

}  // namespace ring::ringd
