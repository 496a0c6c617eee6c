// ringctl metrics JOB [--csv|--json] [--from-step N]: exports the step series the coordinator
// recorded for a job (every node's step report: loss, tokens/s, step and communication time),
// oldest first, for a spreadsheet or a notebook.
//
//   step,attempt,node,loss,tokens_per_s,step_time_s,comm_time_s,time
//   1,1,n0,10.397207260131836,12345.6,0.0812,0.0031,1796217460.547
//
// --csv (the default): RFC 4180, a header line, numbers at full precision (the shortest text
// that reads back as the same double), a diverged loss as NaN. --json: one JSON document, an
// array of {"step","attempt","node","loss","tokens_per_s","step_time_s","comm_time_s","time"}
// (a diverged loss is null). --ranks: the per-rank series instead (each worker's share of each
// step, as its node's ringd measured it: rank_steps),
//
//   step,attempt,node,rank,step_time_s,data_s,compute_s,wait_s,comm_s,hop_bytes,time
//
// (JSON: objects with those keys). Works after the coordinator stopped (cli/local_state.h). What
// is there depends on ring-coord's --metrics-retention-steps (older steps may have been pruned).
#include <charconv>
#include <cmath>
#include <iostream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"

namespace ring::cli {

namespace {

using nlohmann::json;

struct MetricsOpts {
  CoordFlags coord;
  std::string job;
  bool csv = false;
  bool json = false;
  int64_t from_step = 1;
  bool ranks = false;
};

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A CSV field: quoted when it holds a comma, quote, CR or LF (quotes doubled).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

// Pages by step: a full page may end inside one step's rows (several nodes, attempts or ranks),
// so its last step is asked for again with the next page.
template <typename Rec, typename Fetch>
std::vector<Rec> all_pages(int64_t from_step, Fetch fetch) {
  std::vector<Rec> recs;
  constexpr int64_t kPage = 10000;
  for (int64_t after = from_step - 1;;) {
    auto page = fetch(after, kPage);
    int64_t last = page.empty() ? after : page.back().step;
    bool full = static_cast<int64_t>(page.size()) == kPage && page.front().step != last;
    for (auto& st : page)
      if (!full || st.step != last) recs.push_back(std::move(st));
    if (static_cast<int64_t>(page.size()) < kPage) break;
    after = full ? recs.back().step : last;
  }
  return recs;
}

int print_ranks(const MetricsOpts& o, const std::vector<protocol::RankStepRecord>& recs) {
  if (o.json) {
    json out = json::array();
    for (const auto& s : recs) out.push_back(protocol::rank_step_record_json(s));
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    return kExitOk;
  }
  std::string text =
      "step,attempt,node,rank,step_time_s,data_s,compute_s,wait_s,comm_s,hop_bytes,time\n";
  for (const auto& s : recs)
    text += std::to_string(s.step) + "," + std::to_string(s.attempt) + "," + csv_field(s.node) +
            "," + std::to_string(s.rank.rank) + "," + number(s.rank.step_time_s) + "," +
            number(s.rank.data_s) + "," + number(s.rank.compute_s) + "," + number(s.rank.wait_s) +
            "," + number(s.rank.comm_s) + "," + std::to_string(s.rank.hop_bytes) + "," +
            number(s.time) + "\n";
  std::cout << text;
  return kExitOk;
}

int run_metrics(const MetricsOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    int64_t job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    c.status(job);  // a job that does not exist is an error, not an empty series
    if (o.ranks)
      return print_ranks(
          o, all_pages<protocol::RankStepRecord>(o.from_step, [&](int64_t after, int64_t n) {
            return c.rank_steps(job, after, n);
          }));
    const auto recs = all_pages<protocol::StepRecord>(
        o.from_step, [&](int64_t after, int64_t n) { return c.steps(job, after, n); });
    if (o.json) {
      json out = json::array();
      for (const auto& s : recs)
        out.push_back({{"step", s.step},
                       {"attempt", s.attempt},
                       {"node", s.node},
                       {"loss", std::isfinite(s.loss) ? json(s.loss) : json(nullptr)},
                       {"tokens_per_s", s.tokens_per_s},
                       {"step_time_s", s.step_time_s},
                       {"comm_time_s", s.comm_time_s},
                       {"time", s.time}});
      std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      return kExitOk;
    }
    std::string text = "step,attempt,node,loss,tokens_per_s,step_time_s,comm_time_s,time\n";
    for (const auto& s : recs)
      text += std::to_string(s.step) + "," + std::to_string(s.attempt) + "," + csv_field(s.node) +
              "," + number(s.loss) + "," + number(s.tokens_per_s) + "," + number(s.step_time_s) +
              "," + number(s.comm_time_s) + "," + number(s.time) + "\n";
    std::cout << text;
    return kExitOk;
  });
}

}  // namespace

Subcommand add_metrics(CLI::App& app) {
  auto o = std::make_shared<MetricsOpts>();
  auto* s = app.add_subcommand(
      "metrics",
      "Export a job's recorded step series (loss, tokens/s, step time per node) as "
      "CSV or JSON");
  s->add_option("job", o->job, "Job id")->required();
  auto* csv = s->add_flag("--csv", o->csv, "CSV with a header line (the default)");
  s->add_flag("--json", o->json, "One JSON array of step records")->excludes(csv);
  s->add_flag("--ranks", o->ranks,
              "The per-rank series instead: each rank's step, data, compute, wait and "
              "communication seconds and hop bytes per step");
  s->add_option("--from-step", o->from_step, "Only steps from this one on")
      ->check(flags::integer_in(1, int64_t{1} << 53))
      ->capture_default_str();
  o->coord.add_to(s);
  return {s, [o] { return run_metrics(*o); }};
}

}  // namespace ring::cli
