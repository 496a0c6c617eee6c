// Measures this machine's rates for `ringctl simulate --gpu cpu --calibration FILE` with the CPU
// backend, at a spec's shapes (default configs/examples/tiny.yaml), on its cpus_per_worker threads.
//
// Default (kernels): single kernels at the spec's shapes:
//   gemm_flops            the projections' GEMM [T, d] x [d, 3 d] (2 T d 3d FLOPs), median
//   attention_fwd_flops   one fully allowed T x T block (every key before every query): the
//   attention_bwd_flops   simulator's convention, 4 (forward) and 10 (backward) x heads x
//                         head_dim per allowed (query, key) pair
// --as-run: the worker's step as one ring rank executes it, without the transfers: the model's
// forward and forward+backward (worker/model) on ring position 0's tokens (its zigzag or
// contiguous share, the spec's packed documents taken max_doc_len long as the simulator takes
// them) with RingAttention in its compute-only mode (every block of the ring, the same kernels,
// merges and accumulator adds). The simulator's FLOP counts for that rank divided by the measured
// times give effective rates that include everything the model does besides its GEMMs and
// attention kernels (norms, RoPE, activations, adds, the loss):
//   gemm_flops            projections, MLP and LM head forward / their measured time
//   gemm_bwd_flops        their backward (2x the forward FLOPs) / the backward's time
//   attention_fwd_flops   the rank's allowed pairs x 4 x heads x head_dim x layers / time
//   attention_bwd_flops   ... x 10 ... / time
// --cpu-time (with --as-run): those times are the main thread's CPU time instead of wall time:
//                         rates per CPU-second, a dedicated core's, whatever else runs here
//                         (compute_rates_per: "cpu_second"; the emulated-cluster validation
//                         gives the simulator the share of a core each rank got in the run)
// --beside-compute K --beside-pollers M (with --as-run): K single-thread GEMM processes and M
//                         processes that wake like a worker's progress thread with a request
//                         posted and no data arriving (it sleeps on the comm's event fd, at
//                         most ProgressEngine::kSleepBound) run beside the measurement: a
//                         rank's conditions on an emulated cluster's shared cores (wake-ups
//                         preempt the compute and cost it cache: a lower rate per CPU-second)
// Always:
//   intra_node_bytes_per_s  one-thread memcpy of 64 MiB / 2 (the shared-memory transport copies
//                         into the segment and out of it)
//   adamw_params_per_s    ringd's optimizer per parameter: Backend::adamw_step over 16 Mi floats
//                         plus the copy of the new weights into the workers' segment, on
//                         --ringd-threads threads (default all cores; ringd --threads)
//   checkpoint_bytes_per_s  256 MiB write + fdatasync in the output file's directory
//   host_speed            --host-probe N: the speed of each of n single-thread GEMM processes
//                         running at once, relative to one alone, n = 1..N (how the cores, and
//                         whatever else runs on this machine now, divide among concurrent
//                         ranks and daemons: the simulator's shared-host model)
//   host_poll_load        with --host-probe: one GEMM beside N/2 processes that wait the way a
//                         rank waits for a transfer (16 sched_yield rounds, then sleeps of
//                         ProgressEngine::kSleepBound on the comm's fd with nothing arriving):
//                         the load of one waiter, in processes (from the host_speed table)
// Every figure is the median of --reps repetitions; the spread (min..max) is printed.
//
//   sim_calibrate [--spec FILE] [--reps N] [--as-run [--cpu-time] [--beside-compute K]
//                 [--beside-pollers M]] [--ringd-threads N]
//                 [--host-probe N] -o FILE
//
// --link-probe RANK --rendezvous DIR --sizes B1,B2,.. [--beside K]: one rank of a two-rank
// communicator of the ring's transport (UCX unless --transport), driven by the worker's own
// progress engine (worker/ring/progress.h), as bench/link_probe.py runs it in two network
// namespaces joined by an emulated link. Rank 0 sends each size --reps times (after a barrier;
// rank 1 posts the receive and answers with an empty message) and records the send's time from
// posted to complete (as the worker's timeline records a ring_send) and the one-way time (to the
// answer, minus half the empty round trip). Idle: nothing else runs. Loaded: as in a ring step,
// both ranks compute (the projection GEMM in their main thread, X ns per byte of the message)
// while the progress thread moves the message, then wait; and K single-thread GEMM processes
// compute beside them (the other ranks of an emulated cluster). After each loaded transfer both
// ranks compute as long again with no transfer: the median of the pairs' GEMM rate ratios is
// what the transfers cost the compute. Each rank also records its CPU
// time (user + system, getrusage) over each level's transfers. Writes the raw times as JSON to
// -o; link_probe.py fits the link model from them.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/model_config.h"
#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "sim/workload.h"
#include "worker/data/split.h"
#include "worker/model/model.h"
#include "worker/ring/progress.h"
#include "worker/ring/ring_attention.h"
#include "plugins/transport/loader.h"

