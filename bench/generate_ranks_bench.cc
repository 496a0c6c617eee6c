// Generation over P ranks (worker/generate/ring_generate.h) against one process, P real
// processes forked by this binary (UCX on this host):
//
//   generate_ranks_bench [--ranks P] [--tokens T] [--steps S] [--reps R] [--threads N]
//                        [--page-tokens N] [--max-doc D]
//
// Model: 2 layers, d_model 256, 4 query heads over 2 K/V heads, head_dim 64, swiglu 512, byte
// vocab, random weights; the prompt is T tokens in packed documents of up to D tokens (default
// T: one document). Each configuration (1 process, then P ranks) splits the N threads (default:
// every core) evenly among its ranks and runs R repetitions of, interleaved:
//   - the training forward alone on the same tokens (Model::forward; over P ranks with the ring's
//     attention, the training path with no backward),
//   - the prefill (the same forward, each layer's K/V written into this rank's cache pages),
//   - S greedy decode steps after the prefill (P ranks: the cache sharded, per layer the ranks'
//     partial (o, lse) all_gathered and merged).
// Reported: prefill tokens/s and its paired ratio to the training forward of the same ranks
// (median, min..max), tokens/s of the P-rank prefill over the 1-process one, and decode time per
// token (median, min..max over all steps) with its share spent exchanging partials, and the
// P-rank / 1-process ratio of the medians. OMP_WAIT_POLICY is passive unless set.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "kernels/backend.h"
#include "worker/data/split.h"
#include "worker/generate/generator.h"
#include "worker/generate/ring_generate.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"
#include "worker/ring/ring_rank.h"

