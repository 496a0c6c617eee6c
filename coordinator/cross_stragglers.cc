#include "coordinator/cross_stragglers.h"

#include <algorithm>

#include <fmt/format.h>

namespace ring::coord {

using nlohmann::json;
using observe::RankSample;
using observe::StragglerTracker;

CrossNodeStragglers::Emit CrossNodeStragglers::emit(int64_t job, const JobTrack& js,
                                                    const StragglerTracker::Finding& f,
                                                    bool cleared, const std::string& why) const {
  Emit e;
  e.job = job;
  e.attempt = js.attempt;
  e.kind = cleared ? "straggler_cleared" : "straggler";
  e.rank = f.rank;
  auto n = js.rank_node.find(f.rank);
  e.node = n == js.rank_node.end() ? std::string("?") : n->second;
  e.data = {{"rank", f.rank},
            {"node", e.node},
            {"step", f.step},
            {"steps", f.steps},
            {"behind_s", f.behind_s},
            {"noise_s", f.noise_s},
            {"sigmas", f.sigmas},
            {"source", "coordinator"},
            {"ranks", js.rank_node.size()}};
  e.data["message"] =
      cleared ? fmt::format(
                    "rank {} on {} is no longer a straggler ({}; judged by ring-coord over "
                    "every node's ranks)",
                    f.rank, e.node,
                    why.empty() ? fmt::format("last in {} of the recent steps", f.steps) : why)
              : fmt::format(
                    "rank {} on {} is a straggler: the ranks after it waited {:.3f} s for it per "
                    "step (median), {}, last in {} of the recent steps (step {}); judged by "
                    "ring-coord over the {} ranks of every node",
                    f.rank, e.node, f.behind_s, observe::StragglerTracker::describe_noise(f),
                    f.steps, f.step, js.rank_node.size());
  return e;
}

std::vector<CrossNodeStragglers::Emit> CrossNodeStragglers::judge(
    int64_t job, JobTrack& js, int64_t step, const Pending& p, const NamedByNode& named_by_node) {
  std::vector<RankSample> samples;
  for (const auto& [node, rows] : p.by_node)
    for (const protocol::RankStep& r : rows) {
      samples.push_back({r.rank, r.prev.value_or(-1), r.step_time_s, r.wait_s});
      js.rank_node[r.rank] = node;
    }
  ++judged_;
  std::vector<Emit> out;
  const StragglerTracker::Change c = js.tracker.add(step, samples);
  if (c.cleared && js.emitted == c.cleared->rank) {
    out.push_back(emit(job, js, *c.cleared, true));
    js.emitted.reset();
  }
  // The current finding is reported unless a ringd already names that rank (one finding per
  // culprit); when the ringd's finding clears first, this one is reported then.
  const auto& cur = js.tracker.current();
  if (cur && js.emitted != cur->rank && !named_by_node(job, js.attempt, cur->rank)) {
    if (js.emitted) {
      StragglerTracker::Finding old;
      old.rank = *js.emitted;
      out.push_back(emit(job, js, old, true, fmt::format("rank {} replaced it", cur->rank)));
    }
    out.push_back(emit(job, js, *cur, false));
    js.emitted = cur->rank;
  }
  return out;
}

std::vector<CrossNodeStragglers::Emit> CrossNodeStragglers::add(const protocol::StepReport& r,
                                                                int64_t nodes,
                                                                const NamedByNode& named_by_node) {
  std::vector<Emit> out;
  if (nodes < 2 || r.ranks.empty()) return out;
  auto it = jobs_.find(r.job);
  if (it == jobs_.end()) {
    if (jobs_.size() >= o_.max_jobs) {
      auto oldest = std::min_element(jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
        return a.second.touched < b.second.touched;
      });
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(r.job, JobTrack{}).first;
    it->second.tracker = StragglerTracker(o_.tracker);
    it->second.attempt = r.attempt;
  }
  JobTrack& js = it->second;
  js.touched = ++clock_;
  if (r.attempt < js.attempt) return out;  // an older attempt's late report
  if (r.attempt > js.attempt) {
    // A new attempt: its ranks start afresh; a finding of the old one ends with it.
    if (js.emitted) {
      StragglerTracker::Finding f;
      f.rank = *js.emitted;
      out.push_back(emit(r.job, js, f, true, fmt::format("attempt {} ended", js.attempt)));
    }
    JobTrack fresh;
    fresh.tracker = StragglerTracker(o_.tracker);
    fresh.attempt = r.attempt;
    fresh.touched = js.touched;
    js = std::move(fresh);
  }
  if (r.step <= js.judged_through) return out;  // judged or dropped already
  Pending& p = js.pending[r.step];
  p.by_node[r.node] = r.ranks;
  if (static_cast<int64_t>(p.by_node.size()) >= nodes) {
    // Complete: earlier steps still waiting will not complete any more (each node reports in
    // order), so they are dropped.
    const Pending done = std::move(p);
    for (auto e = js.pending.begin(); e != js.pending.end() && e->first < r.step;) {
      ++dropped_;
      e = js.pending.erase(e);
    }
    js.pending.erase(r.step);
    js.judged_through = r.step;
    auto found = judge(r.job, js, r.step, done, named_by_node);
    out.insert(out.end(), found.begin(), found.end());
  }
  while (js.pending.size() > o_.max_pending) {
    js.judged_through = std::max(js.judged_through, js.pending.begin()->first);
    js.pending.erase(js.pending.begin());
    ++dropped_;
  }
  return out;
}

std::optional<int64_t> CrossNodeStragglers::current(int64_t job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.emitted;
}

}  // namespace ring::coord