namespace {

using Clock = std::chrono::steady_clock;
using ring::kernels::Status;

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --as-run times on this clock: wall time, or with --cpu-time the main thread's CPU time (the
// compute-only step runs on it alone with one thread: a dedicated core's rate, whatever share
// of a core the machine's other load leaves it).
bool g_cpu_time = false;
double clock_s() {
  if (g_cpu_time) return ring::cp::thread_cpu_seconds();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

struct Stat {
  double median = 0, lo = 0, hi = 0;
};
Stat summary(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

void check(Status s, const char* what) {
  if (s != Status::kOk) {
    std::fprintf(stderr, "sim_calibrate: %s failed: %s\n", what, ring::kernels::status_string(s));
    std::exit(1);
  }
}

// Wall time of the attention calls (forward / backward), around the ring's executor.
class TimedAttention final : public ring::model::AttentionExecutor {
 public:
  explicit TimedAttention(ring::model::AttentionExecutor* inner) : inner_(inner) {}
  void forward(const ring::model::AttentionCall& c, float* out, float* lse) override {
    const double t0 = clock_s();
    inner_->forward(c, out, lse);
    fwd_s += clock_s() - t0;
  }
  void backward(const ring::model::AttentionCall& c, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv) override {
    const double t0 = clock_s();
    inner_->backward(c, out, lse, dout, dq, dk, dv);
    bwd_s += clock_s() - t0;
  }
  ring::kernels::AttentionStats stats() const override { return inner_->stats(); }
  double fwd_s = 0, bwd_s = 0;

 private:
  ring::model::AttentionExecutor* inner_;
};

struct AsRun {
  std::vector<double> gemm, gemm_bwd, attn_fwd, attn_bwd;
};

// The model's step on ring position 0 (see the header), reps times.
AsRun measure_as_run(const ring::spec::JobSpec& s, ring::kernels::Backend* be, int reps) {
  namespace rm = ring::model;
  const ring::sim::Workload w = ring::sim::make_workload(s);
  const int64_t P = w.P, seq = w.seq_len;
  const int64_t doc = w.doc_len > 0 ? w.doc_len : seq;
  struct Shard {
    std::vector<int64_t> pos;
    std::vector<int32_t> doc;
    std::vector<float> k, v;
  };
  std::vector<Shard> sh(P);
  for (int64_t p = 0; p < P; ++p) {
    sh[p].pos = ring::cp::rank_token_indices(seq, P, p, w.balance);
    for (int64_t x : sh[p].pos) sh[p].doc.push_back(static_cast<int32_t>(x / doc));
    sh[p].k.assign(sh[p].pos.size() * w.kvd, 0.05f);
    sh[p].v.assign(sh[p].pos.size() * w.kvd, 0.05f);
  }
  const bool docs = doc < seq;
  std::vector<int64_t> tokens(P);
  for (int64_t p = 0; p < P; ++p) tokens[p] = static_cast<int64_t>(sh[p].pos.size());
  ring::cp::RingAttention ra(be, nullptr, ring::cp::make_ring(0, static_cast<int>(P), [&] {
                               std::vector<int> o(P);
                               for (int64_t p = 0; p < P; ++p) o[p] = static_cast<int>(p);
                               return o;
                             }()),
                             {});
  ra.set_compute_only(
      [&](int, int origin) {
        const Shard& x = sh[origin];
        return ring::cp::BlockView{static_cast<int64_t>(x.pos.size()), x.k.data(), x.v.data(),
                                   x.pos.data(), docs ? x.doc.data() : nullptr};
      },
      tokens);
  TimedAttention att(&ra);
  rm::Model model(ring::contract::ModelConfig::from_spec(s), be, &att);
  model.init_params(1);
  const int64_t T = tokens[0];
  std::vector<int32_t> ids(T), labels(T);
  for (int64_t i = 0; i < T; ++i) {
    ids[i] = static_cast<int32_t>((i * 7919) % w.vocab);
    labels[i] = static_cast<int32_t>((i * 104729 + 1) % w.vocab);
  }
  rm::Batch b;
  b.tokens = T;
  b.ids = ids.data();
  b.labels = labels.data();
  b.positions = sh[0].pos.data();
  b.doc_ids = docs ? sh[0].doc.data() : nullptr;
  // The simulator's FLOPs for this rank (sim/workload.h, sim/simulate.cc).
  double pairs = 0;
  for (int64_t o = 0; o < P; ++o) pairs += w.pairs(0, o);
  const double hh = static_cast<double>(w.heads * w.head_dim), L = static_cast<double>(w.layers);
  const double proj_fwd = L * (w.pre_fwd_flops + w.post_fwd_flops) + w.head_fwd_flops;
  AsRun r;
  model.forward_backward(b, T);  // warm-up: buffers
  for (int k = 0; k < reps; ++k) {
    att.fwd_s = att.bwd_s = 0;
    double t0 = clock_s();
    model.forward(b, T);
    const double tf = clock_s() - t0, af = att.fwd_s;
    att.fwd_s = att.bwd_s = 0;
    model.zero_grads();
    t0 = clock_s();
    model.forward_backward(b, T);
    const double tfb = clock_s() - t0, ab = att.bwd_s;
    const double nonattn_fwd = std::max(1e-9, tf - af);
    const double nonattn_bwd = std::max(1e-9, tfb - att.fwd_s - ab - nonattn_fwd);
    r.gemm.push_back(proj_fwd / nonattn_fwd);
    r.gemm_bwd.push_back(2 * proj_fwd / nonattn_bwd);
    r.attn_fwd.push_back(pairs * 4 * hh * L / std::max(1e-9, att.fwd_s));
    r.attn_bwd.push_back(pairs * 10 * hh * L / std::max(1e-9, ab));
  }
  return r;
}

// Speed of each of n concurrent single-thread GEMM processes relative to one alone, n = 1..max_n:
// every child runs the GEMM for `secs` seconds after a common start and reports its rate.
struct HostProbe {
  std::vector<double> speed;
  double poll = 0;  // one polling waiter's load, in processes
};
HostProbe host_probe(int max_n, int64_t T, int64_t d, double secs) {
  // n GEMM processes and `pollers` processes that wait the way a rank waits for a transfer
  // (worker/ring/progress.cc: 16 sched_yield rounds, then sleeps on the comm's fd, at most
  // kSleepBound each, when nothing arrives); the GEMMs' rates.
  auto rates = [&](int n, int pollers = 0) {
    int go[2], back[2];
    if (::pipe(go) != 0 || ::pipe(back) != 0) return std::vector<double>{};
    std::vector<pid_t> kids;
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        ::close(back[0]);
        std::string err;
        auto be = ring::kernels::create_backend("cpu", 1, &err);
        std::vector<float> A(T * d, 0.01f), B(d * 3 * d, 0.02f), C(T * 3 * d);
        char c;
        if (!be || ::read(go[0], &c, 1) != 1) ::_exit(1);
        double flops = 0;
        const auto t0 = Clock::now();
        while (seconds(t0) < secs) {
          be->gemm(ring::kernels::DType::kF32, false, false, T, 3 * d, d, 1.f, A.data(), d,
                   B.data(), 3 * d, 0.f, C.data(), 3 * d);
          flops += 2.0 * T * d * 3 * d;
        }
        const double rate = flops / seconds(t0);
        if (::write(back[1], &rate, sizeof(rate)) != sizeof(rate)) ::_exit(1);
        ::_exit(0);
      }
      if (pid > 0) kids.push_back(pid);
    }
    std::vector<pid_t> waiters;
    for (int i = 0; i < pollers; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        ::close(back[0]);
        const auto t0 = Clock::now();
        unsigned idle = 0;
        while (seconds(t0) < secs + 0.3) {
          if (++idle > 16)
            std::this_thread::sleep_for(ring::cp::ProgressEngine::kSleepBound);
          else
            sched_yield();
        }
        ::_exit(0);
      }
      if (pid > 0) waiters.push_back(pid);
    }
    ::close(go[0]);
    ::close(back[1]);
    ::usleep(200000);  // the children have created their backends
    const std::string start(kids.size(), 'g');
    if (::write(go[1], start.data(), start.size()) < 0) std::perror("sim_calibrate: probe");
    std::vector<double> out;
    double x;
    while (::read(back[0], &x, sizeof(x)) == sizeof(x)) out.push_back(x);
    for (pid_t k : kids) ::waitpid(k, nullptr, 0);
    for (pid_t k : waiters) ::waitpid(k, nullptr, 0);
    ::close(go[1]);
    ::close(back[0]);
    return out;
  };
  HostProbe hp;
  double solo = 0;
  auto mean = [](const std::vector<double>& r) {
    double m = 0;
    for (double x : r) m += x / static_cast<double>(r.size());
    return m;
  };
  for (int n = 1; n <= max_n; ++n) {
    const std::vector<double> r = rates(n);
    if (r.empty()) break;
    if (n == 1) solo = mean(r);
    hp.speed.push_back(solo > 0 ? mean(r) / solo : 1.0);
  }
  // One GEMM beside m waiters: the load n_eq whose speed in the table matches, (n_eq - 1) / m.
  const int m = std::max(1, max_n / 2);
  const std::vector<double> r = rates(1, m);
  if (!r.empty() && solo > 0 && hp.speed.size() > 1) {
    const double s = std::min(1.0, mean(r) / solo);
    double n_eq = 1;
    for (size_t i = 1; i < hp.speed.size(); ++i) {
      const double a = hp.speed[i - 1], b = hp.speed[i];
      if (s <= a && s >= b && a > b) {
        n_eq = static_cast<double>(i) + (a - s) / (a - b);
        break;
      }
      if (s < b) n_eq = static_cast<double>(i + 1);
    }
    hp.poll = std::max(0.0, (n_eq - 1) / m);
  }
  return hp;
}


