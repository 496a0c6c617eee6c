// Straggler attribution over one step's ranks, shared by ringd (its own ranks) and ring-coord
// (every node's ranks of a step, so that a rank whose victims are on other nodes is named too).
//
// In a ring a slow rank makes its successor wait on the receive, that one's successor on the next
// hop, and every rank at the step's collectives; the slow rank itself waits least. So each rank s
// is charged what its ring successor waited beyond what s waited itself: score(s) =
// wait(succ(s)) - wait(s) (succ: the rank whose `prev` is s; when the successor is not among the
// samples, the median wait of the other samples stands in). The rank with the largest score was
// "last" in that step when the score exceeds both max(min_behind_s, min_fraction x the median
// step time) and the noise: the median plus `z` robust standard deviations (1.4826 x MAD) of
// every other rank's scores over the window. On a host where workers share cores every rank is
// 0.05-0.1 s "behind" now and then; a fixed fraction of the step named them (false alarms), the
// measured spread does not, while a rank that is really slow stands out of it at once. A rank
// last in at least `name_after` of the last `window` steps is the straggler, its finding saying
// how far outside the noise it is; it is cleared when it is last in at most `clear_at` of them.
// Ranks that waited are never charged their own waiting.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
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
    double z = 4;  // robust standard deviations of the others' scores a rank must stand out by
  };
  struct Finding {
    int64_t rank = -1;
    int64_t step = 0;     // latest step it was last in
    int steps = 0;        // of the window's steps, how many it was last in
    double behind_s = 0;  // median score over those steps
    double noise_s = 0;   // the others' spread (robust standard deviation of their scores)
    double sigmas = 0;    // median of (score - the others' median) / noise_s; 1e6 when noise 0
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
    scores_.clear();
    current_.reset();
  }
  // Each rank's score in `ranks` (see above), in the order of `ranks`.
  static std::vector<std::pair<int64_t, double>> scores(const std::vector<RankSample>& ranks);
  // "7.6 times the noise of the others (0.031 s)", or "no measurable noise among the others".
  static std::string describe_noise(const Finding& f);
  // The rank that was last in `ranks` by the fixed floor alone, and by how much (rank -1: nobody
  // clearly).
  static std::pair<int64_t, double> last_of(const std::vector<RankSample>& ranks,
                                            double min_behind_s, double min_fraction);

 private:
  Finding summarise(int64_t rank) const;
  Options o_;
  struct Last {
    int64_t step;
    int64_t rank;
    double behind_s;
    double noise_s;
    double sigmas;
  };
  std::deque<Last> last_;
  // Every rank's score in each step of the window (the noise the scores are judged against).
  std::deque<std::vector<std::pair<int64_t, double>>> scores_;
  std::optional<Finding> current_;
};

}  // namespace ring::observe
