#include "cli/ctl_common.h"

#include "common/cli/job_dir.h"
#include "common/files/dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <thread>

#include "common/cli/edit_distance.h"
#include "common/files/atomic_write.h"
#include "common/spec/parse.h"
#include "coordinator/security.h"

namespace ring::cli {

namespace proto = ring::protocol;

void CoordFlags::add_to(CLI::App* app) {
  app->add_option("--coord", endpoint,
                  "Coordinator endpoint, ipc://PATH or tcp://HOST:PORT (default: $RING_COORD, "
                  "else " +
                      coord::default_endpoint() + ")")
      ->check(flags::endpoint_rule(flags::EndpointUse::kConnect));
  app->add_option("--timeout", timeout_s, "Seconds to wait for the coordinator's reply")
      ->check(flags::seconds_in(0.05, 3600.0))
      ->capture_default_str();
  app->add_option("--server-key", server_key_file,
                  "tcp:// only: the coordinator's public key file (<state_dir>/curve/server.pub; "
                  "default $RING_COORD_SERVER_KEY)");
  app->add_option("--client-key", client_key_file,
                  "tcp:// only: this client's CURVE key file, listed in the coordinator's "
                  "curve/clients (default $RING_COORD_CLIENT_KEY)");
}

std::string CoordFlags::resolved_endpoint() const {
  if (!endpoint.empty()) return endpoint;
  if (const char* e = std::getenv("RING_COORD"); e && *e) return e;
  return coord::default_endpoint();
}

coord::ClientOptions CoordFlags::client_options() const {
  coord::ClientOptions o;
  o.endpoint = resolved_endpoint();
  // --coord was checked when parsed; $RING_COORD gets the same rule here.
  if (endpoint.empty())
    if (std::string why = flags::endpoint_error(o.endpoint, flags::EndpointUse::kConnect);
        !why.empty())
      throw CLI::ValidationError("$RING_COORD", why);
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (o.endpoint.rfind("tcp://", 0) == 0) {
    std::string sk = server_key_file, ck = client_key_file;
    if (sk.empty())
      if (const char* e = std::getenv("RING_COORD_SERVER_KEY")) sk = e;
    if (ck.empty())
      if (const char* e = std::getenv("RING_COORD_CLIENT_KEY")) ck = e;
    if (sk.empty())
      throw coord::ConnectError(
          "tcp endpoint " + o.endpoint +
          " needs the coordinator's public key: pass --server-key FILE (the coordinator's "
          "<state_dir>/curve/server.pub) or set RING_COORD_SERVER_KEY");
    if (ck.empty())
      throw coord::ConnectError(
          "tcp endpoint " + o.endpoint +
          " needs a client key pair: pass --client-key FILE (list its public key in the "
          "coordinator's <state_dir>/curve/clients) or set RING_COORD_CLIENT_KEY");
    try {
      o.server_public_key = coord::read_public_key(sk);
      auto pair = coord::read_key_file(ck);
      o.client_public_key = pair.public_key;
      o.client_secret_key = pair.secret_key;
    } catch (const std::exception& e) {
      throw coord::ConnectError(std::string("cannot read CURVE keys: ") + e.what());
    }
  }
  return o;
}

void SetFlags::add_to(CLI::App* app) {
  app->add_option("--set", args,
                  "Override a key of the spec: SECTION.KEY=VALUE, VALUE as YAML (train.steps=5, "
                  "data.paths=[/a,/b]); repeatable, checked like the file's keys")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (spec::parse_override(v)) return "";
            return "expected SECTION.KEY=VALUE (train.steps=5), got '" + printable(v) + "'";
          },
          "", "OVERRIDE"));
}

std::vector<spec::Override> SetFlags::overrides() const {
  std::vector<spec::Override> out;
  for (const auto& a : args) out.push_back(*spec::parse_override(a));
  return out;
}

// Writes `text` to p with exactly `mode` (common/files/atomic_write.h): a unique temporary, then
// rename; the spec copy is private (0600), like every per-user file, and a link at p is never
// written through.
void write_file_as(const std::filesystem::path& p, const std::string& text, mode_t mode) {
  files::write_file_atomic(p.string(), text, mode);
}

