// ring-coord: the coordinator of ringmaster (the system of record for jobs, and the control
// plane between ringctl and the node daemons). See coordinator/README.md.
//
//   ring-coord [--state-dir DIR] [--endpoint ipc://...|tcp://...]... [--socket-mode shared]
//              [--heartbeat-timeout S] [--admin-uid UID]... [--sync full|normal]
//              [--topology topology.conf|cluster.yaml]
//   ring-coord --state-dir DIR --print-public-key     the CURVE key tcp clients need
//
// Exit codes: 0 after SIGINT/SIGTERM, 1 when it cannot start (the reason is printed), 2 usage.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "common/protocol/protocol.h"
#include "coordinator/coordinator.h"
#include "coordinator/security.h"

namespace {
std::atomic<ring::coord::Coordinator*> g_coord{nullptr};
void on_signal(int) {
  if (auto* c = g_coord.load()) c->stop();
}

std::string default_state_dir() {
  if (const char* s = std::getenv("RING_STATE_DIR"); s && *s) return s;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/ringmaster";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.local/state/ringmaster";
  return "/var/lib/ringmaster";
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ring-coord: ringmaster's coordinator (job state in SQLite, ZeroMQ control plane)",
               "ring-coord"};
  app.set_version_flag(
      "--version", "ring-coord 0.1.0 (protocol v" + std::to_string(ring::protocol::kVersion) + ")");
  ring::coord::CoordinatorOptions o;
  o.state_dir = default_state_dir();
  std::string mode = "private", sync = "full", level = "info";
  bool print_key = false;
  app.add_option("--state-dir", o.state_dir,
                 "Directory for coord.db, coord.lock and curve/ keys (created 0700)")
      ->capture_default_str();
  app.add_option("--endpoint", o.endpoints,
                 "ipc://PATH or tcp://HOST:PORT (CURVE); repeatable. Default: ipc://" +
                     ring::coord::default_socket_dir() + "/coord.sock");
  app.add_option("--socket-mode", mode,
                 "private: ipc socket only for our user (0700 dir); shared: any local user may "
                 "connect (0711 dir, 0666 socket), jobs are still owned per uid")
      ->check(CLI::IsMember({"private", "shared"}))
      ->capture_default_str();
  app.add_option("--heartbeat-interval", o.heartbeat_interval_s,
                 "Seconds between daemon heartbeats (told to daemons)")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "Seconds without a heartbeat before a node is lost")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  app.add_option("--admin-uid", o.admin_uids, "Uids that may cancel/restart any job (root always)");
  app.add_option("--sync", sync, "SQLite synchronous mode: full (survives power loss) or normal")
      ->check(CLI::IsMember({"full", "normal"}))
      ->capture_default_str();
  app.add_option("--topology", o.topology_file,
                 "Slurm topology.conf or cluster topology YAML for the jobs' global ring order "
                 "(default: from the leaf switches the daemons report)")
      ->check(CLI::ExistingFile);
  app.add_option("--log-level", level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_flag("--print-public-key", print_key,
               "Print the CURVE public key for tcp clients (creating the key pair) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  spdlog::set_level(spdlog::level::from_str(level));
  o.socket_mode =
      mode == "shared" ? ring::coord::SocketMode::kShared : ring::coord::SocketMode::kPrivate;
  o.synchronous_full = sync == "full";
  if (print_key) {
    try {
      ::mkdir(o.state_dir.c_str(), 0700);
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