namespace {

using Clock = std::chrono::steady_clock;
using ring::bench::Spread;
using ring::bench::spread;

struct Opts {
  int ranks = 2;
  int64_t tokens = 8192;
  int steps = 32;
  int reps = 3;
  int threads = 0;
  int64_t page_tokens = 1024;
  int64_t max_doc = 0;  // 0: one document
  // A rank (set by the launcher).
  int rank = -1, world = 1;
  std::string dir;
};

ring::model::ModelConfig bench_config() {
  ring::model::ModelConfig m;
  m.layers = 2;
  m.d_model = 256;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 64;
  m.mlp_hidden = 512;
  m.vocab = 256;
  m.mlp = ring::spec::MlpKind::kSwiGLU;
  m.tie_embeddings = true;
  m.recompute = true;
  return m;
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One rank (or the single process): writes DIR/result-<world>-<rank>: lines "forward s",
// "prefill s", "step s exchange_s".
int run_rank(const Opts& o) {
  const auto cfg = bench_config();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, (o.threads > 0 ? o.threads : cores) / o.world);
  std::string err;
  auto backend = ring::kernels::create_backend("cpu", threads, &err);
  if (!backend) throw std::runtime_error(err);
  std::vector<float> params;
  {
    ring::model::LocalAttention att(backend.get());
    ring::model::Model m(cfg, backend.get(), &att);
    m.init_params(3);
    params = m.get_params();
  }
  std::mt19937_64 rng(11);
  std::vector<int32_t> ids(static_cast<size_t>(o.tokens)), docs(ids.size());
  int32_t doc = 0;
  for (int64_t i = 0, left = 0; i < o.tokens; ++i, --left) {
    if (o.max_doc > 0 && left == 0) {
      left = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(o.max_doc));
      ++doc;
    }
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(rng() % 256);
    docs[static_cast<size_t>(i)] = doc;
  }
  std::optional<ring::gen::GenerateRing> ring;
  ring::gen::GeneratorOptions go;
  go.threads = threads;
  go.cache.page_tokens = o.page_tokens;
  go.cache.fast_bytes = 0;  // every page in the host tier
  go.cache.window = 0;
  std::unique_ptr<ring::model::LocalAttention> local;
  ring::model::AttentionExecutor* attention = nullptr;
  if (o.world > 1) {
    ring::gen::RingOptions ro;
    ro.rank = o.rank;
    ro.ranks = o.world;
    ro.rendezvous = o.dir + "/rdv-" + std::to_string(o.world);
    ring.emplace(backend.get(), ro);
    go.shard = ring->shard(ring::spec::CausalBalance::kZigzag);
    attention = ring->attention();
  } else {
    local = std::make_unique<ring::model::LocalAttention>(backend.get());
    attention = local.get();
  }
  std::optional<ring::model::Model> forward_model;
  std::optional<ring::gen::Generator> g;
  return ring::cp::run_then_exit_on_error("generate_ranks_bench", 1, [&] {
    forward_model.emplace(cfg, backend.get(), attention);
    forward_model->set_params(params);
    g.emplace(cfg, params.data(), backend.get(), go);
    // This rank's tokens, as the prefill cuts them (the training forward runs on the same).
    std::vector<int64_t> pos;
    std::vector<int32_t> lid, ldoc;
    if (o.world > 1) {
      pos = ring::cp::rank_token_indices(o.tokens, o.world, o.rank,
                                           ring::spec::CausalBalance::kZigzag);
    } else {
      for (int64_t i = 0; i < o.tokens; ++i) pos.push_back(i);
    }
    for (int64_t p : pos) {
      lid.push_back(ids[static_cast<size_t>(p)]);
      ldoc.push_back(docs[static_cast<size_t>(p)]);
    }
    std::vector<int32_t> labels(lid.size(), -1);
    ring::model::Batch b{static_cast<int64_t>(lid.size()), lid.data(), labels.data(), pos.data(),
                         ldoc.data()};
    std::ofstream out(o.dir + "/result-" + std::to_string(o.world) + "-" + std::to_string(o.rank));
    char barrier_in = 0;
    std::vector<char> barrier_out(static_cast<size_t>(o.world));
    auto barrier = [&] {
      if (ring) ring->all_gather(&barrier_in, barrier_out.data(), 1);
    };
    for (int r = 0; r < o.reps; ++r) {
      barrier();
      auto t0 = Clock::now();
      forward_model->forward(b, 1);
      barrier();
      out << "forward " << since(t0) << "\n";
      t0 = Clock::now();
      std::vector<float> logits;
      const int h = g->prefill(ids, docs, &logits);
      barrier();
      out << "prefill " << since(t0) << "\n";
      std::vector<int32_t> next = {
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
      for (int s = 0; s < o.steps; ++s) {
        t0 = Clock::now();
        const ring::gen::StepTiming t = g->step({h}, next, &logits);
        out << "step " << since(t0) << " " << t.exchange_seconds << "\n";
        next[0] =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      g->release(h);
    }
    out.close();
    if (ring) ring->shutdown();
    return 0;
  });
}

struct Measured {
  std::vector<double> forward, prefill, step, exchange;
};

Measured read_result(const std::string& path) {
  Measured m;
  std::ifstream in(path);
  std::string what;
  while (in >> what) {
    double x = 0;
    in >> x;
    if (what == "forward") m.forward.push_back(x);
    if (what == "prefill") m.prefill.push_back(x);
    if (what == "step") {
      double e = 0;
      in >> e;
      m.step.push_back(x);
      m.exchange.push_back(e);
    }
  }
  return m;
}

// Starts `world` ranks of this binary and waits for them; false when one failed.
bool launch(char** argv, int argc, int world, const std::string& dir) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<std::string> args(argv, argv + argc);
      for (const std::string& x : {std::string("--rank"), std::to_string(r), std::string("--world"),
                                   std::to_string(world), std::string("--dir"), dir})
        args.push_back(x);
      std::vector<char*> v;
      for (auto& a : args) v.push_back(a.data());
      v.push_back(nullptr);
      execv("/proc/self/exe", v.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (size_t i = 0; i < pids.size(); ++i) {
    int st = 0;
    const pid_t got = wait(&st);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && ok) {
      ok = false;
      std::fprintf(stderr, "generate_ranks_bench: pid %d failed; stopping the others\n", got);
      for (pid_t p : pids)
        if (p != got) kill(p, SIGKILL);
    }
  }
  return ok;
}

void print(const char* what, const Spread& s, double scale, const char* unit) {
  std::printf("%-44s %10.3f %s  (min %.3f, max %.3f, n %zu)\n", what, s.median * scale, unit,
              s.min * scale, s.max * scale, s.count);
}

}  // namespace