int guarded(const std::string& endpoint, const std::function<int()>& body) {
  try {
    return body();
  } catch (const coord::ConnectError& e) {
    std::cerr << "ringctl: " << e.what()
              << "\n  start one with `ring-coord` (see docs/operator-guide.md), point --coord or "
                 "RING_COORD at it, or use `ringctl run SPEC` (it starts its own)\n";
    return kExitNoCoord;
  } catch (const coord::TimeoutError& e) {
    std::cerr << "ringctl: " << e.what() << "\n  no coordinator answers at " << endpoint
              << ": start one with `ring-coord` or use `ringctl run SPEC`; if it is busy, raise "
                 "--timeout\n";
    return kExitNoCoord;
  } catch (const coord::RemoteError& e) {
    std::cerr << "ringctl: " << printable(e.what()) << "\n";
    if (e.code() == proto::code::kNotFound) {
      std::cerr << "  `ringctl status` lists the jobs this coordinator (" << endpoint
                << ") knows\n";
      return kExitNotFound;
    }
    if (e.code() == proto::code::kPermissionDenied) return kExitDenied;
    if (e.code() == proto::code::kInvalidState) return kExitInvalidState;
    return kExitFailed;
  } catch (const coord::ClientError& e) {
    std::cerr << "ringctl: " << e.what() << "\n";
    return kExitFailed;
  } catch (const CLI::ValidationError& e) {
    std::cerr << "ringctl: " << e.what() << "\n";
    return kExitUsage;
  }
}

bool stdout_is_tty() {
  return isatty(STDOUT_FILENO) != 0;
}

bool use_color() {
  const char* nc = std::getenv("NO_COLOR");
  return stdout_is_tty() && !(nc && *nc);
}

std::string paint(const std::string& text, const char* ansi) {
  if (!use_color()) return text;
  return std::string("\033[") + ansi + "m" + text + "\033[0m";
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto esc = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      esc(c);
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      esc(c);
      esc(static_cast<unsigned char>(s[++i]));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string state_color(const std::string& raw) {
  const std::string state = printable(raw);
  if (state == "running" || state == "completed") return paint(state, "32");
  if (state == "failed") return paint(state, "31");
  if (state == "restarting" || state == "cancelling" || state == "cancelled" || state == "lost" ||
      state == "stopped")
    return paint(state, "33");
  return state;
}

std::string format_duration(double s) {
  if (!(s >= 0)) s = 0;
  char buf[32];
  auto t = static_cast<int64_t>(std::llround(s));
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  else if (t < 86400)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(t / 86400),
                  static_cast<long long>(t % 86400 / 3600));
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (v < 1000)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (v < 1e6)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else if (v < 1e9)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  return buf;
}

std::string format_time(double unix_s) {
  time_t t = static_cast<time_t>(unix_s);
  struct tm tm {};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {
// Display width: ANSI escapes take no room; UTF-8 continuation bytes neither.
size_t width(const std::string& s) {
  size_t w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\033') {
      while (i < s.size() && s[i] != 'm') ++i;
      continue;
    }
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++w;
  }
  return w;
}
}  // namespace

std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<size_t>& right) {
  std::vector<size_t> w(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) w[c] = width(header[c]);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], width(r[c]));
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < w.size(); ++c) {
      std::string cell = c < cells.size() ? cells[c] : "";
      size_t pad = w[c] - width(cell);
      bool r = std::find(right.begin(), right.end(), c) != right.end();
      if (c) out += "  ";
      if (r)
        out += std::string(pad, ' ') + cell;
      else
        out += cell + (c + 1 < w.size() ? std::string(pad, ' ') : "");
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

namespace {

std::string shown(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 60)) out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
  return "'" + out + (s.size() > 60 ? "...'" : "'");
}


// A decimal integer, all of `s` (an optional '-', then digits), within int64.
std::optional<int64_t> strict_int(const std::string& s) {
  size_t i = !s.empty() && s[0] == '-' ? 1 : 0;
  if (i == s.size() || s.size() - i > 19) return std::nullopt;
  for (size_t k = i; k < s.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(s[k]))) return std::nullopt;
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno != 0) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator job_name_rule() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (spec::valid_job_name(v)) return "";
        return shown(v) +
               " is not a job name: use 1-64 characters from [A-Za-z0-9._-], "
               "starting with a letter or digit";
      },
      "NAME", "JOBNAME");
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 2 + word.size() / 3;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    // A prefix ("stat" for "status") is close whatever its length.
    if (c.rfind(word, 0) == 0 && word.size() >= 2) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

