// Straggler attribution across nodes. Each ringd judges only its own ranks, so a rank whose
// victims are all on other nodes (or a node alone with its one rank) is not named there.
// ring-coord receives every node's per-rank step rows (StepReport.ranks) and runs the same
// tracker (common/observe/straggler.h) over all ranks of a step once every node of the job has
// reported that step: each rank is charged what its ring successor waited beyond its own wait
// (the successor is the rank whose `prev` it is, on whichever node), and a rank last in enough of
// the recent steps is named with its node and how far behind it is.
//
// Bounded: a step waits for its missing nodes' reports until a later step is complete (each ringd
// reports in order, so an earlier one will not complete any more) or until `max_pending` later
// steps are waiting; such a step is dropped, never judged on part of its ranks. Jobs with one
// node are left to their ringd (it sees every rank).
//
//   CrossNodeStragglers cross;
//   for (auto& f : cross.add(report, job.nodes))   // every node's report as it arrives
//     record f.kind ("straggler" | "straggler_cleared") with f.data, at f.node;
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/observe/straggler.h"
#include "common/protocol/protocol.h"

namespace ring::coord {

class CrossNodeStragglers {
 public:
  struct Options {
    observe::StragglerTracker::Options tracker;
    size_t max_pending = 8;  // steps waiting for reports, per job
    size_t max_jobs = 1000;  // jobs tracked at once (the least recently reported are dropped)
  };
  // One finding to record as an event (`node`: the culprit's node).
  struct Emit {
    int64_t job = 0;
    int64_t attempt = 0;
    std::string kind;  // "straggler" | "straggler_cleared"
    std::string node;
    int64_t rank = -1;
    nlohmann::json data;
  };
  // Whether a ringd currently names this rank of the job (its own finding: the pass does not
  // report the same culprit again).
  using NamedByNode = std::function<bool(int64_t job, int64_t attempt, int64_t rank)>;

  CrossNodeStragglers() : CrossNodeStragglers(Options{}) {}
  explicit CrossNodeStragglers(Options o) : o_(o) {}

  // A node's step report; `nodes`: how many nodes the job has. Returns what changed.
  std::vector<Emit> add(const protocol::StepReport& r, int64_t nodes,
                        const NamedByNode& named_by_node);
  // The rank the pass currently names for a job (none: nullopt).
  std::optional<int64_t> current(int64_t job) const;
  // Steps judged so far (all jobs), and steps dropped incomplete.
  uint64_t judged() const { return judged_; }
  uint64_t dropped() const { return dropped_; }

 private:
  struct Pending {
    std::map<std::string, std::vector<protocol::RankStep>> by_node;
  };
  struct JobTrack {
    int64_t attempt = 0;
    std::map<int64_t, Pending> pending;  // step -> the reports so far
    int64_t judged_through = 0;          // steps <= this are judged or dropped
    observe::StragglerTracker tracker;
    std::map<int64_t, std::string> rank_node;  // the node each rank reported from, latest
    std::optional<int64_t> emitted;            // the rank this pass named in an event
    uint64_t touched = 0;
  };
  std::vector<Emit> judge(int64_t job, JobTrack& js, int64_t step, const Pending& p,
                          const NamedByNode& named_by_node);
  Emit emit(int64_t job, const JobTrack& js, const observe::StragglerTracker::Finding& f,
            bool cleared, const std::string& why = "") const;

  Options o_;
  std::map<int64_t, JobTrack> jobs_;
  uint64_t clock_ = 0;
  uint64_t judged_ = 0, dropped_ = 0;
};

}  // namespace ring::coord
