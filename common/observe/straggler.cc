#include "common/observe/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

std::vector<std::pair<int64_t, double>> StragglerTracker::scores(
    const std::vector<RankSample>& ranks) {
  std::vector<std::pair<int64_t, double>> out;
  if (ranks.size() < 2) return out;
  // The wait of each rank's successor (the rank receiving from it), found in one pass: ring-coord
  // judges every rank of a job, thousands, each step.
  std::unordered_map<int64_t, double> succ_wait;
  for (const RankSample& r : ranks)
    if (r.prev >= 0 && r.prev != r.rank) succ_wait[r.prev] = r.wait_s;
  // What a rank's successor waited when the successor is not among the samples (on another
  // node, or no ring): the median wait of the others. Computed once from the sorted waits.
  std::vector<double> waits;
  for (const RankSample& r : ranks) waits.push_back(r.wait_s);
  std::sort(waits.begin(), waits.end());
  const auto median_without = [&](double w) {
    std::vector<double> others = waits;
    others.erase(std::lower_bound(others.begin(), others.end(), w));
    return median(others);
  };
  for (const RankSample& s : ranks) {
    auto it = succ_wait.find(s.rank);
    const double succ = it != succ_wait.end() ? it->second : median_without(s.wait_s);
    out.emplace_back(s.rank, succ - s.wait_s);
  }
  return out;
}

std::pair<int64_t, double> StragglerTracker::last_of(const std::vector<RankSample>& ranks,
                                                     double min_behind_s, double min_fraction) {
  if (ranks.size() < 2) return {-1, 0};
  std::vector<double> steps;
  for (const RankSample& r : ranks) steps.push_back(r.step_s);
  const double threshold = std::max(min_behind_s, min_fraction * median(steps));
  int64_t best = -1;
  double best_score = 0;
  for (const auto& [rank, score] : scores(ranks))
    if (score > best_score) best_score = score, best = rank;
  if (best_score <= threshold) return {-1, 0};
  return {best, best_score};
}

std::string StragglerTracker::describe_noise(const Finding& f) {
  if (f.noise_s <= 0 || f.sigmas >= 1e6) return "no measurable noise among the other ranks";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%.1f times the other ranks' noise (%.3f s)", f.sigmas,
                f.noise_s);
  return buf;
}

StragglerTracker::Finding StragglerTracker::summarise(int64_t rank) const {
  Finding f;
  f.rank = rank;
  std::vector<double> behind, noise, sigmas;
  for (const Last& l : last_)
    if (l.rank == rank) {
      ++f.steps;
      f.step = std::max(f.step, l.step);
      behind.push_back(l.behind_s);
      noise.push_back(l.noise_s);
      sigmas.push_back(l.sigmas);
    }
  f.behind_s = median(behind);
  f.noise_s = median(noise);
  f.sigmas = median(sigmas);
  return f;
}

StragglerTracker::Change StragglerTracker::add(int64_t step, const std::vector<RankSample>& ranks) {
  std::vector<double> steps;
  for (const RankSample& r : ranks) steps.push_back(r.step_s);
  const double floor_s = std::max(o_.min_behind_s, o_.min_fraction * median(steps));
  scores_.push_back(scores(ranks));
  while (static_cast<int>(scores_.size()) > o_.window) scores_.pop_front();
  int64_t cand = -1;
  double cand_score = 0;
  for (const auto& [rank, score] : scores_.back())
    if (score > cand_score) cand_score = score, cand = rank;
  // The noise: every other rank's scores over the window (the candidate's own are left out, so
  // that a rank slow for a while does not hide itself by widening the spread).
  std::vector<double> others;
  for (const auto& st : scores_)
    for (const auto& [rank, score] : st)
      if (rank != cand) others.push_back(score);
  const double center = median(others);
  std::vector<double> dev;
  for (double x : others) dev.push_back(std::abs(x - center));
  const double noise = 1.4826 * median(dev);
  Last l{step, -1, 0, noise, 0};
  if (cand >= 0 && cand_score > floor_s && cand_score > center + o_.z * noise) {
    l.rank = cand;
    l.behind_s = cand_score;
    l.sigmas = noise > 0 ? std::min(1e6, (cand_score - center) / noise) : 1e6;
  }
  last_.push_back(l);
  while (static_cast<int>(last_.size()) > o_.window) last_.pop_front();
  // The rank last most often in the window.
  std::map<int64_t, int> count;
  for (const Last& x : last_)
    if (x.rank >= 0) ++count[x.rank];
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
