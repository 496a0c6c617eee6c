// ringd's observability: what it concludes from its workers' step summaries and timelines
// (common/contract/timeline.h). No sockets, no processes: the Daemon feeds it and sends what it
// returns (events, the step report's ranks, the node's timeline file in the job directory).
//
// Straggler attribution. In a ring a slow rank makes its successor wait on the receive, that
// one's successor on the next hop, and every rank at the step's collectives; the slow rank
// itself waits least. So each rank s is charged what its ring successor waited beyond what s
// waited itself: score(s) = wait(succ(s)) - wait(s) (succ: the rank whose `prev` is s; when the
// successor is on another node, the median wait of the node's other ranks stands in). The rank
// with the largest score, when it exceeds max(min_behind_s, min_fraction x the median step time),
// was "last" in that step. A rank last in at least `name_after` of the last `window` steps is the
// straggler (event `straggler`); it is cleared (`straggler_cleared`) when it is last in at most
// `clear_at` of them. Ranks that waited are never charged their own waiting.
//
// Hang attribution. When a step is in flight past its deadline, every worker that has not
// finished it is classified from its flight recorder: a worker blocked on a peer (a ring receive,
// a ring send, a collective) is waiting, with where (`ring recv from rank 3, layer 2 hop 1`); one
// that is
// stopped (SIGSTOP: state T in /proc) or whose main thread is outside any wait without progress
// never arrived (missing). A worker that has ended or is ending (not running, a zombie) is
// neither: its death is reported as a death.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/timeline.h"

namespace ring::ringd {

struct RankSample {
  int64_t rank = 0;
  int64_t prev = -1;  // the global rank it receives from (-1: no ring)
  double step_s = 0;
  double wait_s = 0;  // blocked on peers: ring receives and collectives
};

class StragglerTracker {
 public:
  struct Options {
    int window = 8;
    int name_after = 3;
    int clear_at = 1;
    double min_behind_s = 0.005;
    double min_fraction = 0.05;
  };
  struct Finding {
    int64_t rank = -1;
    int64_t step = 0;     // latest step it was last in
    int steps = 0;        // of the window's steps, how many it was last in
    double behind_s = 0;  // median score over those steps
  };
  struct Change {
    std::optional<Finding> named;    // a new straggler (or another rank replaced the old one)
    std::optional<Finding> cleared;  // the previous straggler is no longer one
  };

  StragglerTracker() : StragglerTracker(Options{}) {}
  explicit StragglerTracker(Options o) : o_(o) {}
  // One step's samples (the node's ranks). Returns what changed.
  Change add(int64_t step, const std::vector<RankSample>& ranks);
  const std::optional<Finding>& current() const { return current_; }
  void reset() {
    last_.clear();
    current_.reset();
  }
  // The rank that was last in `ranks` and by how much (rank -1: nobody clearly).
  static std::pair<int64_t, double> last_of(const std::vector<RankSample>& ranks,
                                            double min_behind_s, double min_fraction);

 private:
  Finding summarise(int64_t rank) const;
  Options o_;
  struct Last {
    int64_t step;
    int64_t rank;
    double behind_s;
  };
  std::deque<Last> last_;
  std::optional<Finding> current_;
};

// The event data of the agreed kinds (docs/observability.md).
nlohmann::json straggler_data(const StragglerTracker::Finding& f, const std::string& node,
                              bool cleared);

// One worker as the hang check sees it.
struct HangInput {
  int64_t rank = 0;
  pid_t pid = -1;
  bool done = false;  // finished the step
  bool running = true;
  char proc_state = '?';              // /proc/<pid>/stat state ('T': stopped), '?' unknown
  contract::timeline::Snapshot snap;  // its flight recorder (snap.ok false: none)
};
struct HangFinding {
  std::vector<int64_t> missing;
  struct Waiting {
    int64_t rank;
    std::string where;
  };
  std::vector<Waiting> waiting;
  std::string message;
};
// `now_ns`: CLOCK_MONOTONIC; `step` in flight for `elapsed_s` past `deadline_s`.
HangFinding analyse_hang(int64_t step, double elapsed_s, double deadline_s,
                         const std::vector<HangInput>& workers, int64_t now_ns);
nlohmann::json hang_data(int64_t step, double deadline_s, const HangFinding& f);
// "ring recv from rank 3, layer 2 hop 1", "collective (loss all_gather or label count)", ...
std::string describe_wait(const contract::timeline::Event& current);
// The state letter of /proc/<pid>/stat ('R', 'S', 'T', ...; '?' when it cannot be read).
char proc_state(pid_t pid);

// The node's timeline for `ringctl trace`: one JSON object per line. First
// {"node_rank":K,"node":"...","ranks":[...],"clock":{"mono_ns":M,"unix_ns":U}}, then per record
// [rank, step, "phase", layer, hop, peer, begin_ns, end_ns, bytes] (rank -1: ringd itself), the
// last `steps` steps of every rank, at most `max_records` records. Written atomically (0600).
// Returns "" or the error.
std::string write_node_timeline(const std::string& path, int node_rank, const std::string& node,
                                const std::vector<contract::timeline::Snapshot>& ranks,
                                const std::vector<contract::timeline::Event>& ringd_events,
                                int64_t steps, size_t max_records);

// ringd's own phases (optimizer, checkpoint): a fixed ring of events, no allocation per record.
class DaemonTimeline {
 public:
  explicit DaemonTimeline(size_t capacity = 4096) : ring_(capacity) {}
  void record(const contract::timeline::Event& e);
  std::vector<contract::timeline::Event> events(int64_t min_step) const;

 private:
  std::vector<contract::timeline::Event> ring_;
  uint64_t next_ = 0;
};

}  // namespace ring::ringd
