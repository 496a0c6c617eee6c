// ringctl status [JOB] [--json] [--follow]: the jobs ring-coord knows, in the spirit of squeue.
//
//   JOBID  NAME  USER  STATE    STEP/TOTAL  LOSS    TOK/S  ATTEMPT  NODES  AGE    CKPT
//   7      tiny  ada   running  120/200     2.3456  14.2k  1        1      3m05s  100
//
// With JOB: the same row plus the details (reason, restarts, ring order, directories) and the
// observability findings: the current straggler and the latest hang (docs/observability.md;
// --json: "straggler" and "hang", null when none).
// --json: the coordinator's job objects (an array; one object with JOB). --follow: refresh every
// --interval seconds until Ctrl-C; with JOB it ends when the job reaches a final state. Not on
// a terminal, --follow prints a new table (or JSON line) only when something changed.
// As squeue and sacct: -u/--user and -t/--states select jobs, --format chooses the columns
// ("id,name:20,state,step,loss,elapsed"), --noheader leaves the header out, --parsable prints
// the cells '|'-separated without padding.
#include <pwd.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"
#include "cli/slurm_control.h"

namespace ring::cli {

namespace {

struct StatusOpts {
  CoordFlags coord;
  std::string job;
  bool json = false;
  bool follow = false;
  double interval = 2;
  bool noheader = false;
  bool parsable = false;
  std::string format;
  std::vector<std::string> users;   // -u: names or uids
  std::vector<std::string> states;  // -t: as given; checked and lowered when parsed
};

// The job states ring-coord reports (coordinator/job_state.h, kAllJobStates).
const std::vector<std::string>& job_states() {
  static const std::vector<std::string> s{"pending",    "starting",   "running",
                                          "restarting", "completing", "completed",
                                          "failed",     "cancelling", "cancelled",
                                          "stopped"};
  return s;
}

bool final_state(const std::string& s) {
  return s == "completed" || s == "failed" || s == "cancelled" || s == "stopped";
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string text_or_dash(const std::string& s) {
  return s.empty() ? "-" : printable(s);
}

using Views = std::map<std::string, slurm::JobView>;

// One column of the table: its --format name, header, alignment and cell.
struct Field {
  std::string name;
  std::string header;
  bool right = false;
  std::function<std::string(const protocol::JobInfo&, double now, Views&)> cell;
};

const std::vector<Field>& fields() {
  using J = protocol::JobInfo;
  static const std::vector<Field> f{
      {"id", "JOBID", true, [](const J& j, double, Views&) { return std::to_string(j.job); }},
      {"name", "NAME", false, [](const J& j, double, Views&) { return printable(j.name); }},
      {"user", "USER", false,
       [](const J& j, double, Views&) {
         return j.owner.empty() ? std::to_string(j.owner_uid) : printable(j.owner);
       }},
      {"uid", "UID", true, [](const J& j, double, Views&) { return std::to_string(j.owner_uid); }},
      {"state", "STATE", false, [](const J& j, double, Views&) { return state_color(j.state); }},
      {"reason", "REASON", false,
       [](const J& j, double, Views&) { return text_or_dash(j.state_reason); }},
      {"step", "STEP/TOTAL", false,
       [](const J& j, double, Views&) {
         return std::to_string(j.step) + "/" + std::to_string(j.total_steps);
       }},
      {"loss", "LOSS", true,
       [](const J& j, double, Views&) {
         char loss[32] = "-";
         if (j.loss) std::snprintf(loss, sizeof loss, "%.4f", *j.loss);
         return std::string(loss);
       }},
      {"tok_s", "TOK/S", true,
       [](const J& j, double, Views&) {
         return j.tokens_per_s ? format_rate(*j.tokens_per_s) : "-";
       }},
      {"attempt", "ATTEMPT", true,
       [](const J& j, double, Views&) { return std::to_string(j.attempt); }},
      {"restarts", "RESTARTS", true,
       [](const J& j, double, Views&) { return std::to_string(j.restarts); }},
      {"nodes", "NODES", true,
       [](const J& j, double, Views&) {
         return j.nodes.empty() ? std::string("-") : std::to_string(j.nodes.size());
       }},
      {"nodelist", "NODELIST", false,
       [](const J& j, double, Views&) {
         std::vector<std::string> n;
         for (const auto& x : j.nodes) n.push_back(printable(x));
         return n.empty() ? std::string("-") : joined(n, ",");
       }},
      {"age", "AGE", false,
       [](const J& j, double now, Views&) { return format_duration(now - j.created_at); }},
      // Like sacct's Elapsed: until now, or until the job ended.
      {"elapsed", "ELAPSED", false,
       [](const J& j, double now, Views&) {
         return format_duration((final_state(j.state) ? j.updated_at : now) - j.created_at);
       }},
      {"submitted", "SUBMITTED", false,
       [](const J& j, double, Views&) { return format_time(j.created_at); }},
      {"ckpt", "CKPT", true,
       [](const J& j, double, Views&) {
         return j.last_checkpoint_step ? std::to_string(*j.last_checkpoint_step) : "-";
       }},
      {"jobdir", "JOBDIR", false,
       [](const J& j, double, Views&) { return text_or_dash(j.job_dir); }},
      // Jobs submitted to Slurm: its id and state ("1234:RUNNING", "1234:PENDING(Resources)").
      {"slurm", "SLURM", false,
       [](const J& j, double, Views& views) {
         if (j.slurm_job_id.empty()) return std::string("-");
         const auto& v = views[j.slurm_job_id];
         std::string cell = j.slurm_job_id + ":" + (v.found ? v.state : "?");
         if (v.found && v.state == "PENDING" && !v.reason.empty()) cell += "(" + v.reason + ")";
         return printable(cell);
       }},
  };
  return f;
}

std::vector<std::string> field_names() {
  std::vector<std::string> n;
  for (const auto& f : fields()) n.push_back(f.name);
  return n;
}

// A --format column: a field and its width (0: as wide as its widest cell).
struct Column {
  const Field* field = nullptr;
  size_t width = 0;
};

// --format "id,name:20,state" (names case-insensitive). Returns "" or what is wrong.
std::string parse_format(const std::string& format, std::vector<Column>* out) {
  std::vector<Column> cols;
  std::stringstream ss(format);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string name = lower(item.substr(0, item.find(':')));
    Column c;
    for (const auto& f : fields())
      if (f.name == name) c.field = &f;
    if (!c.field) {
      auto near = closest(name, field_names());
      return "unknown field '" + printable(name) + "'" +
             (near.empty() ? "" : "; did you mean '" + near + "'?") +
             " (fields: " + joined(field_names(), ",") + ")";
    }
    if (auto colon = item.find(':'); colon != std::string::npos) {
      std::string w = item.substr(colon + 1);
      bool digits = !w.empty() && w.size() <= 4 &&
                    std::all_of(w.begin(), w.end(), [](char ch) { return std::isdigit(ch); });
      if (!digits || std::stoi(w) < 1 || std::stoi(w) > 1000)
        return "field '" + name + "': width '" + printable(w) + "' is not an integer in [1, 1000]";
      c.width = static_cast<size_t>(std::stoi(w));
    }
    cols.push_back(c);
  }
  if (cols.empty()) return "no fields (fields: " + joined(field_names(), ",") + ")";
  if (out) *out = std::move(cols);
  return "";
}

// The default columns; SLURM only when some job was submitted to Slurm.
std::vector<Column> columns(const StatusOpts& o, const std::vector<protocol::JobInfo>& jobs) {
  std::vector<Column> cols;
  if (!o.format.empty()) {
    parse_format(o.format, &cols);  // checked when parsed
    return cols;
  }
  bool slurm =
      std::any_of(jobs.begin(), jobs.end(), [](const auto& j) { return !j.slurm_job_id.empty(); });
  parse_format(std::string("id,name,user,state,step,loss,tok_s,attempt,nodes,age,ckpt") +
                   (slurm ? ",slurm" : ""),
               &cols);
  return cols;
}

// A cell cut to a --format width (as squeue does), counting characters, not bytes; ANSI colour
// codes take no room.
std::string fit(const std::string& cell, size_t width) {
  std::string out;
  size_t chars = 0;
  bool painted = false;
  for (size_t i = 0; i < cell.size(); ++i) {
    if (cell[i] == '\033') {
      size_t end = cell.find('m', i);
      out += cell.substr(i, end - i + 1);
      painted = true;
      i = end;
      continue;
    }
    if ((static_cast<unsigned char>(cell[i]) & 0xC0) != 0x80 && chars++ == width) break;
    out += cell[i];
  }
  if (painted && out.rfind("\033[0m") != out.size() - 4) out += "\033[0m";
  return out + std::string(width > chars ? width - chars : 0, ' ');
}

std::string strip_ansi(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\033')
      i = s.find('m', i);
    else
      out += s[i];
  }
  return out;
}

std::string table(const std::vector<protocol::JobInfo>& jobs, const StatusOpts& o) {
  double now = now_unix();
  auto cols = columns(o, jobs);
  Views views;
  if (std::any_of(cols.begin(), cols.end(),
                  [](const Column& c) { return c.field->name == "slurm"; }))
    views = slurm_views(jobs);
  std::vector<std::string> header;
  std::vector<size_t> right;
  std::vector<std::vector<std::string>> rows(jobs.size());
  for (size_t c = 0; c < cols.size(); ++c) {
    const auto& col = cols[c];
    header.push_back(col.width ? fit(col.field->header, col.width) : col.field->header);
    if (col.field->right) right.push_back(c);
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::string cell = col.field->cell(jobs[i], now, views);
      rows[i].push_back(col.width ? fit(cell, col.width) : cell);
    }
  }
  if (o.parsable) {
    std::string out = o.noheader ? "" : joined(header, "|") + "\n";
    for (auto& r : rows) {
      for (auto& cell : r) cell = strip_ansi(cell);
      out += joined(r, "|") + "\n";
    }
    return out;
  }
  std::string out = format_table(header, rows, right);
  return o.noheader ? out.substr(out.find('\n') + 1) : out;
}

