#include "common/slurm/slurm_cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <set>
#include <sstream>
#include <thread>

#include "common/topology/hostlist.h"

namespace ring::slurm {

namespace {

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

bool key_token(std::string_view t) {
  auto eq = t.find('=');
  if (eq == 0 || eq == std::string_view::npos) return false;
  if (!std::isalpha(static_cast<unsigned char>(t[0]))) return false;
  for (size_t i = 0; i < eq; ++i) {
    unsigned char c = t[i];
    if (!std::isalnum(c) && c != '/' && c != ':' && c != '_' && c != '-') return false;
  }
  return true;
}

std::string none_to_empty(const std::string& v) {
  if (v == "None" || v == "(null)" || v == "Unknown" || v == "N/A") return "";
  return v;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, int timeout_ms) {
  if (argv.empty()) throw SlurmError("run_command: empty command");
  std::string exe = proc::find_executable(argv[0]);
  if (exe.empty())
    throw SlurmError(fmt::format("{}: not found in PATH; is Slurm's client installed "
                                 "(slurm-client) and PATH set?",
                                 argv[0]));
  proc::RunOptions o;
  o.timeout_ms = timeout_ms;
  o.executable = exe;
  try {
    return proc::run_command(argv, o);
  } catch (const proc::RunError& e) {
    throw SlurmError(e.what());
  }
}

std::map<std::string, std::string> parse_scontrol_record(std::string_view line) {
  std::map<std::string, std::string> m;
  std::string last;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t e = i;
    while (e < line.size() && !std::isspace(static_cast<unsigned char>(line[e]))) ++e;
    if (e == i) break;
    std::string_view tok = line.substr(i, e - i);
    if (key_token(tok)) {
      auto eq = tok.find('=');
      last = std::string(tok.substr(0, eq));
      m[last] = std::string(tok.substr(eq + 1));
    } else if (!last.empty()) {
      m[last] += " ";
      m[last] += tok;
    }
    i = e;
  }
  return m;
}

JobView job_view_from_scontrol(const std::map<std::string, std::string>& rec) {
  auto get = [&](const char* k) {
    auto it = rec.find(k);
    return it == rec.end() ? std::string() : it->second;
  };
  JobView v;
  v.id = get("JobId");
  v.found = !v.id.empty();
  v.source = "scontrol";
  v.state = get("JobState");
  v.reason = none_to_empty(get("Reason"));
  v.nodes = none_to_empty(get("NodeList"));
  std::string rs = get("Restarts");
  if (!rs.empty() && std::all_of(rs.begin(), rs.end(), ::isdigit) && rs.size() < 10)
    v.restarts = std::stoll(rs);
  v.exit_code = get("ExitCode");
  v.partition = get("Partition");
  v.run_time = get("RunTime");
  v.time_limit = get("TimeLimit");
  v.submit_time = none_to_empty(get("SubmitTime"));
  v.start_time = none_to_empty(get("StartTime"));
  return v;
}

bool valid_job_id(std::string_view id) {
  if (id.empty() || id.size() > 32) return false;
  size_t us = id.find('_');
  auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), ::isdigit);
  };
  if (us == std::string_view::npos) return digits(id);
  return digits(id.substr(0, us)) && digits(id.substr(us + 1));
}

std::string parse_sbatch_parsable(std::string_view out) {
  std::string s = trim(std::string(out));
  // sbatch may print warnings before the id; the id is the last line.
  auto nl = s.rfind('\n');
  if (nl != std::string::npos) s = s.substr(nl + 1);
  auto semi = s.find(';');
  if (semi != std::string::npos) s = s.substr(0, semi);
  if (!valid_job_id(s))
    throw SlurmError(fmt::format("sbatch --parsable printed '{}', not a job id",
                                 std::string(out.substr(0, 200))));
  return s;
}

