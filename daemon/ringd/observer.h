// ringd's observability: what it concludes from its workers' step summaries and timelines
// (common/contract/timeline.h). No sockets, no processes: the Daemon feeds it and sends what it
// returns (events, the step report's ranks, the node's timeline file in the job directory).
//
// Straggler attribution (common/observe/straggler.h, the tracker ring-coord also runs over every
// node's ranks): each step's samples of this node's ranks; a rank last in enough recent steps is
// the straggler (event `straggler`), until it is not (`straggler_cleared`).
//
// Hang attribution. When a step is in flight past its deadline, every worker that has not
// finished it is classified from its flight recorder: a worker blocked on a peer (a ring receive,
// a ring send, a collective) is waiting, with where (`ring recv from rank 3, layer 2 hop 1`); one
// that is
// stopped (SIGSTOP: state T in /proc) or whose main thread is outside any wait without progress
// never arrived (missing). A worker that finished the step waits for its end (ringd's next
// weights) and is listed waiting too, with the missing ranks that hold it up. A worker that has
// ended or is ending (not running, a zombie) is neither: its death is reported as a death.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/timeline.h"
#include "common/observe/straggler.h"

namespace ring::ringd {

// The straggler tracker is shared with ring-coord, which runs it over every node's ranks
// (common/observe/straggler.h).
using observe::RankSample;
using observe::StragglerTracker;

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
// `now_ns`: CLOCK_MONOTONIC; `step` in flight for `elapsed_s` past `deadline_s`. `what` names
// what is in flight in the message ("decode step 17"; empty: "step <step>").
HangFinding analyse_hang(int64_t step, double elapsed_s, double deadline_s,
                         const std::vector<HangInput>& workers, int64_t now_ns,
                         const std::string& what = "");
nlohmann::json hang_data(int64_t step, double deadline_s, const HangFinding& f);
// "ring recv from rank 3, layer 2 hop 1", "collective (loss all_gather or label count)", ...
std::string describe_wait(const contract::timeline::Event& current);
// The state letter of /proc/<pid>/stat ('R', 'S', 'T', ...; '?' when it cannot be read).
char proc_state(pid_t pid);

// One timeline file per rank of `ranks` (the workers ringd is about to start), created zeroed
// and mapped into (*maps)[i]: /dev/shm/ringmaster-timeline-u<uid>-p<pid>-r<rank> when /dev/shm
// is a tmpfs (the files a killed ringd of this user left there removed first), else
// <fallback_dir>/timeline-<rank>.bin. Returns the paths ("" for a rank whose file could not be
// made: `say` logs why, and that worker runs without one).
std::vector<std::string> create_timelines(const std::vector<int64_t>& ranks,
                                          const std::string& fallback_dir,
                                          std::vector<contract::timeline::Mapping>* maps,
                                          const std::function<void(const std::string&)>& say);

// The node's timeline for `ringctl trace`: one JSON object per line. First
// {"node_rank":K,"node":"...","ranks":[...],"clock":{"mono_ns":M,"unix_ns":U}}, then per record
// [rank, step, "phase", layer, hop, peer, begin_ns, end_ns, bytes] (rank -1: ringd itself), the
// last `steps` steps of every rank, at most `max_records` records. Written atomically (0600).
// Returns "" or the error.
std::string write_node_timeline(const std::string& path, int node_rank, const std::string& node,
                                const std::vector<contract::timeline::Snapshot>& ranks,
                                const std::vector<contract::timeline::Event>& ringd_events,
                                int64_t steps, size_t max_records);

// The node's timeline of its workers' mapped files `maps` and ringd's own events into
// <job_dir>/timeline/node-<node_rank>.jsonl (write_node_timeline: the last 32 steps, at most 2M
// records; the directory made 0700, refused unless it is a directory of ours). Returns "" or the
// error.
std::string dump_node_timeline(const std::string& job_dir, int node_rank, const std::string& node,
                               const std::vector<contract::timeline::Mapping>& maps,
                               const std::vector<contract::timeline::Event>& ringd_events);

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