// -u and -t: the jobs of these users (names or uids) in these states; all when not given.
std::vector<protocol::JobInfo> selected(std::vector<protocol::JobInfo> jobs, const StatusOpts& o) {
  auto keep = [&](const protocol::JobInfo& j) {
    bool user =
        o.users.empty() || std::any_of(o.users.begin(), o.users.end(), [&](const std::string& u) {
          return u == j.owner || u == std::to_string(j.owner_uid);
        });
    bool state = o.states.empty() ||
                 std::find(o.states.begin(), o.states.end(), lower(j.state)) != o.states.end();
    return user && state;
  };
  jobs.erase(std::remove_if(jobs.begin(), jobs.end(), [&](const auto& j) { return !keep(j); }),
             jobs.end());
  return jobs;
}

// job_json plus, for a job submitted to Slurm, "slurm": Slurm's view (slurm::to_json).
nlohmann::json job_json_with_slurm(const protocol::JobInfo& j,
                                   std::map<std::string, slurm::JobView>& views) {
  auto o = job_json(j);
  if (!j.slurm_job_id.empty()) o["slurm"] = slurm::to_json(views[j.slurm_job_id]);
  return o;
}

// The job's current observability findings from its events (docs/observability.md):
// "straggler": the latest `straggler` event of the current attempt not followed by a
// `straggler_cleared` of that rank from the same source (null: none; sources: "node", a ringd
// over its own ranks, and "coordinator", ring-coord over every node's ranks), "stragglers": every
// such rank once (the newest of its sources' findings), "hang": the latest hang of any attempt, the
// `hang` events of every node for that attempt and step merged (null: none); each the event's
// data plus "attempt" and "time".
nlohmann::json findings(coord::Client& c, const protocol::JobInfo& j) {
  nlohmann::json hang;
  // (rank, source) -> its current finding (null: cleared), and the order they were named in.
  std::map<std::pair<int64_t, std::string>, nlohmann::json> named;
  int64_t seq = 0;
  int64_t after = 0;
  for (int page = 0; page < 500; ++page) {
    const auto ev = c.events(j.job, after, 200);
    for (const auto& e : ev) {
      after = std::max(after, e.id);
      nlohmann::json d = e.data;
      d["attempt"] = e.attempt;
      d["time"] = e.time;
      if (e.kind == "hang") {
        // Each node reports what it sees of one hang: merge the reports of the same attempt and
        // step (the ranks missing anywhere, every waiting rank), the latest hang wins.
        if (hang.is_object() && hang.value("attempt", -1) == e.attempt &&
            hang.value("step", -1) == d.value("step", -2)) {
          for (const auto& r : d.value("missing", nlohmann::json::array()))
            if (std::find(hang["missing"].begin(), hang["missing"].end(), r) ==
                hang["missing"].end())
              hang["missing"].push_back(r);
          for (const auto& w : d.value("waiting", nlohmann::json::array()))
            hang["waiting"].push_back(w);
          hang["time"] = e.time;
        } else {
          hang = d;
          if (!hang.contains("missing")) hang["missing"] = nlohmann::json::array();
          if (!hang.contains("waiting")) hang["waiting"] = nlohmann::json::array();
        }
      }
      if (e.attempt != j.attempt) continue;
      if (e.kind != "straggler" && e.kind != "straggler_cleared") continue;
      if (!e.data.contains("rank") || !e.data["rank"].is_number_integer()) continue;
      const auto key = std::make_pair(e.data["rank"].get<int64_t>(),
                                      e.data.value("source", std::string("node")));
      if (!d.contains("source")) d["source"] = key.second;
      d["seq"] = ++seq;
      named[key] = e.kind == "straggler" ? d : nlohmann::json();
    }
    if (ev.size() < 200) break;
  }
  // One finding per rank (a rank both a ringd and ring-coord name is one culprit), newest first.
  std::map<int64_t, nlohmann::json> per_rank;
  for (auto& [key, d] : named) {
    if (!d.is_object()) continue;
    auto it = per_rank.find(key.first);
    if (it == per_rank.end() || it->second.value("seq", 0) < d.value("seq", 0))
      per_rank[key.first] = d;
  }
  nlohmann::json stragglers = nlohmann::json::array();
  for (auto& [rank, d] : per_rank) stragglers.push_back(d);
  std::sort(stragglers.begin(), stragglers.end(),
            [](const nlohmann::json& a, const nlohmann::json& b) {
              return a.value("seq", 0) > b.value("seq", 0);
            });
  for (auto& d : stragglers) d.erase("seq");
  nlohmann::json straggler = stragglers.empty() ? nlohmann::json() : stragglers[0];
  return {{"straggler", straggler}, {"stragglers", stragglers}, {"hang", hang}};
}

