// ringctl steps JOB [--json] [--after N] [--last N] [--source auto|file|coordinator]: a job's
// per-step numbers as recorded, oldest first.
//
//   STEP  ATTEMPT  LOSS                LR       GRAD_NORM  TOK/S  STEP_MS
//   1     1        10.397207260131836  0.0003   1.8312     12.3k  81.2
//
// Sources: the job's steps.jsonl (<job_dir>/steps.jsonl, written by node 0's ringd: loss,
// learning rate, gradient norm, tokens/s, step time; daemon/INTERFACE.md) when this machine can
// read it, else the step reports the coordinator recorded (loss, tokens/s and step time of every
// node; no learning rate or gradient norm, which ringd does not report). `auto` (the default)
// prefers the file. Numbers are printed as recorded: the loss is the shortest text that reads back
// as the same double. --json prints one JSON object per line: the file's records, or the
// coordinator's ({"step","attempt","node","loss","tokens_per_s","step_time_s","comm_time_s",
// "time"}). Works after `ringctl run` ended too (cli/local_state.h).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"

namespace ring::cli {

namespace {

using nlohmann::json;

struct StepsOpts {
  CoordFlags coord;
  std::string job;
  bool json = false;
  int64_t after = 0;
  int64_t last = 0;  // 0: all
  std::string source = "auto";
};

// A recorded number as written (full precision), or "-".
std::string number(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number()) return "-";
  return it->dump();
}

std::string fixed(const json& o, const char* key, const char* fmt) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, it->get<double>());
  return buf;
}

// The records of steps.jsonl with step > after. A line that is not a step record is reported
// and skipped; an unfinished last line (being written) is left out quietly.
std::vector<json> read_steps_file(const std::string& path, int64_t after) {
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<json> out;
  size_t lineno = 0;
  for (size_t a = 0; a < text.size();) {
    size_t b = text.find('\n', a);
    bool complete = b != std::string::npos;
    if (!complete) b = text.size();
    std::string line = text.substr(a, b - a);
    a = b + 1;
    ++lineno;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      if (complete)
        std::cerr << "ringctl: " << path << ":" << lineno
                  << ": not a step record (a JSON object with an integer \"step\"), skipped\n";
      continue;
    }
    if (j["step"].get<int64_t>() > after) out.push_back(std::move(j));
  }
  return out;
}

json coordinator_record(const protocol::StepRecord& s) { return protocol::step_record_json(s); }

std::string render(const std::vector<json>& recs, bool from_file) {
  std::vector<std::vector<std::string>> rows;
  bool nodes = false;
  for (const auto& r : recs)
    if (!from_file && r.value("node", "") != recs.front().value("node", "")) nodes = true;
  for (const auto& r : recs) {
    std::vector<std::string> row{number(r, "step"), number(r, "attempt"), number(r, "loss")};
    if (from_file) {
      row.push_back(number(r, "lr"));
      row.push_back(fixed(r, "grad_norm", "%.6g"));
    } else {
      row.push_back("-");
      row.push_back("-");
    }
    auto tps = r.find("tokens_per_s");
    row.push_back(tps != r.end() && tps->is_number() ? format_rate(tps->get<double>()) : "-");
    if (from_file) {
      row.push_back(fixed(r, "step_ms", "%.1f"));
    } else {
      auto st = r.find("step_time_s");
      row.push_back(st != r.end() && st->is_number()
                        ? fixed({{"ms", 1e3 * st->get<double>()}}, "ms", "%.1f")
                        : "-");
    }
    if (nodes) row.push_back(printable(r.value("node", "")));
    rows.push_back(std::move(row));
  }
  std::vector<std::string> header{"STEP", "ATTEMPT", "LOSS", "LR", "GRAD_NORM", "TOK/S", "STEP_MS"};
  if (nodes) header.push_back("NODE");
  return format_table(header, rows, {0, 1, 5, 6});
}

int run_steps(const StepsOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    int64_t job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    auto info = c.status(job);
    std::vector<json> recs;
    bool from_file = false;
    const std::string file = info.job_dir.empty() ? "" : info.job_dir + "/steps.jsonl";
    std::error_code ec;
    if (o.source != "coordinator" && !file.empty() && std::filesystem::is_regular_file(file, ec) &&
        ::access(file.c_str(), R_OK) == 0) {
      recs = read_steps_file(file, o.after);
      from_file = true;
    } else if (o.source == "file") {
      std::cerr << "ringctl: job " << job << ": "
                << (file.empty() ? std::string("the coordinator records no job directory")
                                 : file + " cannot be read here")
                << " (leave out --source file to read the coordinator's records)\n";
      return kExitFailed;
    } else {
      // Pages by step: a full page may end inside one step's reports (several nodes or
      // attempts), so its last step is asked for again with the next page.
      constexpr int64_t kPage = 10000;
      for (int64_t after = o.after;;) {
        auto page = c.steps(job, after, kPage);
        int64_t last = page.empty() ? after : page.back().step;
        bool full = static_cast<int64_t>(page.size()) == kPage && page.front().step != last;
        for (const auto& st : page)
          if (!full || st.step != last) recs.push_back(coordinator_record(st));
        if (static_cast<int64_t>(page.size()) < kPage) break;
        after = full ? recs.back()["step"].get<int64_t>() : last;
      }
    }
    if (o.last > 0 && recs.size() > static_cast<size_t>(o.last))
      recs.erase(recs.begin(), recs.end() - o.last);
    if (o.json) {
      for (const auto& r : recs) std::cout << r.dump() << "\n";
      return kExitOk;
    }
    if (recs.empty()) {
      std::cout << "job " << job << " has no recorded steps yet\n";
      return kExitOk;
    }
    std::cout << render(recs, from_file);
    return kExitOk;
  });
}

}  // namespace

Subcommand add_steps(CLI::App& app) {
  auto o = std::make_shared<StepsOpts>();
  auto* s = app.add_subcommand(
      "steps", "A job's per-step loss, learning rate, gradient norm and speed, as recorded");
  s->add_option("job", o->job, "Job id")->required();
  s->add_flag("--json", o->json, "One JSON object per line, as recorded");
  s->add_option("--after", o->after, "Only steps after this one")
      ->check(flags::integer_in(0, int64_t{1} << 53));
  s->add_option("--last", o->last, "Only the last N records")->check(flags::integer_in(1, 1000000000));
  s->add_option("--source", o->source,
                "auto: the job's steps.jsonl when readable here, else the coordinator's records; "
                "file; coordinator")
      ->check(CLI::IsMember({"auto", "file", "coordinator"}))
      ->capture_default_str();
  o->coord.add_to(s);
  return {s, [o] { return run_steps(*o); }};
}

}  // namespace ring::cli