std::string sbatch(const std::string& script_path, const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv{"sbatch", "--parsable"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.push_back(script_path);
  auto r = run_command(argv, 60000);
  if (r.exit_code != 0) throw SlurmError("sbatch refused the job: " + proc::describe(argv, r));
  return parse_sbatch_parsable(r.out);
}

std::map<std::string, JobView> query_jobs(const std::vector<std::string>& ids) {
  std::map<std::string, JobView> out;
  std::set<std::string> want;
  for (const auto& id : ids) {
    if (!valid_job_id(id)) throw SlurmError(fmt::format("'{}' is not a Slurm job id", id));
    want.insert(id);
    out[id].id = id;
  }
  if (want.empty()) return out;
  // One call for every job slurmctld still holds (queued, running, finished < MinJobAge).
  std::vector<std::string> argv{"scontrol", "show", "job", "-o"};
  auto r = run_command(argv, 30000);
  if (r.exit_code != 0 && r.out.empty())
    throw SlurmError("cannot ask Slurm about jobs: " + proc::describe(argv, r));
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    auto rec = parse_scontrol_record(line);
    auto v = job_view_from_scontrol(rec);
    std::string key = v.id;
    // An array task shows ArrayJobId/ArrayTaskId; the plain id is what sbatch printed.
    if (want.count(key) && !out[key].found) out[key] = v;
  }
  std::vector<std::string> missing;
  for (const auto& id : want)
    if (!out[id].found) missing.push_back(id);
  if (missing.empty()) return out;
  std::string list;
  for (const auto& id : missing) list += (list.empty() ? "" : ",") + id;
  std::vector<std::string> sa{"sacct", "-n", "-P", "-X", "-j", list,
                              "-o", "JobIDRaw,State,Reason,NodeList,ExitCode,Partition,Elapsed,Timelimit,Submit,Start"};
  CommandResult s;
  try {
    s = run_command(sa, 30000);
  } catch (const SlurmError&) {
    return out;  // no sacct: those jobs stay not found
  }
  if (s.exit_code != 0) return out;  // accounting disabled: not found
  std::istringstream sin(s.out);
  while (std::getline(sin, line)) {
    std::vector<std::string> f;
    std::string cell;
    std::istringstream ls(line);
    while (std::getline(ls, cell, '|')) f.push_back(cell);
    if (f.size() < 10 || !want.count(f[0])) continue;
    JobView v;
    v.id = f[0];
    v.found = true;
    v.source = "sacct";
    v.state = f[1].substr(0, f[1].find(' '));  // "CANCELLED by 0" -> CANCELLED
    v.reason = none_to_empty(f[2]);
    v.nodes = none_to_empty(f[3]);
    v.exit_code = f[4];
    v.partition = f[5];
    v.run_time = f[6];
    v.time_limit = f[7];
    v.submit_time = none_to_empty(f[8]);
    v.start_time = none_to_empty(f[9]);
    out[v.id] = v;
  }
  return out;
}

void cancel(const std::string& id) {
  if (!valid_job_id(id)) throw SlurmError(fmt::format("'{}' is not a Slurm job id", id));
  std::vector<std::string> argv{"scancel", id};
  auto r = run_command(argv, 30000);
  if (r.exit_code != 0) throw SlurmError("scancel failed: " + proc::describe(argv, r));
}

void requeue(const std::string& id) {
  if (!valid_job_id(id)) throw SlurmError(fmt::format("'{}' is not a Slurm job id", id));
  std::vector<std::string> argv{"scontrol", "requeue", id};
  auto r = run_command(argv, 30000);
  if (r.exit_code != 0) throw SlurmError("scontrol requeue failed: " + proc::describe(argv, r));
}

namespace {

std::map<std::string, std::string> show_job(const std::string& id) {
  std::vector<std::string> argv{"scontrol", "show", "job", "-o", id};
  auto r = run_command(argv, 30000);
  if (r.exit_code != 0) throw SlurmError("cannot ask Slurm about the job: " + proc::describe(argv, r));
  std::string line = r.out.substr(0, r.out.find('\n'));
  return parse_scontrol_record(line);
}

}  // namespace

