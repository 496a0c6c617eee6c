// ring-coord: the coordinator of ringmaster (the system of record for jobs, and the control
// plane between ringctl and the node daemons). See coordinator/README.md.
//
//   ring-coord [--state-dir DIR] [--endpoint ipc://...|tcp://...]... [--socket-mode shared]
//              [--heartbeat-interval S] [--heartbeat-timeout S] [--admin-uid UID]...
//              [--sync full|normal] [--topology topology.conf|cluster.yaml] [--log-level L]
//              [--log-format text|json] [--http HOST:PORT [--http-auth token|none]]
//              [--metrics-window STEPS] [--metrics-max-ranks N] [--metrics-retention-steps N]
//   ring-coord --state-dir DIR --print-public-key     the CURVE key tcp clients need
//
// Without --endpoint it binds $RING_COORD (the endpoint ringctl and ringd use) when that is set,
// else the default ipc socket.
//
// Exit codes: 0 after SIGINT/SIGTERM, 1 when it cannot start (the reason is printed), 2 usage.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "common/cli/cli11_flags.h"
#include "common/log/log.h"
#include "common/protocol/protocol.h"
#include "common/version.h"
#include "coordinator/coordinator.h"
#include "coordinator/security.h"
#include "coordinator/web.h"

namespace {
std::atomic<ring::coord::Coordinator*> g_coord{nullptr};
void on_signal(int) {
  if (auto* c = g_coord.load()) c->stop();
}

// A uid: 0..4294967294 (4294967295 is (uid_t)-1, "no user").
CLI::Validator uid_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos ||
            std::stoull(s) > 4294967294ULL)
          return "'" + s + "' is not a uid (a number 0..4294967294)";
        return "";
      },
      "UID");
}