int64_t parse_job_id(const std::string& text) {
  auto id = strict_int(text);
  int64_t v = id.value_or(0);
  if (!id || v < 1)
    throw CLI::ValidationError("JOB", "'" + text +
                                          "' is not a job id (a positive number, as "
                                          "`ringctl status` shows)");
  return v;
}

namespace {
std::atomic<int> g_stop_signal{0};
void on_stop(int sig) {
  g_stop_signal.store(sig);
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() {
  return g_stop_signal.load() != 0;
}

bool sleep_unless_stopped(double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (stop_requested()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return !stop_requested();
}

nlohmann::json job_json(const protocol::JobInfo& j) {
  return proto::to_json(proto::StatusReply{0, {j}})["jobs"][0];
}

std::string generate_inputs_problem(const spec::JobSpec& s) {
  if (s.job.kind != spec::JobKind::kGenerate) return "";
  std::error_code ec;
  const std::string from = std::filesystem::current_path(ec).string();
  const auto where = [&](const std::string& p) {
    return p.empty() || p[0] == '/' ? std::string() : " (relative to " + from + ")";
  };
  if (!std::filesystem::is_directory(s.generate.checkpoint, ec))
    return "generate.checkpoint '" + s.generate.checkpoint + "'" + where(s.generate.checkpoint) +
           ": not a directory (a checkpoint directory or one of its step directories)";
  for (const std::string& p : s.generate.prompts) {
    if (std::filesystem::is_directory(p, ec) || ::access(p.c_str(), R_OK) != 0)
      return "generate.prompts: '" + p + "'" + where(p) + ": not a readable file";
  }
  return "";
}

bool absolute_generate_paths(const spec::JobSpec& s, std::vector<spec::Override>* overrides) {
  if (s.job.kind != spec::JobKind::kGenerate) return false;
  const auto abs = [](const std::string& p) {
    return p.empty() || p[0] == '/' ? p : std::filesystem::absolute(p).lexically_normal().string();
  };
  bool added = false;
  if (abs(s.generate.checkpoint) != s.generate.checkpoint) {
    overrides->push_back(
        {"generate.checkpoint", nlohmann::json(abs(s.generate.checkpoint)).dump()});
    added = true;
  }
  nlohmann::json prompts = nlohmann::json::array();
  bool relative = false;
  for (const std::string& p : s.generate.prompts) {
    prompts.push_back(abs(p));
    relative = relative || abs(p) != p;
  }
  if (relative) {
    overrides->push_back({"generate.prompts", prompts.dump()});
    added = true;
  }
  return added;
}

std::string choose_job_dir(const std::string& given, const std::string& name, std::ostream& note) {
  const auto busy = [](const std::string& dir) { return files::DirLock::holder(dir); };
  if (!given.empty()) {
    const std::string dir = jobdir::prepare_job_dir(given);
    if (auto h = busy(dir))
      throw jobdir::JobDirError("job directory " + dir + " is in use by " +
                                files::DirLock::describe(*h) +
                                "; two jobs must not share one (their logs, steps and checkpoints "
                                "would mix): wait for it to end, cancel it, or pass another "
                                "--job-dir");
    return dir;
  }
  const std::string first = jobdir::default_job_dir(name, ::geteuid());
  auto h = busy(first);
  if (!h) return jobdir::prepare_default_job_dir(name);
  for (int i = 2; i < 1000; ++i) {
    const std::string alt = name + "-" + std::to_string(i);
    if (busy(jobdir::default_job_dir(alt, ::geteuid()))) continue;
    const std::string dir = jobdir::prepare_default_job_dir(alt);
    note << "ringctl: " << first << " is in use by " << files::DirLock::describe(*h)
         << "; this job uses " << dir << "\n";
    return dir;
  }
  throw jobdir::JobDirError("every job directory " + first + "[-2..-999] is in use; pass --job-dir");
}

}  // namespace ring::cli
