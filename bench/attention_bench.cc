// Attention block forward+backward throughput of the CPU kernels against the best sgemm on the
// same threads, measured in the same run (target ratio >= 0.5).
//
//   attention_bench [--threads N] [--reps R] [--quick] [--len L]
//
// FLOPs counted for attention: the dense-equivalent work of the tiles actually computed, as the
// kernels report in AttentionStats::flops: 4 * rows * keys * head_dim per computed tile in the
// forward (QK^T and PV) and 10 * rows * keys * head_dim in the backward (QK^T recompute, dV, dP,
// dQ, dK); skipped tiles count nothing, the masked half of diagonal tiles counts (it is
// computed). exp/max/mask work is not counted. For causal shapes the table also shows the rate
// over allowed (query, key) pairs only, 14 * pairs * head_dim * heads, which is lower.
// sgemm: C[n,n] = A[n,n] B[n,n], 2 n^3 FLOPs, n = 2048, on the same thread count, through every
// GEMM provider built in (kernels/cpu/gemm.h: OpenBLAS, oneDNN); the baseline is the fastest of
// them in each repetition, so an OpenBLAS that fell back to old kernels cannot flatter the ratio.
//
// Each repetition runs forward + backward_prepare + backward once, then sgemm once per provider
// (with a pause before each so the idle-spinning threads of one library do not steal cores from
// the next); ratio = attention GFLOP/s / best sgemm GFLOP/s of that repetition. Reported: median
// and min..max over repetitions, and each provider's median.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/gemm_timing.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"

