// ring-coord under load: 1000 simulated daemons heartbeating every second plus a
// stream of status queries -> coordinator CPU use and status latency (p50/p99/max, target p99 <
// 50 ms); then 1000 job submissions -> time and database size.
//
//   coord_bench [--daemons N] [--seconds S] [--jobs J] [--status-hz H] [--sync full|normal]
//
// The coordinator is the real ring-coord binary in its own process, so its CPU use is read from
// /proc/<pid>/stat (every thread, ZeroMQ's I/O thread included). The daemons are DEALER sockets
// in this process speaking the real protocol (register, heartbeat listing their job).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/protocol/protocol.h"
#include "coordinator/client.h"

namespace proto = ring::protocol;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  auto p = s.rfind(')');
  std::istringstream is(s.substr(p + 2));
  std::string tok;
  long utime = 0, stime = 0;
  for (int field = 3; is >> tok; ++field) {
    if (field == 14) utime = std::stol(tok);
    if (field == 15) {
      stime = std::stol(tok);
      break;
    }
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

std::string spec_text() {
  std::ifstream f(std::string(RING_SOURCE_DIR) + "/configs/examples/tiny.yaml");
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

}  // namespace

int main(int argc, char** argv) {
  int n_daemons = 1000, seconds = 20, n_jobs = 1000, status_hz = 20, n_running_jobs = 10;
  std::string sync = "full";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--daemons")
      n_daemons = std::atoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::atoi(argv[i + 1]);
    else if (a == "--jobs")
      n_jobs = std::atoi(argv[i + 1]);
    else if (a == "--status-hz")
      status_hz = std::atoi(argv[i + 1]);
    else if (a == "--sync")
      sync = argv[i + 1];
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  char tmpl[] = "/tmp/ring-coord-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string ep = "ipc://" + dir + "/sock/coord.sock";
  std::string bin = std::string(RING_BINARY_DIR) + "/coordinator/ring-coord";
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open((dir + "/coord.log").c_str(), O_WRONLY | O_CREAT, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(bin.c_str(), bin.c_str(), "--state-dir", (dir + "/state").c_str(), "--endpoint",
          ep.c_str(), "--heartbeat-interval", "1", "--heartbeat-timeout", "10", "--sync",
          sync.c_str(), "--log-level", "warn", nullptr);
    _exit(127);
  }
  auto cleanup = [&] {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    std::filesystem::remove_all(dir);
  };
  for (int i = 0; i < 500 && access((dir + "/sock/coord.sock").c_str(), F_OK) != 0; ++i)
    std::this_thread::sleep_for(10ms);
  ring::coord::ClientOptions co;
  co.endpoint = ep;
  co.timeout = 10000ms;
  ring::coord::Client client(co);
  std::string spec = spec_text();

  // Jobs the daemons serve (n_daemons / n_running_jobs nodes each).
  std::vector<int64_t> running;
  for (int i = 0; i < n_running_jobs; ++i) running.push_back(client.submit(spec).job);

  zmq::context_t ctx(2);
  std::vector<zmq::socket_t> daemons;
  daemons.reserve(n_daemons);
  auto t_reg = Clock::now();
  for (int i = 0; i < n_daemons; ++i) {
    daemons.emplace_back(ctx, zmq::socket_type::dealer);
    auto& s = daemons.back();
    s.set(zmq::sockopt::linger, 0);
    s.connect(ep);
    proto::Register r;
    char name[32];
    std::snprintf(name, sizeof name, "sim-%04d", i);
    r.node = name;
    r.gpus = {{0, "sim", 81920}, {1, "sim", 81920}};
    r.topology = {2, 64, 524288, "leaf" + std::to_string(i / 32), "simulated"};
    r.ringd_version = "bench";
    r.jobs = {{running[i % n_running_jobs], 0, 0}};
    s.send(zmq::buffer(proto::encode(r)));
  }
  int registered = 0;
  auto drain = [&](bool count) {
    for (auto& s : daemons) {
      zmq::message_t m;
      while (s.recv(m, zmq::recv_flags::dontwait))
        if (count && m.to_string_view().find("\"registered\"") != std::string_view::npos)
          ++registered;
    }
  };
  while (registered < n_daemons && Clock::now() - t_reg < 60s) {
    drain(true);
    std::this_thread::sleep_for(5ms);
  }
  double reg_s = std::chrono::duration<double>(Clock::now() - t_reg).count();
  std::printf("registered %d daemons in %.2f s\n", registered, reg_s);

  // Phase A: heartbeats spread over each second + status queries at status_hz.
  std::vector<double> lat_ms;
  double cpu0 = cpu_seconds(pid);
  auto t0 = Clock::now();
  int64_t seq = 0, hb_sent = 0;
  auto next_status = t0;
  auto status_period = std::chrono::microseconds(1000000 / std::max(1, status_hz));
  int qi = 0;
  while (Clock::now() - t0 < std::chrono::seconds(seconds)) {
    auto sec_start = Clock::now();
    ++seq;
    for (int i = 0; i < n_daemons; ++i) {
      // Pace: daemon i sends at offset i/n of the second; serve status queries in between.
      auto due = sec_start + std::chrono::microseconds(1000000LL * i / n_daemons);
      while (Clock::now() < due) {
        if (Clock::now() >= next_status) {
          next_status += status_period;
          auto q0 = Clock::now();
          if (qi++ % 2)
            client.status();
          else
            client.status(running[qi % n_running_jobs]);
          lat_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - q0).count());
        } else {
          std::this_thread::sleep_for(200us);
        }
      }
      char name[32];
      std::snprintf(name, sizeof name, "sim-%04d", i);
      proto::Heartbeat hb{name, seq, {{running[i % n_running_jobs], 1, seq}}};
      daemons[i].send(zmq::buffer(proto::encode(hb)), zmq::send_flags::dontwait);
      ++hb_sent;
    }
    drain(false);
  }
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  double cpu = cpu_seconds(pid) - cpu0;
  auto lost = client.nodes();
  int up = 0;
  for (const auto& n : lost) up += n.state == "up";
  std::printf(
      "heartbeats: %d daemons x %.0f s (%lld sent), %zu status queries (all jobs / one job)\n"
      "  coordinator CPU %.1f%% of one core (%.2f s CPU in %.1f s)\n"
      "  status latency ms: p50 %.2f  p99 %.2f  max %.2f  (target p99 < 50)\n"
      "  nodes up at the end: %d of %zu\n",
      n_daemons, wall, static_cast<long long>(hb_sent), lat_ms.size(), 100 * cpu / wall, cpu, wall,
      pct(lat_ms, 0.5), pct(lat_ms, 0.99), pct(lat_ms, 1.0), up, lost.size());

  // Phase B: submissions (the daemons keep heartbeating meanwhile? no: measured alone).
  daemons.clear();
  auto tb = Clock::now();
  std::vector<double> sub_ms;
  for (int i = 0; i < n_jobs; ++i) {
    auto q0 = Clock::now();
    client.submit(spec);
    sub_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - q0).count());
  }
  double sub_s = std::chrono::duration<double>(Clock::now() - tb).count();
  auto q0 = Clock::now();
  size_t all = client.status().size();
  double all_ms = std::chrono::duration<double, std::milli>(Clock::now() - q0).count();
  kill(pid, SIGTERM);  // clean shutdown checkpoints the WAL into the database file
  waitpid(pid, nullptr, 0);
  auto size = [](const std::string& p) {
    std::error_code ec;
    auto s = std::filesystem::file_size(p, ec);
    return ec ? 0 : s;
  };
  std::string db = dir + "/state/coord.db";
  std::printf(
      "submissions: %d jobs in %.2f s (%.0f/s; per submit p50 %.2f ms, p99 %.2f ms), sync=%s\n"
      "  status of all %zu jobs: %.1f ms\n"
      "  database: %.2f MiB (+ WAL %.2f MiB), %.1f KiB per job (spec text %.1f KiB)\n",
      n_jobs, sub_s, n_jobs / sub_s, pct(sub_ms, 0.5), pct(sub_ms, 0.99), sync.c_str(), all, all_ms,
      size(db) / 1048576.0, size(db + "-wal") / 1048576.0,
      size(db) / 1024.0 / (n_jobs + n_running_jobs), spec.size() / 1024.0);
  // What the coordinator itself found slow (> 20 ms), to tell its time from the machine's.
  std::ifstream lf(dir + "/coord.log");
  std::string line;
  int slow = 0;
  while (std::getline(lf, line))
    if (line.find("slow:") != std::string::npos && slow++ < 10)
      std::printf("  log: %s\n", line.c_str());
  std::printf("coordinator operations over 20 ms: %d\n", slow);
  std::ifstream la("/proc/loadavg");
  std::getline(la, line);
  std::printf("machine load average (1/5/15 min): %s on %u cores\n", line.c_str(),
              std::thread::hardware_concurrency());
  std::filesystem::remove_all(dir);
  (void)cleanup;
  return 0;
}
