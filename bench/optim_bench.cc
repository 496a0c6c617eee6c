// ringd's optimizer (daemon/optim NodeOptimizer) against baselines measured in the same
// run, on the same threads:
//   1. dense AdamW step through NodeOptimizer (bucket handover, norm, AdamW per tensor) in
//      "useful" bytes/s (28 per parameter: param, grad, m, v read; param, m, v written) against
//      a parallel memcpy of the state (16 n bytes copied, counted as 32 n moved), interleaved:
//      target >= 0.8; and against torch.optim.AdamW (bench/torch_adamw.py, same n and threads):
//      target >= 5x;
//   2. overlap: the buckets are handed over while a simulated backward runs (the caller sleeps
//      per bucket, in proportion to its size, as a caller whose workers compute on GPUs or other
//      cores), total backward = --backward-ratio x the measured step time; reports the share of
//      optimizer time hidden, with grad_clip 0 (update per bucket) and grad_clip 1 (exchange and
//      norm per bucket, update after the norm);
//   3. a top-k step (density 0.001, error feedback, lazy update) against the least memory traffic
//      error feedback needs (a "residual += gradient" loop) and one streaming read of the gradient.
//
//   optim_bench [--layers=8] [--d-model=512] [--vocab=32000] [--threads=0] [--reps=7]
//               [--backward-ratio=1.0] [--torch=1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_stats.h"
#include "daemon/optim/node_optimizer.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"

namespace {

using Clock = std::chrono::steady_clock;
using ring::bench::Spread;
using ring::bench::spread;

int g_threads = 0;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

void parallel_memcpy(char* dst, const char* src, size_t bytes) {
#pragma omp parallel num_threads(g_threads)
  {
    size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    size_t chunk = (bytes / nt + 63) / 64 * 64;
    size_t b = std::min(bytes, id * chunk), e = std::min(bytes, b + chunk);
    std::memcpy(dst + b, src + b, e - b);
  }
}

double parallel_read(const float* x, int64_t n) {
  double total = 0;
#pragma omp parallel for num_threads(g_threads) reduction(+ : total) schedule(static)
  for (int64_t i = 0; i < n; ++i) total += x[i];
  return total;
}

ring::spec::JobSpec make_spec(bool topk, double grad_clip) {
  ring::spec::JobSpec s;
  ring::spec::OptimizerSection& o = s.optimizer;
  o.lr = 1e-3;
  o.min_lr = 1e-4;
  o.schedule = ring::spec::LrSchedule::kConstant;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.offload = ring::spec::Offload::kCpu;
  o.compression = topk ? ring::spec::Compression::kTopk : ring::spec::Compression::kNone;
  o.update = topk ? ring::spec::UpdateMode::kLazy : ring::spec::UpdateMode::kDense;
  o.density = 0.001;
  o.error_feedback = true;
  s.train.grad_clip = grad_clip;
  s.train.steps = 1000000;
  return s;
}

struct StepTimes {
  std::vector<double> wall, exposed, optimizer;
};

// One step: hand every bucket over (after sleeping its share of the backward when
// backward_s > 0), then finish.
ring::optim::StepResult step(ring::optim::NodeOptimizer& opt, int64_t s, std::vector<float>& grad,
                             double backward_s) {
  const ring::contract::ParamLayout& layout = opt.layout();
  opt.begin_step(s);
  for (const ring::contract::GradBucket& b : layout.buckets()) {
    if (backward_s > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(
          backward_s * static_cast<double>(b.end - b.begin) / layout.total()));
    }
    opt.bucket_ready(b.index, grad.data() + b.begin);
  }
  return opt.finish_step();
}

void print_spread(const char* what, const Spread& s, const char* unit) {
  std::printf("%s: median %.3f%s (min %.3f, max %.3f, %zu reps)\n", what, s.median, unit, s.min,
              s.max, s.count);
}

}  // namespace