namespace {

using ring::kernels::AttentionArgs;
using ring::kernels::AttentionStats;
using ring::kernels::DType;
using ring::kernels::Status;
namespace cpu = ring::kernels::cpu;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void pause_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

struct Summary {
  double median, lo, hi;
};

Summary summarize(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  const double med = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  return {med, x.front(), x.back()};
}

std::vector<float> random_vec(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(n);
  for (float& e : x) e = u(rng);
  return x;
}

struct Shape {
  int64_t len, heads, kv_heads, hd;
  bool causal;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  int reps = 5;
  int64_t len = 4096;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--len" && i + 1 < argc) {
      len = std::atoll(argv[++i]);
    } else if (arg == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps R] [--len L] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || len < 1) {
    std::fprintf(stderr, "threads, reps and len must be >= 1\n");
    return 2;
  }
  const char* isa = std::getenv("RING_CPU_ISA");
  std::printf(
      "attention_bench: threads %d, reps %d, len %lld, RING_CPU_ISA %s, "
      "OPENBLAS_CORETYPE %s\n",
      threads, reps, static_cast<long long>(len), isa ? isa : "(auto)",
      std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(auto)");

  std::vector<Shape> shapes;
  for (int64_t hd : {64, 128}) {
    for (int64_t kvh : {4, 8}) {
      for (bool causal : {false, true}) shapes.push_back({len, 8, kvh, hd, causal});
    }
  }
  if (quick) shapes = {{len, 8, 4, 64, false}, {len, 8, 4, 128, true}};

  std::mt19937 rng(1);
  const int gn = 2048;
  ring::bench::GemmTimer gemm({false, false, gn, gn, gn}, 2);
  const auto providers = ring::bench::built_gemm_providers();
  std::string names;
  for (auto p : providers) {
    if (gemm.gflops(p, threads) < 0) return 1;  // warm-up (thread pools, page faults, JIT)
    names += std::string(names.empty() ? "" : ", ") + cpu::gemm_provider_name(p);
  }
  std::printf("sgemm baseline: the best of %s (OpenBLAS core %s)\n", names.c_str(),
              cpu::gemm_facts().openblas_core.c_str());

  std::printf("%-36s %14s %14s %20s %14s %18s %s\n", "shape", "attn GF/s", "sgemm GF/s",
              "ratio med [min..max]", "pairs GF/s", "fwd/bwd s", "sgemm GF/s by provider");
  int below = 0;
  for (const Shape& s : shapes) {
    const int64_t qe = s.len * s.heads * s.hd, ke = s.len * s.kv_heads * s.hd;
    std::vector<float> q = random_vec(rng, qe), k = random_vec(rng, ke), v = random_vec(rng, ke),
                       dout = random_vec(rng, qe);
    std::vector<int64_t> pos(s.len);
    for (int64_t i = 0; i < s.len; ++i) pos[i] = i;
    std::vector<float> out(qe), lse(s.len * s.heads), delta(s.len * s.heads), dq(qe), dk(ke),
        dv(ke);
    AttentionArgs a;
    a.q_len = a.kv_len = s.len;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = s.hd;
    a.scale = 1.f / std::sqrt(static_cast<float>(s.hd));
    a.causal = s.causal;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_pos = pos.data();
    a.k_pos = pos.data();

    const double pairs = s.causal ? 0.5 * s.len * (s.len + 1.0) : double(s.len) * s.len;
    const double pair_flops = 14.0 * pairs * s.hd * s.heads;
    std::vector<double> attn, best_gemm, ratio, by_pairs, t_fwd, t_bwd;
    std::vector<std::vector<double>> by_provider(providers.size());
    for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up, not recorded
      AttentionStats fs, bs;
      pause_ms(200);
      const double t0 = now_s();
      Status st = cpu::attention_forward(a, out.data(), lse.data(), &fs, threads);
      const double t1 = now_s();
      if (st == Status::kOk) {
        st = cpu::attention_backward_prepare(DType::kF32, s.len, s.heads, s.hd, out.data(),
                                             dout.data(), delta.data(), threads);
      }
      if (st == Status::kOk) {
        st = cpu::attention_backward(a, dout.data(), lse.data(), delta.data(), dq.data(), dk.data(),
                                     dv.data(), &bs, threads);
      }
      const double t2 = now_s();
      if (st != Status::kOk) {
        std::fprintf(stderr, "attention failed: status %d\n", static_cast<int>(st));
        return 1;
      }
      double g = 0;
      for (size_t i = 0; i < providers.size(); ++i) {
        pause_ms(200);
        const double gi = gemm.gflops(providers[i], threads);
        if (gi < 0) return 1;
        if (r > 0) by_provider[i].push_back(gi);
        g = std::max(g, gi);
      }
      if (r == 0) continue;
      const double gf = (fs.flops + bs.flops) / (t2 - t0) * 1e-9;
      attn.push_back(gf);
      best_gemm.push_back(g);
      ratio.push_back(gf / g);
      by_pairs.push_back(pair_flops / (t2 - t0) * 1e-9);
      t_fwd.push_back(t1 - t0);
      t_bwd.push_back(t2 - t1);
    }
    const Summary sa = summarize(attn), sg = summarize(best_gemm), sr = summarize(ratio),
                  sp = summarize(by_pairs), sf = summarize(t_fwd), sb = summarize(t_bwd);
    char name[96], rs[48], ts[40];
    std::snprintf(name, sizeof(name), "L=%lld h=%lld kvh=%lld hd=%lld %s",
                  static_cast<long long>(s.len), static_cast<long long>(s.heads),
                  static_cast<long long>(s.kv_heads), static_cast<long long>(s.hd),
                  s.causal ? "causal" : "full");
    std::snprintf(rs, sizeof(rs), "%.2f [%.2f..%.2f]", sr.median, sr.lo, sr.hi);
    std::snprintf(ts, sizeof(ts), "%.2f/%.2f", sf.median, sb.median);
    std::string each;
    for (size_t i = 0; i < providers.size(); ++i) {
      char one[48];
      std::snprintf(one, sizeof(one), "%s%s %.1f", i ? ", " : "",
                    cpu::gemm_provider_name(providers[i]), summarize(by_provider[i]).median);
      each += one;
    }
    std::printf("%-36s %14.1f %14.1f %20s %14.1f %18s %s\n", name, sa.median, sg.median, rs,
                sp.median, ts, each.c_str());
    std::fflush(stdout);
    below += sr.median < 0.5;
  }
  std::printf("target ratio >= 0.5: %s (%d of %zu shapes below)\n", below ? "NOT MET" : "met",
              below, shapes.size());
  return 0;
}