int main(int argc, char** argv) {
  // Idle OpenMP threads sleep instead of spinning (both sides; as decode_bench does): the ranks
  // and the other processes of a loaded machine share its cores.
  setenv("OMP_WAIT_POLICY", "passive", 0);
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (f == "--ranks")
      o.ranks = std::atoi(v), ++i;
    else if (f == "--tokens")
      o.tokens = std::atoll(v), ++i;
    else if (f == "--steps")
      o.steps = std::atoi(v), ++i;
    else if (f == "--reps")
      o.reps = std::atoi(v), ++i;
    else if (f == "--threads")
      o.threads = std::atoi(v), ++i;
    else if (f == "--page-tokens")
      o.page_tokens = std::atoll(v), ++i;
    else if (f == "--max-doc")
      o.max_doc = std::atoll(v), ++i;
    else if (f == "--rank")
      o.rank = std::atoi(v), ++i;
    else if (f == "--world")
      o.world = std::atoi(v), ++i;
    else if (f == "--dir")
      o.dir = v, ++i;
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks P] [--tokens T] [--steps S] [--reps R] [--threads N] "
                   "[--page-tokens N] [--max-doc D]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    if (o.rank >= 0) return run_rank(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate_ranks_bench rank %d: %s\n", o.rank, e.what());
    return 1;
  }
  if (o.ranks < 2 || o.tokens < 2 * o.ranks || o.reps < 1 || o.steps < 1) {
    std::fprintf(stderr,
                 "generate_ranks_bench: --ranks >= 2, --tokens >= 2 x ranks, --reps and "
                 "--steps >= 1\n");
    return 2;
  }
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/gen-ranks-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf(
      "generate_ranks_bench: %lld-token prompt%s, %d decode steps x %d reps, %d threads "
      "in all, pages of %lld (host tier)\n",
      static_cast<long long>(o.tokens),
      o.max_doc > 0 ? (" (documents up to " + std::to_string(o.max_doc) + ")").c_str()
                    : " (one document)",
      o.steps, o.reps, o.threads > 0 ? o.threads : cores, static_cast<long long>(o.page_tokens));
  std::vector<Measured> m;
  for (int world : {1, o.ranks}) {
    if (!launch(argv, argc, world, dir)) {
      std::filesystem::remove_all(dir);
      return 1;
    }
    m.push_back(read_result(dir + "/result-" + std::to_string(world) + "-0"));
  }
  std::filesystem::remove_all(dir);
  const double t = static_cast<double>(o.tokens);
  for (size_t c = 0; c < m.size(); ++c) {
    const int world = c == 0 ? 1 : o.ranks;
    std::printf("-- %d %s\n", world, world == 1 ? "process" : "ranks");
    std::vector<double> fwd_tps, pre_tps;
    for (double s : m[c].forward) fwd_tps.push_back(t / s);
    for (double s : m[c].prefill) pre_tps.push_back(t / s);
    print("training forward, tokens/s", spread(fwd_tps), 1e-3, "K");
    print("prefill, tokens/s", spread(pre_tps), 1e-3, "K");
    print("prefill / training forward (paired)", ring::bench::paired_ratio(pre_tps, fwd_tps), 1,
          "x");
    print("decode step", spread(m[c].step), 1e3, "ms");
    if (world > 1) print("  of it exchanging partials", spread(m[c].exchange), 1e3, "ms");
  }
  std::vector<double> p1, pp;
  for (double s : m[0].prefill) p1.push_back(s);
  for (double s : m[1].prefill) pp.push_back(s);
  std::printf("-- %d ranks vs 1 process\n", o.ranks);
  print("prefill tokens/s ratio (paired by rep)", ring::bench::paired_ratio(p1, pp), 1, "x");
  std::printf("%-44s %10.3f x\n", "decode step time ratio (medians)",
              spread(m[1].step).median / spread(m[0].step).median);
  return 0;
}