int main(int argc, char** argv) {
  using ring::bench::take_flag;
  ring::contract::ModelConfig mc;
  mc.layers = 8;
  mc.d_model = 512;
  mc.heads = 8;
  mc.kv_heads = 8;
  mc.vocab = 32000;
  int reps = 7;
  double backward_ratio = 1.0;
  bool torch = true;
  std::string v;
  for (int i = 1; i < argc; ++i) {
    if (take_flag(argv[i], "--layers", &v)) {
      mc.layers = std::atoll(v.c_str());
    } else if (take_flag(argv[i], "--d-model", &v)) {
      mc.d_model = std::atoll(v.c_str());
    } else if (take_flag(argv[i], "--vocab", &v)) {
      mc.vocab = std::atoll(v.c_str());
    } else if (take_flag(argv[i], "--threads", &v)) {
      g_threads = std::atoi(v.c_str());
    } else if (take_flag(argv[i], "--reps", &v)) {
      reps = std::atoi(v.c_str());
    } else if (take_flag(argv[i], "--backward-ratio", &v)) {
      backward_ratio = std::atof(v.c_str());
    } else if (take_flag(argv[i], "--torch", &v)) {
      torch = v != "0";
    } else {
      std::fprintf(stderr,
                   "optim_bench: unknown flag %s (--layers --d-model --vocab --threads --reps "
                   "--backward-ratio --torch)\n",
                   argv[i]);
      return 2;
    }
  }
  if (mc.layers < 1 || mc.d_model < 64 || mc.d_model % 64 != 0 || mc.vocab < 1 ||
      g_threads < 0 || reps < 1 || backward_ratio < 0) {
    std::fprintf(stderr, "optim_bench: --layers >= 1, --d-model a multiple of 64, --vocab >= 1, "
                         "--threads >= 0, --reps >= 1, --backward-ratio >= 0\n");
    return 2;
  }
  mc.head_dim = mc.d_model / mc.heads;
  mc.mlp_hidden = (8 * mc.d_model / 3 + 63) / 64 * 64;
  if (g_threads == 0) g_threads = ring::kernels::cpu::hardware_threads();
  const ring::contract::ParamLayout layout(mc);
  const int64_t n = layout.total();

  std::string err;
  auto backend = ring::kernels::create_backend("cpu", g_threads, &err);
  if (!backend) {
    std::fprintf(stderr, "optim_bench: %s\n", err.c_str());
    return 1;
  }
  std::vector<float> init(n), grad(n);
  // Continuous pseudo-random values (few ties, like real gradients); gradient norm < 1.
  auto uniform = [](uint64_t i) {  // splitmix64 -> [-1, 1)
    uint64_t z = i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
  };
  for (int64_t i = 0; i < n; ++i) {
    init[i] = 0.01f * uniform(2 * i);
    grad[i] = 1e-7f * uniform(2 * i + 1);
  }
  std::vector<char> src(16 * static_cast<size_t>(n), 1), dst(16 * static_cast<size_t>(n), 0);

  ring::optim::LocalExchange one;
  std::printf("== optim_bench: %lld parameters (%zu buckets, %.0f MiB optimizer state), "
              "threads=%d, isa=%s ==\n",
              static_cast<long long>(n), layout.buckets().size(), 12.0 * n / (1 << 20), g_threads,
              ring::kernels::cpu::isa_name(ring::kernels::cpu::active_isa()));

  // ---- 1. dense step throughput vs memcpy (interleaved) ----
  std::vector<double> t_step0, t_step1, t_copy;
  {
    ring::optim::NodeOptimizer opt0(make_spec(false, 0.0), layout, 1000000, g_threads, &one);
    ring::optim::NodeOptimizer opt1(make_spec(false, 1.0), layout, 1000000, g_threads, &one);
    opt0.init_master(init.data());
    opt1.init_master(init.data());
    int64_t s0 = 0, s1 = 0;
    step(opt0, ++s0, grad, 0);  // warm-up
    step(opt1, ++s1, grad, 0);
    parallel_memcpy(dst.data(), src.data(), dst.size());
    for (int r = 0; r < reps; ++r) {
      double t = now_s();
      step(opt0, ++s0, grad, 0);
      t_step0.push_back(now_s() - t);
      t = now_s();
      parallel_memcpy(dst.data(), src.data(), dst.size());
      t_copy.push_back(now_s() - t);
      t = now_s();
      ring::optim::StepResult res = step(opt1, ++s1, grad, 0);
      t_step1.push_back(now_s() - t);
      if (res.clipped) std::printf("(unexpected: clipped)\n");
    }
  }
  std::vector<double> ratio0, ratio1;
  for (int r = 0; r < reps; ++r) {
    ratio0.push_back(28.0 / 32.0 * t_copy[r] / t_step0[r]);
    ratio1.push_back(28.0 / 32.0 * t_copy[r] / t_step1[r]);
  }
  const Spread s0 = spread(t_step0), s1 = spread(t_step1), sc = spread(t_copy);
  std::printf("dense step, grad_clip 0: %.2f ms (%.2f GB/s useful)\n", s0.median * 1e3,
              28.0 * n / s0.median / 1e9);
  std::printf("dense step, grad_clip 1: %.2f ms (%.2f GB/s useful; + norm pass)\n",
              s1.median * 1e3, 28.0 * n / s1.median / 1e9);
  std::printf("memcpy of the state:     %.2f ms (%.2f GB/s)\n", sc.median * 1e3,
              32.0 * n / sc.median / 1e9);
  const Spread r0 = spread(ratio0), r1 = spread(ratio1);
  print_spread("NodeOptimizer (clip 0) / memcpy bandwidth", r0, "");
  print_spread("NodeOptimizer (clip 1) / memcpy bandwidth", r1, "");
  std::printf("target >= 0.8: clip 0 %s, clip 1 %s\n", r0.median >= 0.8 ? "MET" : "NOT MET",
              r1.median >= 0.8 ? "MET" : "NOT MET");

  if (torch) {
    const ring::bench::TorchAdamW t =
        ring::bench::run_torch_adamw(RING_SOURCE_DIR, n, g_threads, reps);
    const double med = t.seconds.median, mn = t.seconds.min;
    if (!t.ok) {
      std::printf("torch.optim.AdamW: failed to run (%d): %s\n", t.rc, t.output.c_str());
    } else {
      std::printf("%s", t.line.c_str());
      std::printf("torch.optim.AdamW / NodeOptimizer step (clip 1): median %.2fx (torch min / "
                  "ours max %.2fx)   target >= 5x: %s\n",
                  med / s1.median, mn / s1.max, med / s1.median >= 5 ? "MET" : "NOT MET");
    }
  }

  // ---- 2. overlap with a simulated backward ----
  for (double clip : {0.0, 1.0}) {
    ring::optim::NodeOptimizer opt(make_spec(false, clip), layout, 1000000, g_threads, &one);
    opt.init_master(init.data());
    const double backward_s = backward_ratio * (clip > 0 ? s1.median : s0.median);
    std::vector<double> hidden, exposed, total;
    int64_t s = 0;
    step(opt, ++s, grad, backward_s);
    for (int r = 0; r < reps; ++r) {
      ring::optim::StepResult res = step(opt, ++s, grad, backward_s);
      hidden.push_back(res.hidden_fraction());
      exposed.push_back(res.exposed_s * 1e3);
      total.push_back(res.optimizer_s * 1e3);
    }
    std::printf("overlap, grad_clip %.0f, backward %.1f ms: optimizer %.2f ms, exposed %.2f ms, "
                "hidden fraction median %.3f (min %.3f, max %.3f)\n",
                clip, backward_s * 1e3, spread(total).median, spread(exposed).median,
                spread(hidden).median, spread(hidden).min, spread(hidden).max);
  }

  // ---- 3. top-k step (density 0.001, error feedback, lazy) vs streaming baselines ----
  // The step must at least read gradient and residual and write the residual (error feedback):
  // baseline "residual += gradient" (plain parallel loop), and one streaming read of the gradient.
  {
    ring::optim::NodeOptimizer opt(make_spec(true, 1.0), layout, 1000000, g_threads, &one);
    opt.init_master(init.data());
    std::vector<double> t_topk, t_read, t_acc;
    int64_t s = 0;
    std::vector<float> g = grad, res(n, 0.f);
    ring::optim::StepResult last = step(opt, ++s, g, 0);
    volatile double sink = 0;
    for (int r = 0; r < reps; ++r) {
      double t = now_s();
      last = step(opt, ++s, g, 0);  // the gradient is not modified in lazy mode
      t_topk.push_back(now_s() - t);
      t = now_s();
      sink = sink + parallel_read(g.data(), n);
      t_read.push_back(now_s() - t);
      t = now_s();
      float* rp = res.data();
      const float* gp = g.data();
#pragma omp parallel for num_threads(g_threads) schedule(static)
      for (int64_t i = 0; i < n; ++i) rp[i] += gp[i];
      t_acc.push_back(now_s() - t);
    }
    std::vector<double> vs_read, vs_acc;
    for (int r = 0; r < reps; ++r) {
      vs_read.push_back(t_topk[r] / t_read[r]);
      vs_acc.push_back(t_topk[r] / t_acc[r]);
    }
    std::printf("top-k step (density 0.001, error feedback, lazy): %.2f ms, %lld of %lld "
                "coordinates, %lld bytes sent vs %lld dense (%.0fx fewer)\n",
                spread(t_topk).median * 1e3, static_cast<long long>(last.changed_count),
                static_cast<long long>(n), static_cast<long long>(last.bytes_sent),
                static_cast<long long>(last.bytes_dense),
                static_cast<double>(last.bytes_dense) / last.bytes_sent);
    print_spread("top-k step / (residual += gradient) loop", spread(vs_acc), "x");
    print_spread("top-k step / one streaming read of the gradient", spread(vs_read), "x");
  }
  return 0;
}