// Processes that run the projection GEMM until killed: compute beside a link probe.
std::vector<pid_t> spin_gemms(int n, int64_t T, int64_t d) {
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::string err;
      auto be = ring::kernels::create_backend("cpu", 1, &err);
      if (!be) ::_exit(1);
      std::vector<float> A(T * d, 0.01f), B(d * 3 * d, 0.02f), C(T * 3 * d);
      for (;;)
        be->gemm(ring::kernels::DType::kF32, false, false, T, 3 * d, d, 1.f, A.data(), d, B.data(),
                 3 * d, 0.f, C.data(), 3 * d);
    }
    if (pid > 0) kids.push_back(pid);
  }
  return kids;
}

// Processes that wait the way a worker's progress thread does while its rank computes with a
// request posted and nothing arriving (worker/ring/progress.cc: a few sched_yield rounds, then
// sleeps on the comm's event fd of at most kSleepBound), until killed: the wake-ups of the
// other ranks' progress threads on shared cores.
std::vector<pid_t> spin_pollers(int n) {
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (unsigned idle = 0;;) {
        if (++idle > 8)
          std::this_thread::sleep_for(ring::cp::ProgressEngine::kSleepBound);
        else
          sched_yield();
      }
    }
    if (pid > 0) kids.push_back(pid);
  }
  return kids;
}

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct LinkProbeArgs {
  int rank = -1;
  std::string rendezvous, transport = "ucx";
  std::vector<size_t> sizes;
  int beside = 0;
  double compute_s_per_byte = 0;
  bool bidirectional = false;
};