std::string finding_lines(const nlohmann::json& f) {
  std::ostringstream os;
  for (const nlohmann::json& s : f["stragglers"]) {
    os << "straggler:    rank " << s.value("rank", -1) << " on "
       << printable(s.value("node", std::string("?")))
       << fmt::format(" ({:.3f} s behind per step, last in {} of the recent steps, step {}{})",
                      s.value("behind_s", 0.0), s.value("steps", 0), s.value("step", 0),
                      s.value("source", std::string()) == "coordinator"
                          ? "; named by ring-coord across nodes"
                          : "")
       << "\n";
  }
  if (f["stragglers"].empty()) os << "straggler:    none\n";
  const nlohmann::json& h = f["hang"];
  if (h.is_object()) {
    std::string missing;
    for (const auto& r : h.value("missing", nlohmann::json::array()))
      missing += (missing.empty() ? "" : ", ") + r.dump();
    os << "hang:         attempt " << h.value("attempt", 0) << " step " << h.value("step", 0)
       << fmt::format(" (deadline {:g} s): never arrived: ", h.value("deadline_s", 0.0))
       << (missing.empty() ? "none on the reporting node" : missing) << "\n";
    for (const auto& w : h.value("waiting", nlohmann::json::array()))
      os << "              rank " << w.value("rank", -1) << " waits: "
         << printable(w.value("where", std::string("?"))) << "\n";
  }
  return os.str();
}

