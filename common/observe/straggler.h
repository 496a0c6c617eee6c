// Straggler attribution over one step's ranks, shared by ringd (its own ranks) and ring-coord
// (every node's ranks of a step, so that a rank whose victims are on other nodes is named too).
//
// In a ring a slow rank makes its successor wait on the receive, that one's successor on the next
// hop, and every rank at the step's collectives; the slow rank itself waits least. So each rank s
// is charged what its ring successor waited beyond what s waited itself: score(s) =
// wait(succ(s)) - wait(s) (succ: the rank whose `prev` is s; when the successor is not among the
// samples, the median wait of the other samples stands in). The rank with the largest score,
// when it exceeds max(min_behind_s, min_fraction x the median step time), was "last" in that
// step. A rank last in at least `name_after` of the last `window` steps is the straggler; it is
// cleared when it is last in at most `clear_at` of them. Ranks that waited are never charged
// their own waiting.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace ring::observe {

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

}  // namespace ring::observe