int link_probe(const LinkProbeArgs& a, int reps, int64_t T, int64_t d, const std::string& out_path) {
  using ring::cp::ProgressEngine;
  namespace tr = ring::transport;
  tr::TransportPlugin plugin = tr::TransportPlugin::load(a.transport);
  ring_transport_config_t cfg{};
  cfg.struct_size = sizeof(cfg);
  cfg.rank = a.rank;
  cfg.world_size = 2;
  cfg.rendezvous = a.rendezvous.c_str();
  cfg.device = -1;
  tr::TransportComm comm(plugin, cfg);
  const int peer = 1 - a.rank;
  comm.check(plugin->connect(comm.get(), &peer, 1, 0), "connect");
  ProgressEngine pe(&comm);
  const int kTimeoutMs = 120000;
  auto barrier = [&] {
    pe.collective([](tr::TransportComm& c) { c.check(c.api().barrier(c.get(), kTimeoutMs), "barrier"); });
  };
  auto xfer = [&](bool send, void* buf, size_t n, uint32_t tag) {
    const int h = send ? pe.post_send(buf, n, peer, tag) : pe.post_recv(buf, n, peer, tag);
    const ProgressEngine::Result r = pe.wait(h, kTimeoutMs);
    if (r.status != RING_TRANSPORT_OK)
      throw std::runtime_error("link probe: transfer failed: " + r.error);
  };
  size_t max_bytes = 0;
  for (size_t n : a.sizes) max_bytes = std::max(max_bytes, n);
  std::vector<char> buf(std::max<size_t>(max_bytes, 64), 1), back(a.bidirectional ? buf.size() : 0, 2);
  // The rank's own compute while its transfer moves (loaded level): the projection GEMM.
  std::string err;
  auto be = ring::kernels::create_backend("cpu", 1, &err);
  if (!be) throw std::runtime_error("link probe: " + err);
  std::vector<float> GA(T * d, 0.01f), GB(d * 3 * d, 0.02f), GC(T * 3 * d);
  double gemms = 0, gemm_s = 0;  // GEMMs done and the time spent in compute_for
  auto compute_for = [&](double secs) {
    const auto t0 = Clock::now();
    while (seconds(t0) < secs) {
      be->gemm(ring::kernels::DType::kF32, false, false, T, 3 * d, d, 1.f, GA.data(), d, GB.data(),
               3 * d, 0.f, GC.data(), 3 * d);
      gemms += 1;
    }
    gemm_s += seconds(t0);
  };
  nlohmann::json levels = nlohmann::json::array();
  for (int level = 0; level < 2; ++level) {
    const bool loaded = level == 1;
    std::vector<pid_t> kids;
    barrier();
    if (a.rank == 0 && loaded && a.beside > 0) {
      kids = spin_gemms(a.beside, T, d);
      ::usleep(300000);  // the GEMMs are running
    }
    barrier();
    // Half the round trip of an empty message.
    std::vector<double> half;
    for (int i = 0; i < 50; ++i) {
      const auto t0 = Clock::now();
      if (a.rank == 0) {
        xfer(true, buf.data(), 0, 1);
        xfer(false, buf.data(), 0, 2);
        if (i >= 5) half.push_back(seconds(t0) / 2);
      } else {
        xfer(false, buf.data(), 0, 1);
        xfer(true, buf.data(), 0, 2);
      }
    }
    const double h = a.rank == 0 ? summary(half).median : 0;
    nlohmann::json sizes = nlohmann::json::array();
    const double cpu0 = cpu_seconds();
    double bytes_moved = 0, window = 0;  // window: compute time beside the transfers
    std::vector<double> pair_ratio;
    gemms = gemm_s = 0;
    const auto wall0 = Clock::now();
    for (size_t n : a.sizes) {
      std::vector<double> t, send_done;
      for (int k = 0; k < reps + 1; ++k) {
        barrier();
        // Posted, then (loaded) the rank computes while the progress thread moves the message,
        // then waits: a ring step. The send's time is posted to seen complete, as the worker's
        // timeline records a ring_send.
        const auto t0 = Clock::now();
        const int hd = a.rank == 0 ? pe.post_send(buf.data(), n, peer, 3) : pe.post_recv(buf.data(), n, peer, 3);
        // Both directions at once (a ring of two, or a node that sends and receives on one
        // link): the other message, the other way.
        const int hb = !a.bidirectional ? -1
                       : a.rank == 0    ? pe.post_recv(back.data(), n, peer, 5)
                                        : pe.post_send(back.data(), n, peer, 5);
        if (loaded) compute_for(a.compute_s_per_byte * static_cast<double>(n));
        const ProgressEngine::Result r = pe.wait(hd, kTimeoutMs);
        if (r.status != RING_TRANSPORT_OK) throw std::runtime_error("link probe: transfer failed: " + r.error);
        if (hb >= 0 && pe.wait(hb, kTimeoutMs).status != RING_TRANSPORT_OK)
          throw std::runtime_error("link probe: the reverse transfer failed");
        const double ts = std::chrono::duration<double>(r.done_at - t0).count();
        if (a.rank == 0) {
          xfer(false, buf.data(), 0, 4);
          const double ta = seconds(t0);
          if (k > 0) t.push_back(std::max(0.0, ta - h)), send_done.push_back(ts);
        } else {
          xfer(true, buf.data(), 0, 4);
        }
        if (k > 0) bytes_moved += static_cast<double>(n);
        if (loaded && k > 0) {
          // The same compute right after with no transfer (both ranks, after a barrier): the
          // pair's rate ratio is what the transfer cost the compute.
          const double g_with = gemms, s_with = gemm_s;
          gemms = gemm_s = 0;
          barrier();
          compute_for(s_with);
          if (s_with > 0 && gemm_s > 0 && gemms > 0)
            pair_ratio.push_back((g_with / s_with) / (gemms / gemm_s)), window += s_with;
        }
        gemms = gemm_s = 0;
      }
      if (a.rank == 0)
        sizes.push_back({{"bytes", n}, {"one_way_s", t}, {"send_completed_s", send_done}});
    }
    const double cpu = cpu_seconds() - cpu0, wall = seconds(wall0);
    // Loaded: the same compute with no transfer beside it (each rank as long as it computed
    // above, both at once after a barrier): what the transfers cost the compute.
    const double ratio = pair_ratio.empty() ? 1.0 : summary(pair_ratio).median;
    for (pid_t k : kids) ::kill(k, SIGKILL);
    for (pid_t k : kids) ::waitpid(k, nullptr, 0);
    levels.push_back({{"loaded", loaded}, {"beside", loaded ? a.beside : 0},
                      {"compute_s_per_byte", loaded ? a.compute_s_per_byte : 0.0},
                      {"half_round_trip_s", h}, {"sizes", sizes}, {"cpu_s", cpu}, {"wall_s", wall},
                      {"bytes", bytes_moved}, {"compute_window_s", window},
                      {"compute_rate_ratio", ratio}, {"compute_rate_ratios", pair_ratio}});
  }
  barrier();
  nlohmann::json j = {{"rank", a.rank}, {"transport", a.transport}, {"reps", reps}, {"levels", levels}};
  std::ofstream(out_path) << j.dump(1) << "\n";
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  std::string spec_path = "configs/examples/tiny.yaml", out_path;
  int reps = 5, ringd_threads = 0, probe = 0, beside_compute = 0, beside_pollers = 0;
  bool as_run = false;
  LinkProbeArgs lp;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--spec" && i + 1 < argc) spec_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--as-run") as_run = true;
    else if (a == "--cpu-time") g_cpu_time = true;
    else if (a == "--beside-compute" && i + 1 < argc)
      beside_compute = std::clamp(std::atoi(argv[++i]), 0, 64);
    else if (a == "--beside-pollers" && i + 1 < argc)
      beside_pollers = std::clamp(std::atoi(argv[++i]), 0, 64);
    else if (a == "--ringd-threads" && i + 1 < argc) ringd_threads = std::max(0, std::atoi(argv[++i]));
    else if (a == "--host-probe" && i + 1 < argc) probe = std::clamp(std::atoi(argv[++i]), 0, 64);
    else if ((a == "-o" || a == "--output") && i + 1 < argc) out_path = argv[++i];
    else if (a == "--link-probe" && i + 1 < argc) lp.rank = std::atoi(argv[++i]);
    else if (a == "--rendezvous" && i + 1 < argc) lp.rendezvous = argv[++i];
    else if (a == "--transport" && i + 1 < argc) lp.transport = argv[++i];
    else if (a == "--beside" && i + 1 < argc) lp.beside = std::clamp(std::atoi(argv[++i]), 0, 64);
    else if (a == "--bidirectional") lp.bidirectional = true;
    else if (a == "--compute-ns-per-byte" && i + 1 < argc)
      lp.compute_s_per_byte = std::clamp(std::atof(argv[++i]), 0.0, 1e6) * 1e-9;
    else if (a == "--sizes" && i + 1 < argc) {
      std::string v = argv[++i];
      for (size_t p = 0; p <= v.size();) {
        const size_t q = std::min(v.find(',', p), v.size());
        const long long n = std::atoll(v.substr(p, q - p).c_str());
        if (n <= 0 || n > (1ll << 30)) {
          std::fprintf(stderr, "sim_calibrate: --sizes: '%s' is not a size in bytes (1..1 GiB)\n",
                       v.substr(p, q - p).c_str());
          return 2;
        }
        lp.sizes.push_back(static_cast<size_t>(n));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: sim_calibrate [--spec FILE] [--reps N] [--as-run] "
                           "[--cpu-time] [--beside-compute K] [--beside-pollers M] [--ringd-threads N] "
                           "[--host-probe N] -o FILE\n"
                           "       sim_calibrate --link-probe RANK --rendezvous DIR --sizes B1,B2,.. "
                           "[--beside K] [--compute-ns-per-byte X] [--bidirectional] [--reps N] [--spec FILE] -o FILE\n");
      return 2;
    }
  }
  if (out_path.empty()) {
    std::fprintf(stderr, "sim_calibrate: -o FILE is required\n");
    return 2;
  }
  auto lo = ring::spec::job_spec_options();
  lo.runtime_limits_are_errors = false;
  auto r = ring::spec::load_spec_file(spec_path, lo);
  if (!r.ok()) {
    for (const auto& d : r.diagnostics) std::fprintf(stderr, "%s\n", d.str().c_str());
    return 1;
  }
  const auto& s = *r.spec;
  const int threads = static_cast<int>(std::max<int64_t>(1, s.resources.cpus_per_worker));
  if (beside_compute + beside_pollers > 0 && !as_run) {
    std::fprintf(stderr, "sim_calibrate: --beside-compute and --beside-pollers go with --as-run\n");
    return 2;
  }
  if (g_cpu_time && (!as_run || threads != 1)) {
    std::fprintf(stderr, "sim_calibrate: --cpu-time needs --as-run and a spec of one thread per "
                         "worker (%s: resources.cpus_per_worker %d): the main thread's CPU time "
                         "is the whole compute only then\n", spec_path.c_str(), threads);
    return 2;
  }
  if (lp.rank >= 0) {
    if (lp.rank > 1 || lp.rendezvous.empty() || lp.sizes.empty()) {
      std::fprintf(stderr, "sim_calibrate: --link-probe RANK (0 or 1) needs --rendezvous DIR and --sizes\n");
      return 2;
    }
    const int64_t T = std::min<int64_t>(s.data.seq_len / s.parallel.context_ranks, 4096);
    try {
      return link_probe(lp, reps, T, s.model.d_model, out_path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "sim_calibrate: link probe rank %d: %s\n", lp.rank, e.what());
      return 1;
    }
  }
  std::string err;
  auto be = ring::kernels::create_backend("cpu", threads, &err);
  if (!be) {
    std::fprintf(stderr, "sim_calibrate: %s\n", err.c_str());
    return 1;
  }
  const int64_t T = std::min<int64_t>(s.data.seq_len / s.parallel.context_ranks, 4096);
  const int64_t d = s.model.d_model, heads = s.model.heads, kvh = s.resolved.kv_heads,
                hd = s.resolved.head_dim;
  std::printf("sim_calibrate: %s, %d thread(s), T = %lld tokens, d_model %lld, %lld heads x %lld\n",
              spec_path.c_str(), threads, static_cast<long long>(T), static_cast<long long>(d),
              static_cast<long long>(heads), static_cast<long long>(hd));

  // GEMM.
  std::vector<float> A(T * d, 0.01f), B(d * 3 * d, 0.02f), C(T * 3 * d);
  std::vector<double> g;
  for (int k = 0; k < reps; ++k) {
    auto t0 = Clock::now();
    check(be->gemm(ring::kernels::DType::kF32, false, false, T, 3 * d, d, 1.f, A.data(), d,
                   B.data(), 3 * d, 0.f, C.data(), 3 * d), "gemm");
    g.push_back(2.0 * T * d * 3 * d / seconds(t0));
  }
  // Attention: keys all before queries, so every pair is allowed.
  std::vector<float> q(T * heads * hd, 0.1f), kk(T * kvh * hd, 0.1f), v(T * kvh * hd, 0.1f),
      out(T * heads * hd), lse(T * heads), dout(T * heads * hd, 0.01f), delta(T * heads),
      dq(T * heads * hd), dk(T * kvh * hd), dv(T * kvh * hd);
  std::vector<int64_t> qp(T), kp(T);
  for (int64_t i = 0; i < T; ++i) kp[i] = i, qp[i] = T + i;
  ring::kernels::AttentionArgs a;
  a.q_len = a.kv_len = T;
  a.heads = heads;
  a.kv_heads = kvh;
  a.head_dim = hd;
  a.scale = 1.f / std::sqrt(static_cast<float>(hd));
  a.q = q.data();
  a.k = kk.data();
  a.v = v.data();
  a.q_pos = qp.data();
  a.k_pos = kp.data();
  const double pairs = static_cast<double>(T) * T;
  std::vector<double> af, ab;
  for (int k = 0; k < reps; ++k) {
    auto t0 = Clock::now();
    check(be->attention_forward(a, out.data(), lse.data(), nullptr), "attention_forward");
    af.push_back(4.0 * heads * hd * pairs / seconds(t0));
    check(be->attention_backward_prepare(ring::kernels::DType::kF32, T, heads, hd, out.data(),
                                         dout.data(), delta.data()), "attention_backward_prepare");
    t0 = Clock::now();
    check(be->attention_backward(a, dout.data(), lse.data(), delta.data(), dq.data(), dk.data(),
                                 dv.data(), nullptr), "attention_backward");
    ab.push_back(10.0 * heads * hd * pairs / seconds(t0));
  }
  // Shared-memory copy.
  const size_t mb = 64u << 20;
  std::vector<char> src(mb, 1), dst(mb);
  std::vector<double> cp;
  for (int k = 0; k < reps; ++k) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), mb);
    cp.push_back(static_cast<double>(mb) / seconds(t0) / 2);
  }
  // ringd's optimizer: AdamW on its threads, then the new weights into the workers' segment.
  auto all = ring::kernels::create_backend("cpu", ringd_threads, &err);
  const int64_t n = 16 << 20;
  std::vector<float> p(n, 0.1f), gr(n, 0.01f), m(n), vv(n), seg(n);
  ring::kernels::Backend::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  std::vector<double> ad;
  for (int k = 0; k < reps; ++k) {
    auto t0 = Clock::now();
    check(all->adamw_step(n, hp, p.data(), gr.data(), m.data(), vv.data()), "adamw_step");
    std::memcpy(seg.data(), p.data(), n * sizeof(float));
    ad.push_back(static_cast<double>(n) / seconds(t0));
    ++hp.step;
  }
  // The step as the worker runs it (replaces the single-kernel rates).
  Stat GB{};
  if (as_run) {
    // The conditions of a rank of an emulated cluster: the other ranks computing and their
    // progress threads waking beside it (--beside-compute, --beside-pollers).
    std::vector<pid_t> beside = spin_gemms(beside_compute, T, d);
    for (pid_t k : spin_pollers(beside_pollers)) beside.push_back(k);
    AsRun ar = measure_as_run(s, be.get(), reps);
    for (pid_t k : beside) ::kill(k, SIGKILL);
    for (pid_t k : beside) ::waitpid(k, nullptr, 0);
    g = ar.gemm;
    af = ar.attn_fwd;
    ab = ar.attn_bwd;
    GB = summary(ar.gemm_bwd);
  }
  HostProbe hprobe;
  if (probe > 0) hprobe = host_probe(probe, T, d, 0.4);
  const std::vector<double>& speed = hprobe.speed;
  // Checkpoint write.
  const std::string tmp = out_path + ".write-test";
  std::vector<char> blob(256u << 20, 7);
  std::vector<double> ck;
  for (int k = 0; k < std::min(reps, 3); ++k) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      std::fprintf(stderr, "sim_calibrate: %s: %s\n", tmp.c_str(), std::strerror(errno));
      return 1;
    }
    auto t0 = Clock::now();
    size_t off = 0;
    while (off < blob.size()) {
      const ssize_t w = ::write(fd, blob.data() + off, blob.size() - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    ::fdatasync(fd);
    ck.push_back(static_cast<double>(blob.size()) / seconds(t0));
    ::close(fd);
  }
  ::unlink(tmp.c_str());

  auto show = [](const char* name, const Stat& x, double unit, const char* u) {
    std::printf("  %-26s %10.3f %s  (min %.3f, max %.3f)\n", name, x.median / unit, u, x.lo / unit, x.hi / unit);
  };
  const Stat G = summary(g), AF = summary(af), AB = summary(ab), CP = summary(cp), AD = summary(ad), CK = summary(ck);
  show(as_run ? "gemm (as run: forward)" : "gemm", G, 1e9, "GFLOP/s");
  if (as_run) show("gemm (as run: backward)", GB, 1e9, "GFLOP/s");
  show("attention forward", AF, 1e9, "GFLOP/s");
  show("attention backward", AB, 1e9, "GFLOP/s");
  show("intra-node copy", CP, 1e9, "GB/s");
  show("ringd AdamW + weights copy", AD, 1e9, "Gparam/s");
  show("checkpoint write", CK, 1e9, "GB/s");
  nlohmann::json j = {{"gemm_flops", G.median},
                      {"attention_fwd_flops", AF.median},
                      {"attention_bwd_flops", AB.median},
                      {"intra_node_bytes_per_s", CP.median},
                      {"adamw_params_per_s", AD.median},
                      {"checkpoint_bytes_per_s", CK.median},
                      {"threads", threads},
                      {"ringd_threads", ringd_threads},
                      {"machine", std::to_string(std::thread::hardware_concurrency()) + " cores"},
                      {"measured", std::string("bench/sim_calibrate") + (as_run ? " --as-run" : "") +
                                       " on " + spec_path}};
  if (as_run) j["gemm_bwd_flops"] = GB.median;
  if (as_run && g_cpu_time)
    j["compute_rates_per"] = "cpu_second";  // of the main thread
  if (as_run && beside_compute + beside_pollers > 0) {
    j["as_run_beside_compute"] = beside_compute;
    j["as_run_beside_pollers"] = beside_pollers;
  }
  if (!speed.empty()) {
    j["host_speed"] = speed;
    std::printf("  host speed per process, n = 1..%zu at once:", speed.size());
    for (double x : speed) std::printf(" %.2f", x);
    std::printf("\n  a waiting (polling) rank loads the host as %.3f process\n", hprobe.poll);
    j["host_poll_load"] = hprobe.poll;
  }
  const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "sim_calibrate: %s: %s\n", out_path.c_str(), std::strerror(errno));
    return 1;
  }
  const std::string text = j.dump(2) + "\n";
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    std::fprintf(stderr, "sim_calibrate: %s: write failed\n", out_path.c_str());
    return 1;
  }
  ::close(fd);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