std::string details(const protocol::JobInfo& j) {
  std::ostringstream os;
  auto join = [](const std::vector<std::string>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + printable(v[i]);
    return s.empty() ? std::string("-") : s;
  };
  os << table({j}, StatusOpts{}) << "\n";
  os << "state:        " << state_color(j.state)
     << (j.state_reason.empty() ? "" : " (" + printable(j.state_reason) + ")") << "\n";
  os << "restarts:     " << j.restarts << " of " << j.max_restarts << " automatic\n";
  os << "nodes:        " << join(j.nodes, " ") << "\n";
  os << "ring order:   " << join(j.ring_order, " -> ") << "\n";
  os << "job dir:      " << (j.job_dir.empty() ? "-" : printable(j.job_dir)) << "\n";
  os << "checkpoints:  " << (j.checkpoint_dir.empty() ? "-" : printable(j.checkpoint_dir))
     << (j.last_checkpoint_step
             ? " (latest complete: step " + std::to_string(*j.last_checkpoint_step) + ")"
             : " (none complete yet)")
     << "\n";
  if (!j.slurm_job_id.empty()) {
    auto v = slurm_views({j});
    os << "slurm job:    " << printable(j.slurm_job_id) << ": "
       << printable(slurm::summary(v[j.slurm_job_id])) << "\n";
    if (!j.excluded_nodes.empty())
      os << "excluded:     " << printable(join(j.excluded_nodes, " "))
         << " (failed an attempt; never allocated again: `ringctl events " << j.job
         << "` node_excluded)\n";
  }
  os << "spec:         " << printable(j.spec_hash) << "\n";
  os << "submitted:    " << format_time(j.created_at) << "; updated " << format_time(j.updated_at)
     << "\n";
  return os.str();
}

