#include "sim/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "fmt/format.h"

namespace ring::sim {

std::vector<spec::Override> Layout::keys() const {
  return {{"parallel.head_ranks", std::to_string(head_ranks)},
          {"parallel.context_ranks", std::to_string(context_ranks)},
          {"parallel.data_replicas", std::to_string(data_replicas)},
          {"train.micro_batches", std::to_string(micro_batches)},
          {"parallel.shard", spec::to_string(shard)},
          {"model.recompute", recompute ? "true" : "false"},
          {"model.recompute_policy", recompute && selective ? "selective" : "full"},
          {"optimizer.compression", spec::to_string(compression)}};
}

std::string Layout::describe() const {
  return fmt::format("U={} x R={}, D={}, M={}, shard {}, {}, {}", head_ranks, ring_groups(),
                     data_replicas, micro_batches, spec::to_string(shard),
                     !recompute ? "no recompute" : selective ? "selective recompute" : "recompute",
                     spec::to_string(compression));
}

namespace {

// The layouts of the space for W = nodes x wpn ranks (docs/planning.md, "Layout search").
std::vector<Layout> enumerate(const spec::JobSpec& s, const SearchOptions& o) {
  const int64_t wpn = s.resources.workers_per_node, W = o.nodes * wpn;
  std::vector<int64_t> micro;
  for (int64_t m = 1; m <= std::max<int64_t>(1, o.max_micro_batches); m *= 2) micro.push_back(m);
  if (std::find(micro.begin(), micro.end(), s.train.micro_batches) == micro.end() &&
      s.train.micro_batches <= o.max_micro_batches)
    micro.push_back(s.train.micro_batches);
  std::vector<spec::ShardMode> shards = {s.parallel.shard};
  if (s.optimizer.offload == spec::Offload::kCpu)
    shards = {spec::ShardMode::kNone, spec::ShardMode::kOptimizer, spec::ShardMode::kFull};
  std::vector<Layout> out;
  for (int64_t u = 1; u <= wpn; ++u) {
    if (wpn % u != 0 || s.model.heads % u != 0) continue;
    for (int64_t c = u; c <= W; c += u) {
      if (W % c != 0) continue;
      for (int64_t m : micro) {
        if (o.sequences > 0 && (W / c) * m != o.sequences) continue;
        for (spec::ShardMode sh : shards)
          for (int rc : {1, 2, 0})  // recompute full, selective, none
            for (spec::Compression cm : {spec::Compression::kTopk, spec::Compression::kNone}) {
              // Shard full has no node exchange: compression changes nothing but the residual.
              if (sh == spec::ShardMode::kFull && cm != s.optimizer.compression) continue;
              Layout l;
              l.head_ranks = u;
              l.context_ranks = c;
              l.data_replicas = W / c;
              l.micro_batches = m;
              l.shard = sh;
              l.recompute = rc != 0;
              l.selective = rc == 2;
              l.compression = cm;
              out.push_back(l);
            }
      }
    }
  }
  return out;
}

void fill_exposed(Candidate* c) {
  const SimResult& r = c->result;
  const double M = static_cast<double>(r.micro_batches);
  const std::vector<std::pair<const char*, double>> kinds = {
      {"ring", r.ring_exposed_s * M},
      {"head_all_to_all", r.a2a_exposed_s * M},
      {"shard_gather", r.shard_full ? r.shard_gather_exposed_s : 0.0},
      {"shard_reduce_scatter", r.shard_full ? r.shard_scatter_exposed_s : 0.0},
      {"gradient_exchange", r.exchange_exposed_s}};
  c->exposed_comm_s = 0;
  double top = -1;
  for (const auto& [name, s] : kinds) {
    c->exposed_comm_s += s;
    if (s > top) top = s, c->exposed_top = name;
  }
}

// Throughput first, in steps of 0.5 % (closer is a tie: the simulator is not that exact), then
// the shorter step (fewer sequences per step for the same throughput).
bool better(const Candidate& a, const Candidate& b) {
  const double ta = a.simulated ? a.result.tokens_per_s : a.screen_tokens_per_s;
  const double tb = b.simulated ? b.result.tokens_per_s : b.screen_tokens_per_s;
  auto band = [](double t) { return t > 0 ? std::llround(std::log(t) / std::log(1.005)) : -1ll << 40; };
  if (band(ta) != band(tb)) return band(ta) > band(tb);
  const double sa = a.simulated ? a.result.step_s : a.screen_step_s;
  const double sb = b.simulated ? b.result.step_s : b.screen_step_s;
  if (sa != sb) return sa < sb;
  return ta > tb;
}

// Layouts that differ only in micro-batches: one family.
bool same_family(const Layout& a, const Layout& b) {
  return a.head_ranks == b.head_ranks && a.context_ranks == b.context_ranks &&
         a.shard == b.shard && a.recompute == b.recompute && a.selective == b.selective &&
         a.compression == b.compression;
}

// How far a plan is from fitting: the larger of its device and host use over what is usable.
double overfill(const plan::Plan& p) {
  const double d = p.device_usable > 0 ? p.worker_total / p.device_usable : 0.0;
  const double h = p.host_capacity > 0 ? p.host_total / p.host_capacity : 0.0;
  return std::max(d, h);
}

}  // namespace

namespace {

// f(k) for k in [0, n) on up to `threads` threads (0: one per core), k handed out in order; the
// first exception any call throws is rethrown here once every thread has stopped.
template <class F>
void parallel_for(size_t n, int threads, const F& f) {
  size_t t = threads > 0 ? static_cast<size_t>(threads)
                         : std::max<size_t>(1, std::thread::hardware_concurrency());
  t = std::min(t, n);
  if (t <= 1) {
    for (size_t k = 0; k < n; ++k) f(k);
    return;
  }
  std::mutex mu;
  size_t next = 0;
  std::exception_ptr error;
  auto worker = [&] {
    while (true) {
      size_t k;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= n || error) return;
        k = next++;
      }
      try {
        f(k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < t; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

SearchResult search_layouts(const spec::JobSpec& base, const SpecLoader& load,
                            const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult res;
  res.nodes = o.nodes;
  res.workers_per_node = base.resources.workers_per_node;
  const std::vector<Layout> space = enumerate(base, o);
  res.enumerated = static_cast<int64_t>(space.size());
  std::vector<std::pair<Candidate, spec::JobSpec>> fit;
  std::set<std::string> invalid_keys;
  double closest = INFINITY;
  for (const Layout& l : space) {
    std::vector<spec::Override> keys = l.keys();
    keys.push_back({"resources.nodes", std::to_string(o.nodes)});
    spec::LoadResult r = load(keys);
    if (!r.ok()) {
      ++res.invalid;
      for (const auto& d : r.diagnostics)
        if (d.severity == spec::Diagnostic::Severity::kError && res.invalid_examples.size() < 4 &&
            invalid_keys.insert(d.key).second)
          res.invalid_examples.push_back(l.describe() + ": " + d.key + ": " + d.message);
      continue;
    }
    const plan::Plan p = plan::make_plan(*r.spec);
    if (!p.fits()) {
      ++res.no_fit;
      const double f = overfill(p);
      if (f < closest) {
        closest = f;
        res.best_no_fit = fmt::format(
            "{}: {} per worker of {} usable on {}, {} host memory per node of {}", l.describe(),
            plan::human_bytes(p.worker_total), plan::human_bytes(p.device_usable), p.device_name,
            plan::human_bytes(p.host_total), plan::human_bytes(p.host_capacity));
      }
      continue;
    }
    Candidate c;
    c.layout = l;
    c.worker_bytes = p.worker_total;
    c.gpu_node_bytes = p.worker_total * static_cast<double>(r.spec->resources.workers_per_node);
    c.host_node_bytes = p.host_total;
    fit.emplace_back(std::move(c), std::move(*r.spec));
  }
  if (fit.empty()) {
    if (res.invalid == res.enumerated)
      throw std::invalid_argument(fmt::format(
          "none of the {} layouts searched validates on {} node(s) x {} workers; first rule: {}",
          res.enumerated, o.nodes, res.workers_per_node,
          res.invalid_examples.empty() ? std::string("(none)") : res.invalid_examples.front()));
    throw std::invalid_argument(fmt::format(
        "no layout fits memory on {} node(s) x {} workers ({} searched, {} valid, none fits); "
        "the closest: {}",
        o.nodes, res.workers_per_node, res.enumerated, res.enumerated - res.invalid,
        res.best_no_fit));
  }
  // Screen: a shallow simulation of each family's fewest micro-batches (more micro-batches
  // repeat the same passes; they only amortise the per-step optimizer and exchange), unless
  // every layout is simulated anyway.
  SimOptions screen = o.sim;
  screen.keep_trace = false;
  screen.fold_task_budget = o.screen_fold_budget;
  std::vector<size_t> heads;  // the first member of each family (enumerate's order: fewest M)
  for (size_t i = 0; i < fit.size(); ++i) {
    bool first = true;
    for (size_t h : heads) first = first && !same_family(fit[h].first.layout, fit[i].first.layout);
    if (first) heads.push_back(i);
  }
  const bool screen_all = !o.exhaustive && static_cast<int64_t>(heads.size()) > o.simulate_top;
  std::mutex count_mu;  // res's counters, from the simulation threads
  if (screen_all)
    parallel_for(heads.size(), o.threads, [&](size_t k) {
      Candidate& c = fit[heads[k]].first;
      try {
        SimResult r = simulate(fit[heads[k]].second, screen);
        c.screen_step_s = r.step_s;
        c.screen_tokens_per_s = r.tokens_per_s;
        bool whole = false;
        if (r.mode.find("layers folded") == std::string::npos &&
            o.screen_fold_budget <= o.sim.fold_task_budget) {
          // Small enough to run whole under the screen's budget: the simulation itself.
          c.result = std::move(r);
          c.simulated = whole = true;
          fill_exposed(&c);
        }
        std::lock_guard<std::mutex> lock(count_mu);
        ++res.screened;
        if (whole) ++res.simulated;
      } catch (const std::invalid_argument&) {
        c.screen_tokens_per_s = -1;  // the simulator cannot model it: last
      }
    });
  std::stable_sort(heads.begin(), heads.end(),
                   [&](size_t a, size_t b) { return better(fit[a].first, fit[b].first); });
  auto run = [&](size_t i) {
    Candidate& c = fit[i].first;
    if (c.simulated || c.screen_tokens_per_s < 0) return;
    try {
      SimOptions so = o.sim;
      so.keep_trace = false;
      c.result = simulate(fit[i].second, so);
      c.simulated = true;
      fill_exposed(&c);
      std::lock_guard<std::mutex> lock(count_mu);
      ++res.simulated;
    } catch (const std::invalid_argument&) {
      c.screen_tokens_per_s = -1;
    }
  };
  // The best families by the screen at their fewest micro-batches; then every micro-batch
  // count of the two best (all of them: exhaustive).
  const size_t n = o.exhaustive ? heads.size() : std::min<size_t>(heads.size(), o.simulate_top);
  parallel_for(n, o.threads, [&](size_t k) { run(heads[k]); });
  std::vector<size_t> top(heads.begin(), heads.begin() + static_cast<std::ptrdiff_t>(n));
  std::stable_sort(top.begin(), top.end(), [&](size_t a, size_t b) {
    return fit[a].first.simulated && (!fit[b].first.simulated || better(fit[a].first, fit[b].first));
  });
  std::vector<size_t> members;  // every micro-batch count of the best families
  for (size_t k = 0; k < top.size() && (o.exhaustive || k < 2); ++k)
    for (size_t i = 0; i < fit.size(); ++i)
      if (same_family(fit[i].first.layout, fit[top[k]].first.layout)) members.push_back(i);
  parallel_for(members.size(), o.threads, [&](size_t k) { run(members[k]); });
  for (auto& [c, s] : fit) {
    if (c.simulated) res.ranked.push_back(c);
    res.fitting.push_back(c);
  }
  std::stable_sort(res.ranked.begin(), res.ranked.end(), better);
  if (res.ranked.empty())
    throw std::invalid_argument(fmt::format(
        "{} layout(s) fit memory but the simulator can model none of them", fit.size()));
  res.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

namespace {

nlohmann::json candidate_json(const Candidate& c) {
  const Layout& l = c.layout;
  nlohmann::json keys = nlohmann::json::object();
  for (const auto& k : l.keys()) keys[k.key] = k.value;
  nlohmann::json j = {{"layout", l.describe()},
                      {"head_ranks", l.head_ranks},
                      {"ring_groups", l.ring_groups()},
                      {"context_ranks", l.context_ranks},
                      {"data_replicas", l.data_replicas},
                      {"micro_batches", l.micro_batches},
                      {"sequences_per_step", l.sequences()},
                      {"shard", spec::to_string(l.shard)},
                      {"recompute", l.recompute},
                      {"recompute_policy", l.recompute && l.selective ? "selective" : "full"},
                      {"compression", spec::to_string(l.compression)},
                      {"keys", keys},
                      {"memory_per_worker_bytes", c.worker_bytes},
                      {"gpu_memory_per_node_bytes", c.gpu_node_bytes},
                      {"host_memory_per_node_bytes", c.host_node_bytes},
                      {"screen_step_s", c.screen_step_s},
                      {"screen_tokens_per_s", c.screen_tokens_per_s},
                      {"simulated", c.simulated}};
  if (c.simulated) {
    j["step_s"] = c.result.step_s;
    j["tokens_per_s"] = c.result.tokens_per_s;
    j["mfu"] = c.result.mfu;
    j["compute_only_step_s"] = c.result.compute_only_step_s;
    j["exposed_comm_s"] = c.exposed_comm_s;
    j["exposed_comm_largest"] = c.exposed_top;
    j["simulation_mode"] = c.result.mode;
  }
  return j;
}

}  // namespace

nlohmann::json to_json(const SearchResult& r, int top) {
  nlohmann::json best = nlohmann::json::array();
  for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i)
    best.push_back(candidate_json(r.ranked[i]));
  nlohmann::json fitting = nlohmann::json::array();
  for (const Candidate& c : r.fitting) fitting.push_back(candidate_json(c));
  return {{"nodes", r.nodes},
          {"workers_per_node", r.workers_per_node},
          {"enumerated", r.enumerated},
          {"invalid", r.invalid},
          {"no_fit", r.no_fit},
          {"fit", r.fitting.size()},
          {"screened", r.screened},
          {"simulated", r.simulated},
          {"seconds", r.seconds},
          {"invalid_examples", r.invalid_examples},
          {"best", best},
          {"fitting", fitting}};
}

std::string to_text(const SearchResult& r, int top) {
  std::string out = fmt::format(
      "layout search on {} node(s) x {} workers: {} layouts, {} invalid, {} do not fit memory, "
      "{} fit; {} screened (shallow simulation), {} simulated as `ringctl simulate`; {:.1f} s\n\n",
      r.nodes, r.workers_per_node, r.enumerated, r.invalid, r.no_fit, r.fitting.size(),
      r.screened, r.simulated, r.seconds);
  out += fmt::format("{:>2}  {:<52} {:>11} {:>12} {:>7} {:>11} {:>11} {:>11}  {}\n", "#", "layout",
                     "step", "tokens/s", "MFU", "GPU mem", "GPU/node", "host/node",
                     "exposed comm (largest)");
  for (size_t i = 0; i < r.ranked.size() && static_cast<int>(i) < top; ++i) {
    const Candidate& c = r.ranked[i];
    out += fmt::format("{:>2}  {:<52} {:>9.2f} s {:>12.0f} {:>6.2f}% {:>11} {:>11} {:>11}  "
                       "{:.2f} s ({})\n",
                       i + 1, c.layout.describe(), c.result.step_s, c.result.tokens_per_s,
                       100 * c.result.mfu, plan::human_bytes(c.worker_bytes),
                       plan::human_bytes(c.gpu_node_bytes), plan::human_bytes(c.host_node_bytes),
                       c.exposed_comm_s, c.exposed_top);
  }
  const Candidate& b = r.ranked.front();
  out += "\nbest: ";
  for (const auto& k : b.layout.keys()) out += k.arg() + " ";
  out += fmt::format("(sequences per step: {}; compute-only step {:.2f} s)\n", b.layout.sequences(),
                     b.result.compute_only_step_s);
  return out;
}

namespace {

std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    lines.emplace_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return lines;
}

bool top_level(const std::string& line) {
  return !line.empty() && line[0] != ' ' && line[0] != '\t' && line[0] != '#';
}

}  // namespace

std::string set_yaml_keys(std::string_view text, const std::vector<spec::Override>& keys) {
  std::vector<std::string> lines = split_lines(text);
  for (const auto& k : keys) {
    const size_t dot = k.key.find('.');
    if (dot == std::string::npos)
      throw std::invalid_argument("set_yaml_keys: '" + k.key + "' is not section.name");
    const std::string section = k.key.substr(0, dot) + ":", name = k.key.substr(dot + 1);
    size_t head = lines.size();
    for (size_t i = 0; i < lines.size(); ++i)
      if (top_level(lines[i]) && lines[i].rfind(section, 0) == 0 &&
          lines[i].find_first_not_of(' ', section.size()) == std::string::npos)
        head = i;
    if (head == lines.size()) {
      if (!lines.empty() && !lines.back().empty()) lines.emplace_back();
      lines.push_back(section);
      lines.push_back("  " + name + ": " + k.value);
      continue;
    }
    size_t last = head;  // the section's last key line
    bool done = false;
    std::string indent;
    for (size_t i = head + 1; i < lines.size() && !top_level(lines[i]); ++i) {
      const std::string& l = lines[i];
      const size_t c = l.find_first_not_of(' ');
      if (c == std::string::npos || l[c] == '#') continue;
      last = i;
      if (indent.empty()) indent = l.substr(0, c);  // the section's key indent
      if (l.compare(c, name.size() + 1, name + ":") != 0) continue;
      const size_t hash = l.find(" #", c + name.size());
      std::string comment;
      if (hash != std::string::npos) comment = "  " + l.substr(hash + 1);
      lines[i] = l.substr(0, c) + name + ": " + k.value + comment;
      done = true;
      break;
    }
    if (!done)
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(last) + 1,
                   (indent.empty() ? "  " : indent) + name + ": " + k.value);
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace ring::sim