CLI::Validator http_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::string why;
        return ring::coord::parse_http_listen(s, &why) ? "" : "'" + s + "': " + why;
      },
      "HOST:PORT");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ring-coord: ringmaster's coordinator (job state in SQLite, ZeroMQ control plane)",
               "ring-coord"};
  app.set_version_flag(
      "--version", std::string("ring-coord ") + ring::kVersion + " (protocol v" +
                       std::to_string(ring::protocol::kVersion) + ")");
  ring::coord::CoordinatorOptions o;
  o.state_dir = ring::coord::default_state_dir();
  std::string mode = "private", sync = "full", level = "info", log_format = "text";
  bool print_key = false;
  app.add_option("--state-dir", o.state_dir,
                 "Directory for coord.db, coord.lock and curve/ keys (created 0700; an existing "
                 "one must be ours, 0700 and not a symlink)")
      ->check(CLI::Validator(
          [](std::string& s) { return s.empty() ? std::string("must not be empty") : ""; }, ""))
      ->capture_default_str();
  app.add_option("--endpoint", o.endpoints,
                 "ipc://PATH or tcp://HOST:PORT (CURVE); repeatable. Default: $RING_COORD (the "
                 "endpoint ringctl and ringd use) when set, else ipc://" +
                     ring::coord::default_socket_dir() + "/coord.sock")
      ->check(ring::flags::endpoint_rule(ring::flags::EndpointUse::kBind));
  app.add_option("--socket-mode", mode,
                 "private: ipc socket only for our user (0700 dir); shared: any local user may "
                 "connect (0711 dir, 0666 socket), jobs are still owned per uid")
      ->check(CLI::IsMember({"private", "shared"}))
      ->capture_default_str();
  app.add_option("--heartbeat-interval", o.heartbeat_interval_s,
                 "Seconds between daemon heartbeats (told to daemons)")
      ->check(ring::flags::seconds_in(0.01, 3600.0))
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "Seconds without a heartbeat before a node is lost")
      ->check(ring::flags::seconds_in(0.05, 86400.0))
      ->capture_default_str();
  app.add_option("--admin-uid", o.admin_uids, "Uids that may cancel/restart any job (root always)")
      ->check(uid_value());
  app.add_option("--sync", sync, "SQLite synchronous mode: full (survives power loss) or normal")
      ->check(CLI::IsMember({"full", "normal"}))
      ->capture_default_str();
  app.add_option("--topology", o.topology_file,
                 "Slurm topology.conf or cluster topology YAML for the jobs' global ring order "
                 "(default: from the leaf switches the daemons report)")
      ->check(CLI::ExistingFile);
  app.add_option("--log-level", level, "trace, debug, info, warn, error, critical or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  app.add_option("--log-format", log_format,
                 "The log on stderr: text, or json (one JSON object per line: ts, level, "
                 "program, pid, logger, msg)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  std::string http_auth = "token";
  app.add_option("--http", o.http_listen,
                 "Serve /metrics (Prometheus), a read-only dashboard and /api/ on this IP "
                 "address and port (port 0: any free port; the URL is written to "
                 "<state-dir>/http). Off by default")
      ->check(http_value());
  app.add_option("--http-auth", http_auth,
                 "token: every request needs `Authorization: Bearer <token>` (or the dashboard's "
                 "sign-in cookie), the token being <state-dir>/http.token (made 0600 on first "
                 "use); none: no token, allowed only on a loopback address (every local user "
                 "can then read job status, metrics and events)")
      ->check(CLI::IsMember({"token", "none"}))
      ->capture_default_str();
  app.add_option("--metrics-window", o.metrics_window_steps,
                 "Per-rank step time summaries (/metrics, dashboard) cover a job's last this "
                 "many steps")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}))
      ->capture_default_str();
  app.add_option(
         "--metrics-max-ranks", o.metrics_max_ranks,
         "Per-rank series per job in /metrics; ranks past it are folded into rank=\"other\"")
      ->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  app.add_option("--metrics-retention-steps", o.metrics_retention_steps,
                 "Keep each job's step metrics and per-rank timings of its last N steps in "
                 "coord.db and delete older ones (a bounded batch per second); 0: keep all")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 53))
      ->capture_default_str();
  app.add_flag("--print-public-key", print_key,
               "Print the CURVE public key for tcp clients (creating the key pair) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Daemons send a heartbeat every interval; a timeout that is not longer loses them all.
  if (!(o.heartbeat_interval_s < o.heartbeat_timeout_s)) {
    std::cerr << "ring-coord: --heartbeat-interval (" << o.heartbeat_interval_s
              << " s) must be less than --heartbeat-timeout (" << o.heartbeat_timeout_s << " s)\n";
    return 2;
  }
  // Like ringctl: --endpoint, else $RING_COORD, else the default socket.
  if (o.endpoints.empty()) {
    if (const char* env = std::getenv("RING_COORD"); env && *env) {
      if (std::string why = ring::flags::endpoint_error(env, ring::flags::EndpointUse::kBind);
          !why.empty()) {
        // endpoint_error() already says which forms are accepted.
        std::cerr << "ring-coord: $RING_COORD '" << env << "': " << why
                  << "; set it to a valid endpoint or give --endpoint\n";
        return 2;
      }
      o.endpoints.push_back(env);
    }
  }
  // The common setup (common/log/log.h); the coordinator's "coord" logger is made on it (the
  // coordinator adds its escaping of client-supplied text).
  ring::log::setup("ring-coord", *ring::log::parse_format(log_format),
                   *ring::log::parse_level(level));
  ring::log::get("coord");
  o.socket_mode =
      mode == "shared" ? ring::coord::SocketMode::kShared : ring::coord::SocketMode::kPrivate;
  o.synchronous_full = sync == "full";
  o.http_token = http_auth == "token";
  if (print_key) {
    try {
      ring::coord::prepare_state_dir(o.state_dir);
      auto k = ring::coord::load_or_create_curve_keys(o.state_dir + "/curve", "server");
      std::cout << k.public_key << "\n";
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "ring-coord: " << e.what() << "\n";
      return 1;
    }
  }
  try {
    ring::coord::Coordinator c(o);
    g_coord.store(&c);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    for (const auto& ep : c.endpoints()) std::cout << "ring-coord: listening on " << ep << "\n";
    if (!c.server_public_key().empty())
      std::cout << "ring-coord: CURVE public key " << c.server_public_key() << " (" << o.state_dir
                << "/curve/server.pub)\n";
    if (!c.http_url().empty())
      std::cout << "ring-coord: web endpoint " << c.http_url() << " (/metrics, dashboard)\n";
    std::cout << "ring-coord: state in " << o.state_dir << "/coord.db" << std::endl;
    c.run();
    g_coord.store(nullptr);
    std::cout << "ring-coord: stopped" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ring-coord: cannot start: " << e.what() << "\n";
    return 1;
  }
}