int run_status(const StatusOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    std::optional<int64_t> job;
    if (!o.job.empty()) job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    auto fetch = [&] {
      return selected(job ? std::vector<protocol::JobInfo>{c.status(*job)} : c.status(), o);
    };
    // With JOB, the details; with a column option, the rows (a script's view of one job).
    const bool rows_only = !o.format.empty() || o.noheader || o.parsable;
    auto render = [&](const std::vector<protocol::JobInfo>& jobs) -> std::string {
      if (o.json) {
        auto views = slurm_views(jobs);
        if (job && !jobs.empty()) {
          nlohmann::json one = job_json_with_slurm(jobs[0], views);
          const nlohmann::json f = findings(c, jobs[0]);
          one["straggler"] = f["straggler"];
          one["stragglers"] = f["stragglers"];
          one["hang"] = f["hang"];
          return one.dump(o.follow ? -1 : 2) + "\n";
        }
        nlohmann::json a = nlohmann::json::array();
        for (const auto& j : jobs) a.push_back(job_json_with_slurm(j, views));
        return a.dump(o.follow ? -1 : 2) + "\n";
      }
      if (jobs.empty() && rows_only) return table(jobs, o);
      if (jobs.empty())
        return o.users.empty() && o.states.empty()
                   ? "no jobs (submit one with `ringctl run SPEC` or `ringctl submit`)\n"
                   : "no jobs of " + (o.users.empty() ? "any user" : joined(o.users, ",")) +
                         " in " + (o.states.empty() ? "any state" : joined(o.states, ",")) + "\n";
      return job && !rows_only ? details(jobs[0]) + finding_lines(findings(c, jobs[0]))
                               : table(jobs, o);
    };
    if (!o.follow) {
      std::cout << render(fetch());
      return kExitOk;
    }
    install_stop_signals();
    bool tty = stdout_is_tty() && !o.json;
    std::string last;
    while (true) {
      auto jobs = fetch();
      // Ages change every second: compare what changed apart from them.
      std::string key = o.json ? render(jobs) : [&] {
        std::string k;
        for (const auto& j : jobs) k += job_json(j).dump();
        return k;
      }();
      if (tty) {
        std::cout << "\033[H\033[2J" << format_time(now_unix()) << "  (every " << o.interval
                  << " s; Ctrl-C to stop)\n\n"
                  << render(jobs) << std::flush;
      } else if (key != last) {
        std::cout << render(jobs) << (o.json ? "" : "\n") << std::flush;
      }
      last = key;
      if (job && (jobs.empty() || final_state(jobs[0].state))) break;
      if (!sleep_unless_stopped(o.interval)) break;
    }
    return kExitOk;
  });
}

}  // namespace