std::vector<std::string> parse_unhealthy_nodes(std::string_view sinfo_out) {
  std::vector<std::string> out;
  std::istringstream in{std::string(sinfo_out)};
  std::string line;
  while (std::getline(in, line)) {
    auto bar = line.find('|');
    if (bar == std::string::npos || bar == 0) continue;
    std::string node = line.substr(0, bar), state = line.substr(bar + 1);
    while (!state.empty() && std::isspace(static_cast<unsigned char>(state.back()))) state.pop_back();
    std::transform(state.begin(), state.end(), state.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    bool bad = state.find("down") != std::string::npos ||
               state.find("drain") != std::string::npos ||
               state.find("fail") != std::string::npos ||
               state.find("no_respond") != std::string::npos ||
               (!state.empty() && state.back() == '*');  // not responding
    if (bad && std::find(out.begin(), out.end(), node) == out.end()) out.push_back(node);
  }
  return out;
}

std::vector<std::string> unhealthy_nodes() {
  std::vector<std::string> argv{"sinfo", "-h", "-N", "-o", "%N|%T"};
  auto r = run_command(argv, 30000);
  if (r.exit_code != 0) throw SlurmError("cannot ask Slurm about nodes: " + proc::describe(argv, r));
  return parse_unhealthy_nodes(r.out);
}

std::string requeue_excluding(const std::string& id, const std::vector<std::string>& nodes,
                              int timeout_ms) {
  if (!valid_job_id(id)) throw SlurmError(fmt::format("'{}' is not a Slurm job id", id));
  for (const auto& n : nodes)
    if (n.empty() || n.find_first_of(",[] \t\n=") != std::string::npos)
      throw SlurmError(fmt::format("'{}' is not a node name", n));
  auto rec = show_job(id);
  // Keep what the user excluded (sbatch --exclude, or an earlier exclusion), in hostlist form.
  std::vector<std::string> exclude;
  std::string had = none_to_empty(rec["ExcNodeList"]);
  if (!had.empty()) {
    try {
      exclude = topology::expand_hostlist(had);
    } catch (const std::exception& e) {
      throw SlurmError(fmt::format("job {}: ExcNodeList '{}' is not a hostlist: {}", id, had,
                                   e.what()));
    }
  }
  for (const auto& n : nodes)
    if (std::find(exclude.begin(), exclude.end(), n) == exclude.end()) exclude.push_back(n);
  std::string list;
  for (const auto& n : exclude) list += (list.empty() ? "" : ",") + n;

  std::string state = rec["JobState"];
  bool held = false;
  if (state != "PENDING") {
    std::vector<std::string> argv{"scontrol", "requeuehold", id};
    auto r = run_command(argv, 30000);
    if (r.exit_code != 0)
      throw SlurmError("scontrol requeuehold failed: " + proc::describe(argv, r));
    held = true;
  }
  // Slurm refuses the update ("no longer pending") until the requeue has taken effect.
  std::vector<std::string> update{"scontrol", "update", "JobId=" + id, "ExcNodeList=" + list};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string failure;
  for (;;) {
    auto r = run_command(update, 30000);
    if (r.exit_code == 0) {
      failure.clear();
      break;
    }
    failure = "scontrol update failed: " + proc::describe(update, r);
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (held) {
    std::vector<std::string> argv{"scontrol", "release", id};
    auto r = run_command(argv, 30000);
    if (r.exit_code != 0)
      throw SlurmError((failure.empty() ? "" : failure + "; ") +
                       "scontrol release failed (the job stays held: scontrol release " + id +
                       "): " + proc::describe(argv, r));
  }
  if (!failure.empty()) throw SlurmError(failure + " (the job was requeued without it)");
  return list;
}

std::string summary(const JobView& v) {
  if (!v.found) return "not known to Slurm (finished long ago, or another cluster)";
  std::string s = v.state;
  if (!v.nodes.empty() && v.state != "PENDING") s += " on " + v.nodes;
  if (!v.reason.empty()) s += " (" + v.reason + ")";
  bool ended = v.state == "COMPLETED" || v.state == "FAILED" || v.state == "CANCELLED" ||
               v.state == "TIMEOUT" || v.state == "NODE_FAIL" || v.state == "OUT_OF_MEMORY" ||
               v.state == "PREEMPTED" || v.state == "BOOT_FAIL" || v.state == "DEADLINE";
  if (ended && !v.exit_code.empty()) s += ", exit " + v.exit_code;
  if (v.restarts > 0)
    s += fmt::format(", {} restart{}", v.restarts, v.restarts == 1 ? "" : "s");
  return s;
}

nlohmann::json to_json(const JobView& v) {
  return {{"id", v.id},
          {"found", v.found},
          {"source", v.source},
          {"state", v.state},
          {"reason", v.reason},
          {"nodes", v.nodes},
          {"restarts", v.restarts},
          {"exit_code", v.exit_code},
          {"partition", v.partition},
          {"run_time", v.run_time},
          {"time_limit", v.time_limit}};
}

bool spank_plugin_active() {
  try {
    auto r = run_command({"srun", "--help"}, 15000);
    return r.exit_code == 0 && r.out.find("--ring-job") != std::string::npos;
  } catch (const SlurmError&) {
    return false;
  }
}

}  // namespace ring::slurm
