// Transport bandwidth and latency between 2 processes, against memcpy of the same size
// measured interleaved in the same run.
//
//   transport_bench [transport=ucx] [max_mib=256]
//
// Bandwidth: rank 0 sends one message of S bytes, rank 1 answers with an empty ack once it has
// it; GB/s = S / (send to ack). Each repetition is paired with a memcpy of S bytes between
// buffers of the same size, and the ratio transport/memcpy is reported per pair (median, min,
// max). Latency: ping-pong of small messages, half the round trip. Host-memory transports only.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <signal.h>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "plugins/transport/loader.h"

namespace {

using Clock = std::chrono::steady_clock;
using ring::transport::TransportComm;
using ring::transport::TransportPlugin;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check(const TransportComm& c, ring_transport_status_t s, const char* what) {
  c.check(s, what);
}

void send_wait(const TransportComm& c, const void* p, size_t n, int peer, uint32_t tag) {
  ring_transport_request_t* r = nullptr;
  check(c, c.api().isend(c.get(), p, n, peer, tag, &r), "isend");
  check(c, c.api().wait(c.get(), r, 0, nullptr), "wait send");
}
void recv_wait(const TransportComm& c, void* p, size_t n, int peer, uint32_t tag) {
  ring_transport_request_t* r = nullptr;
  check(c, c.api().irecv(c.get(), p, n, peer, tag, &r), "irecv");
  check(c, c.api().wait(c.get(), r, 0, nullptr), "wait recv");
}

int reps_for(size_t bytes) {
  size_t r = (size_t{1} << 30) / bytes;
  return static_cast<int>(std::clamp<size_t>(r, 7, 200));
}

int run_rank(const std::string& name, int rank, const std::string& dir, size_t max_bytes) {
  TransportPlugin plugin = TransportPlugin::load(name);
  if (!(plugin->caps & RING_TRANSPORT_CAP_HOST_MEMORY)) {
    std::fprintf(stderr, "transport_bench: %s takes device memory; this bench is host-only\n",
                 name.c_str());
    return 2;
  }
  ring_transport_config_t cfg{};
  cfg.rank = rank;
  cfg.world_size = 2;
  cfg.rendezvous = dir.c_str();
  cfg.device = -1;
  TransportComm comm(plugin, cfg);
  int peer = 1 - rank;
  check(comm, plugin->connect(comm.get(), &peer, 1, 0), "connect");
  std::vector<char> buf(max_bytes, 1), copy(max_bytes, 2);

  // Latency: ping-pong.
  if (rank == 0) {
    std::printf("transport %s, 2 processes; latency (half round trip, us):\n", name.c_str());
    std::printf("%10s %10s %10s %10s\n", "bytes", "median", "p10", "p90");
  }
  for (size_t n : {size_t{0}, size_t{8}, size_t{64}, size_t{512}, size_t{4096}}) {
    std::vector<double> us;
    for (int i = 0; i < 2000; ++i) {
      auto t0 = Clock::now();
      if (rank == 0) {
        send_wait(comm, buf.data(), n, peer, 1);
        recv_wait(comm, buf.data(), n, peer, 2);
        if (i >= 100) us.push_back(seconds_since(t0) * 1e6 / 2);
      } else {
        recv_wait(comm, buf.data(), n, peer, 1);
        send_wait(comm, buf.data(), n, peer, 2);
      }
    }
    if (rank == 0) {
      std::sort(us.begin(), us.end());
      std::printf("%10zu %10.2f %10.2f %10.2f\n", n, us[us.size() / 2], us[us.size() / 10],
                  us[us.size() * 9 / 10]);
    }
  }

  if (rank == 0) {
    std::printf("\nbandwidth per message (GB/s = 1e9 B/s), memcpy of the same size paired:\n");
    std::printf("%10s %5s %9s %9s %9s %9s %9s %9s %9s\n", "bytes", "reps", "median", "min", "max",
                "memcpy", "ratio", "rmin", "rmax");
  }
  for (size_t n = 4096; n <= max_bytes; n *= 4) {
    int reps = reps_for(n);
    std::vector<double> t_xfer, t_copy;
    for (int i = 0; i < reps + 1; ++i) {
      check(comm, plugin->barrier(comm.get(), 0), "barrier");
      if (rank == 0) {
        auto t0 = Clock::now();
        std::memcpy(copy.data(), buf.data(), n);
        double tc = seconds_since(t0);
        t0 = Clock::now();
        send_wait(comm, buf.data(), n, peer, 3);
        recv_wait(comm, nullptr, 0, peer, 4);
        double tx = seconds_since(t0);
        if (i > 0) {  // the first repetition warms up buffers and rendezvous paths
          t_xfer.push_back(tx);
          t_copy.push_back(tc);
        }
      } else {
        recv_wait(comm, copy.data(), n, peer, 3);
        send_wait(comm, nullptr, 0, peer, 4);
      }
    }
    if (rank == 0) {
      auto gbs = [n](std::vector<double> t) {
        for (double& x : t) x = n / x / 1e9;
        return t;
      };
      std::vector<double> bw = gbs(t_xfer), cbw = gbs(t_copy);
      auto s = ring::bench::spread(bw);
      auto c = ring::bench::spread(cbw);
      auto r = ring::bench::paired_ratio(bw, cbw);
      std::printf("%10zu %5d %9.2f %9.2f %9.2f %9.2f %9.3f %9.3f %9.3f\n", n, reps, s.median,
                  s.min, s.max, c.median, r.median, r.min, r.max);
      std::fflush(stdout);
    }
  }
  check(comm, plugin->barrier(comm.get(), 0), "final barrier");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = argc > 1 ? argv[1] : "ucx";
  size_t max_bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256) << 20;
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/ring-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  // Fork before any transport state exists; the child is rank 1 and dies with us.
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    try {
      _exit(run_rank(name, 1, dir, max_bytes));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: %s\n", e.what());
      _exit(1);
    }
  }
  int rc = 0;
  try {
    rc = run_rank(name, 0, dir, max_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank 0: %s\n", e.what());
    rc = 1;
    kill(child, SIGKILL);
  }
  int st = 0;
  waitpid(child, &st, 0);
  std::filesystem::remove_all(dir);
  return rc ? rc : (WIFEXITED(st) ? WEXITSTATUS(st) : 1);
}