Subcommand add_status(CLI::App& app) {
  auto o = std::make_shared<StatusOpts>();
  auto* s = app.add_subcommand("status", "Jobs, their state and progress (like squeue)");
  s->add_option("job", o->job, "Only this job, with details");
  s->add_flag("--json", o->json, "Machine-readable output (the coordinator's job objects)");
  s->add_flag("-f,--follow", o->follow,
              "Refresh until Ctrl-C (with JOB: until the job ends); not on a terminal, print "
              "only changes");
  s->add_option("--interval", o->interval, "Seconds between refreshes with --follow")
      ->check(flags::seconds_in(0.1, 3600.0))
      ->capture_default_str();
  s->add_flag("--noheader", o->noheader, "Leave the header line out");
  s->add_flag("--parsable", o->parsable,
              "Cells separated by '|', no padding, no colour (for scripts)");
  s->add_option("-o,--format", o->format,
                "Columns: a comma list of fields, each with an optional width (name:20 cuts or "
                "pads to 20): " +
                    joined(field_names(), ",") +
                    " (default id,name,user,state,step,loss,tok_s,attempt,nodes,age,ckpt, and "
                    "slurm when a job has a Slurm id)")
      ->type_name("FIELDS")
      ->check(
          CLI::Validator([](std::string& v) { return parse_format(v, nullptr); }, "", "FORMAT"));
  s->add_option("-u,--user", o->users, "Only jobs of these users (comma list of names or uids)")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name("USERS")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            bool uid = !v.empty() && v.size() <= 10 &&
                       std::all_of(v.begin(), v.end(), [](char c) { return std::isdigit(c); });
            if (uid || ::getpwnam(v.c_str())) return "";
            return "unknown user '" + printable(v) + "' (a user name of this system, or a uid)";
          },
          "", "USER"));
  s->add_option("-t,--states", o->states,
                "Only jobs in these states (comma list, any case): " + joined(job_states(), ","))
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name("STATES")
      ->transform(CLI::Validator(  // lowers the state it accepts
          [](std::string& v) -> std::string {
            v = lower(v);
            const auto& all = job_states();
            if (std::find(all.begin(), all.end(), v) != all.end()) return "";
            auto near = closest(v, all);
            return "unknown state '" + printable(v) + "'" +
                   (near.empty() ? "" : "; did you mean '" + near + "'?") +
                   " (states: " + joined(all, ",") + ")";
          },
          "", "STATE"));
  o->coord.add_to(s);
  return {s, [o] { return run_status(*o); }};
}

}  // namespace ring::cli
