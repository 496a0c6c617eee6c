#include "common/observe/straggler.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace ring::observe {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

// ---- stragglers --------------------------------------------------------------------------------

std::pair<int64_t, double> StragglerTracker::last_of(const std::vector<RankSample>& ranks,
                                                     double min_behind_s, double min_fraction) {
  if (ranks.size() < 2) return {-1, 0};
  std::vector<double> steps;
  for (const RankSample& r : ranks) steps.push_back(r.step_s);
  const double threshold = std::max(min_behind_s, min_fraction * median(steps));
  // The wait of each rank's successor (the rank receiving from it), found in one pass: ring-coord
  // judges every rank of a job, thousands, each step.
  std::unordered_map<int64_t, double> succ_wait;
  for (const RankSample& r : ranks)
    if (r.prev >= 0 && r.prev != r.rank) succ_wait[r.prev] = r.wait_s;
  int64_t best = -1;
  double best_score = 0;
  for (const RankSample& s : ranks) {
    // What s's successor waited, or the others' median wait when the successor is not among the
    // samples (on another node, or no ring).
    double succ = 0;
    if (auto it = succ_wait.find(s.rank); it != succ_wait.end()) {
      succ = it->second;
    } else {
      std::vector<double> others;
      for (const RankSample& r : ranks)
        if (r.rank != s.rank) others.push_back(r.wait_s);
      succ = median(others);
    }
    const double score = succ - s.wait_s;
    if (score > best_score) {
      best_score = score;
      best = s.rank;
    }
  }
  if (best_score <= threshold) return {-1, 0};
  return {best, best_score};
}

StragglerTracker::Finding StragglerTracker::summarise(int64_t rank) const {
  Finding f;
  f.rank = rank;
  std::vector<double> behind;
  for (const Last& l : last_)
    if (l.rank == rank) {
      ++f.steps;
      f.step = std::max(f.step, l.step);
      behind.push_back(l.behind_s);
    }
  f.behind_s = median(behind);
  return f;
}

StragglerTracker::Change StragglerTracker::add(int64_t step, const std::vector<RankSample>& ranks) {
  const auto [rank, behind] = last_of(ranks, o_.min_behind_s, o_.min_fraction);
  last_.push_back({step, rank, behind});
  while (static_cast<int>(last_.size()) > o_.window) last_.pop_front();
  // The rank last most often in the window.
  std::map<int64_t, int> count;
  for (const Last& l : last_)
    if (l.rank >= 0) ++count[l.rank];
  int64_t top = -1;
  int top_n = 0;
  for (const auto& [r, n] : count)
    if (n > top_n) {
      top = r;
      top_n = n;
    }
  Change c;
  if (current_) {
    const int n = count.count(current_->rank) ? count[current_->rank] : 0;
    if (n <= o_.clear_at || (top != current_->rank && top_n >= o_.name_after && top_n > n)) {
      c.cleared = summarise(current_->rank);
      current_.reset();
    } else {
      current_ = summarise(current_->rank);
    }
  }
  if (!current_ && top >= 0 && top_n >= o_.name_after) {
    current_ = summarise(top);
    c.named = current_;
  }
  return c;
}

}  // namespace ring::observe
