// Ring attention benchmarks, P real processes (this binary forks them):
//
//   ring_bench --what hop     --world P   per hop: bytes, time, effective GB/s (K/V-block-sized
//                                          messages around the ring, through the same progress
//                                          thread ring attention uses)
//   ring_bench --what overlap --world 2   attention forward+backward of one layer with the ring
//                                          vs the same blocks with communication removed
//                                          (RingAttention::set_compute_only), interleaved reps
//   ring_bench --what stagger --world P   the same step with parallel.stagger_us = 0 and others
//
// Options: --tokens T (per rank), --max-doc D (document length cap; 0: one causal document),
// --heads H --kv-heads KH --head-dim HD, --reps N, --stagger LIST (e.g. 0,200,1000,5000).
// Rank 0 prints markdown rows: median [min..max] over reps of the slowest rank's time.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "worker/data/split.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_rank.h"

using namespace ring;
using Clock = std::chrono::steady_clock;

namespace {

struct Opts {
  std::string what = "overlap";
  int world = 2;
  int rank = -1;
  std::string dir;
  int64_t tokens = 2048;
  int64_t max_doc = 0;
  int64_t heads = 4, kv_heads = 2, head_dim = 64;
  int reps = 5;
  std::vector<int64_t> stagger = {0, 200, 1000, 5000};
};

double secs(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Summary {
  double median, lo, hi;
};
Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// The slowest rank's value (every rank gets it).
double max_over_ranks(cp::RingRank& rr, double x) {
  std::vector<double> all(rr.ring().world);
  rr.progress().collective([&](transport::TransportComm& c) {
    c.check(c.api().all_gather(c.get(), &x, all.data(), sizeof(double), 0), "all_gather");
  });
  return *std::max_element(all.begin(), all.end());
}

void barrier(cp::RingRank& rr) {
  rr.progress().collective([&](transport::TransportComm& c) {
    c.check(c.api().barrier(c.get(), 0), "barrier");
  });
}

// ---- per hop ----------------------------------------------------------------------------------

void bench_hop(const Opts& o, cp::RingRank& rr) {
  const bool lead = o.rank == 0;
  if (lead) {
    std::printf("| ranks | message | median ms per hop [min..max] | effective GB/s per link |\n");
    std::printf("|---|---|---|---|\n");
  }
  for (size_t mib : {1, 16, 64}) {
    const size_t bytes = mib << 20;
    std::vector<char> a(bytes, 1), b(bytes, 0);  // touched once here, reused
    std::vector<double> t;
    for (int rep = 0; rep < o.reps + 1; ++rep) {
      barrier(rr);
      const auto t0 = Clock::now();
      int hr = rr.progress().post_recv(b.data(), bytes, rr.ring().prev, 7);
      int hs = rr.progress().post_send(a.data(), bytes, rr.ring().next, 7);
      for (int h : {hr, hs}) {
        auto r = rr.progress().wait(h, 60000);
        if (r.status != RING_TRANSPORT_OK) throw transport::TransportError(r.status, r.error);
      }
      const double dt = max_over_ranks(rr, secs(t0));
      if (rep > 0) t.push_back(dt);  // the first rep wires up the path
    }
    Summary s = summarize(t);
    if (lead)
      std::printf("| %d | %zu MiB | %.2f [%.2f..%.2f] | %.2f |\n", o.world, mib, s.median * 1e3,
                  s.lo * 1e3, s.hi * 1e3, bytes / s.median / 1e9);
  }
}

// ---- attention step ---------------------------------------------------------------------------

// Everything about one ring position's tokens, generated from the seed alone so every rank can
// rebuild any other rank's block (the compute-only mode).
struct Shard {
  std::vector<int64_t> pos;
  std::vector<int32_t> doc;
  std::vector<float> q, k, v;
};

Shard make_shard(const Opts& o, int position) {
  const int64_t total = o.tokens * o.world;
  Shard s;
  s.pos = cp::rank_token_indices(total, o.world, position, spec::CausalBalance::kZigzag);
  // Document ids of the whole sequence: random lengths in [1, max_doc] (0: one document).
  std::vector<int32_t> doc_of(total, 0);
  if (o.max_doc > 0) {
    std::mt19937_64 rng(12345);
    int32_t d = 0;
    for (int64_t i = 0; i < total; ++d) {
      int64_t len = 1 + static_cast<int64_t>(rng() % o.max_doc);
      for (int64_t j = 0; j < len && i < total; ++j) doc_of[i++] = d;
    }
  }
  for (int64_t p : s.pos) s.doc.push_back(doc_of[p]);
  std::mt19937 rng(position + 1);
  std::normal_distribution<float> n(0.f, 1.f);
  const int64_t t = static_cast<int64_t>(s.pos.size());
  s.q.resize(t * o.heads * o.head_dim);
  s.k.resize(t * o.kv_heads * o.head_dim);
  s.v.resize(t * o.kv_heads * o.head_dim);
  for (auto* x : {&s.q, &s.k, &s.v})
    for (float& f : *x) f = n(rng);
  return s;
}

struct StepResult {
  double seconds;
  cp::RingStats ring;
};

class AttentionStep {
 public:
  AttentionStep(const Opts& o, cp::RingRank& rr, kernels::Backend* backend, int64_t stagger_us,
                bool compute_only)
      : o_(o), rr_(rr), backend_(backend) {
    cp::RingAttention::Options ao;
    ao.stagger_us = stagger_us;
    attention_ = std::make_unique<cp::RingAttention>(backend, &rr.progress(), rr.ring(), ao);
    for (int p = 0; p < o.world; ++p)
      if (p == rr.ring().position || compute_only) shards_.emplace_back(make_shard(o, p));
      else shards_.emplace_back();
    if (compute_only) {
      std::vector<int64_t> tokens(o.world, o.tokens);
      attention_->set_compute_only(
          [this](int, int origin) {
            const Shard& s = shards_[origin];
            return cp::BlockView{static_cast<int64_t>(s.pos.size()), s.k.data(), s.v.data(),
                                 s.pos.data(), s.doc.data()};
          },
          tokens);
    }
    const int64_t t = o.tokens;
    out_.resize(t * o.heads * o.head_dim);
    dout_.assign(t * o.heads * o.head_dim, 0.01f);
    lse_.resize(t * o.heads);
    dq_.resize(out_.size());
    dk_.resize(t * o.kv_heads * o.head_dim);
    dv_.resize(dk_.size());
  }

  StepResult run() {
    const Shard& me = shards_[rr_.ring().position];
    model::AttentionCall c;
    c.layer = 1;  // token counts are exchanged once (layer 0 exchanges them every step)
    c.tokens = o_.tokens;
    c.heads = o_.heads;
    c.kv_heads = o_.kv_heads;
    c.head_dim = o_.head_dim;
    c.scale = 1.f / std::sqrt(static_cast<float>(o_.head_dim));
    c.positions = me.pos.data();
    c.doc_ids = me.doc.data();
    c.q = me.q.data();
    c.k = me.k.data();
    c.v = me.v.data();
    attention_->reset_stats();
    barrier(rr_);
    const auto t0 = Clock::now();
    attention_->forward(c, out_.data(), lse_.data());
    attention_->backward(c, out_.data(), lse_.data(), dout_.data(), dq_.data(), dk_.data(),
                         dv_.data());
    const double mine = secs(t0);
    return {max_over_ranks(rr_, mine), attention_->ring_stats()};
  }

 private:
  const Opts& o_;
  cp::RingRank& rr_;
  kernels::Backend* backend_;
  std::unique_ptr<cp::RingAttention> attention_;
  std::vector<Shard> shards_;
  std::vector<float> out_, dout_, lse_, dq_, dk_, dv_;
};

void bench_overlap(const Opts& o, cp::RingRank& rr, kernels::Backend* backend) {
  AttentionStep ring(o, rr, backend, 0, false), local(o, rr, backend, 0, true);
  ring.run();  // warm-up: buffers, wire-up
  local.run();
  std::vector<double> with, without;
  StepResult last{};
  for (int rep = 0; rep < o.reps; ++rep) {  // interleaved A/B: the same load on both
    last = ring.run();
    with.push_back(last.seconds);
    without.push_back(local.run().seconds);
  }
  if (o.rank != 0) return;
  Summary a = summarize(with), b = summarize(without);
  std::printf("| %d | %lld | %s | %.1f | %.3f [%.3f..%.3f] | %.3f [%.3f..%.3f] | %.3f | %.1f | "
              "%.3f |\n",
              o.world, static_cast<long long>(o.tokens),
              o.max_doc ? ("<= " + std::to_string(o.max_doc)).c_str() : "one (causal)",
              last.ring.bytes_sent / 1e6, a.median, a.lo, a.hi, b.median, b.lo, b.hi,
              a.median / b.median, last.ring.wait_s * 1e3, last.ring.compute_s);
}

void bench_stagger(const Opts& o, cp::RingRank& rr, kernels::Backend* backend) {
  std::vector<std::unique_ptr<AttentionStep>> steps;
  for (int64_t s : o.stagger)
    steps.push_back(std::make_unique<AttentionStep>(o, rr, backend, s, false));
  for (auto& s : steps) s->run();  // warm-up
  std::vector<std::vector<double>> t(steps.size());
  std::vector<double> wait(steps.size(), 0);
  for (int rep = 0; rep < o.reps; ++rep)
    for (size_t i = 0; i < steps.size(); ++i) {  // interleaved
      StepResult r = steps[i]->run();
      t[i].push_back(r.seconds);
      wait[i] += r.ring.wait_s / o.reps;
    }
  if (o.rank != 0) return;
  for (size_t i = 0; i < steps.size(); ++i) {
    Summary s = summarize(t[i]);
    std::printf("| %d | %lld | %s | %lld | %.3f [%.3f..%.3f] | %.3f | %.1f |\n", o.world,
                static_cast<long long>(o.tokens),
                o.max_doc ? ("<= " + std::to_string(o.max_doc)).c_str() : "one (causal)",
                static_cast<long long>(o.stagger[i]), s.median, s.lo, s.hi,
                s.median / summarize(t[0]).median, wait[i] * 1e3);
  }
}

int run_rank(const Opts& o) {
  spec::JobSpec spec;
  spec.parallel.ring_order = spec::RingOrder::kNatural;
  cp::RankOptions ro;
  ro.rank = o.rank;
  ro.world = o.world;
  ro.rendezvous = o.dir;
  cp::RingRank rr(spec, ro);
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  if (!backend) throw std::runtime_error(err);
  if (o.what == "hop") bench_hop(o, rr);
  else if (o.what == "overlap") bench_overlap(o, rr, backend.get());
  else if (o.what == "stagger") bench_stagger(o, rr, backend.get());
  else throw std::runtime_error("unknown --what " + o.what);
  std::fflush(stdout);
  rr.shutdown();
  return 0;
}

int launch(int argc, char** argv, const Opts& o) {
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/ring-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  std::vector<pid_t> pids;
  for (int r = 0; r < o.world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<std::string> args(argv, argv + argc);
      for (const std::string& x : {std::string("--rank"), std::to_string(r), std::string("--dir"), dir})
        args.push_back(x);
      std::vector<char*> v;
      for (auto& a : args) v.push_back(a.data());
      v.push_back(nullptr);
      execv("/proc/self/exe", v.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    int st = 0;
    pid_t got = wait(&st);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && rc == 0) {
      rc = 1;
      std::fprintf(stderr, "ring_bench: pid %d failed; stopping the others\n", got);
      for (pid_t p : pids)
        if (p != got) kill(p, SIGKILL);
    }
  }
  std::filesystem::remove_all(dir);
  return rc;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (f == "--what") o.what = v, ++i;
    else if (f == "--world") o.world = std::atoi(v), ++i;
    else if (f == "--rank") o.rank = std::atoi(v), ++i;
    else if (f == "--dir") o.dir = v, ++i;
    else if (f == "--tokens") o.tokens = std::atoll(v), ++i;
    else if (f == "--max-doc") o.max_doc = std::atoll(v), ++i;
    else if (f == "--heads") o.heads = std::atoll(v), ++i;
    else if (f == "--kv-heads") o.kv_heads = std::atoll(v), ++i;
    else if (f == "--head-dim") o.head_dim = std::atoll(v), ++i;
    else if (f == "--reps") o.reps = std::atoi(v), ++i;
    else if (f == "--stagger") o.stagger = parse_list(v), ++i;
    else {
      std::fprintf(stderr, "ring_bench: unknown argument %s (see the header of ring_bench.cc)\n",
                   f.c_str());
      return 2;
    }
  }
  if (o.rank < 0) return launch(argc, argv, o);
  try {
    return run_rank(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ring_bench rank %d: %s\n", o.rank, e.what());
    std::fflush(stderr);
    _exit(1);
  }
}
