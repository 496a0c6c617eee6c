// Decode time per token over a long KV cache against the memory-bandwidth floor measured in the
// same run, and against a PyTorch 1.13 KV-cache decode of the same model (bench/torch_decode.py).
//
//   decode_bench [--threads N] [--reps R] [--lens 32768,131072,1048576] [--page-tokens P]
//                [--prefix T] [--batch B] [--prefill T] [--no-torch]
//
// Model: 2 layers, d_model 256, 4 query heads over 2 K/V heads, head_dim 64, swiglu 512, byte
// vocab; random weights. The cache of each context length is filled with random K/V (attach: a
// prefill of 1M tokens is not what is measured here) and held in the HOST tier only (fast_bytes
// 0, window 0): every page is read in place by the CPU threads.
//
// Floor: the time to stream the bytes of K/V that must be read once per token (context x layers x
// kv_heads x head_dim x 4 bytes x 2) through the same threads (the generator's own pool): the
// faster of two sums over a buffer of that size, one with the widest ISA's loads and four
// accumulators (the read is the limit), one a plain loop of 16 floats built for baseline x86-64
// (the floor this bench had first; "plain" below). Each is read after a decode step and before
// the next, so its bytes are as cold as the step's K/V (loop below). Reported per length: the
// floor's bandwidth and the plain loop's, decode step time (the whole step: projections, MLP,
// head, attention) median and min..max, the attention part's median (DecodeAttention over the
// layers; the rest is the dense layers on one row, whose weights the K/V stream has pushed out
// of the caches), the floor's median, the paired ratio step / floor, median and min..max
// (target <= 1.3), torch's median step time and our speed-up over it, and the host tier's bytes
// and the process's resident set (linear in the
// context). Then prefix sharing: the step time of a batch of B sequences sharing a
// T-token prefix (stored once; each prefix page is one task for all B queries) against B
// sequences with nothing shared. Last, prefill tokens/s (the training forward writing each
// layer's K/V into pages) against the training forward alone (Model::forward) on the same
// tokens, interleaved. OMP_WAIT_POLICY is passive unless set (for both sides).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd.h"
#include "worker/generate/generator.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

// GCC 12 warns inside its own avx512fintrin.h (bug 105593), as kernels/cpu/ops.cc notes.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Streaming sums of p[0, n) in the CPU backend's widest ISA (kernels/cpu/simd.h, chosen at run
// time like the page kernel): four independent accumulators of W lanes, so the read, not the
// adds, is the limit.
#define RING_BENCH_SIMD_SUM(NS, TARGET)                                   \
  TARGET float simd_sum_##NS(const float* p, int64_t n) {                 \
    namespace S = ring::kernels::cpu::simd::NS;                           \
    constexpr int64_t W = S::kWidth;                                      \
    S::vf a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero(); \
    int64_t i = 0;                                                        \
    for (; i + 4 * W <= n; i += 4 * W) {                                  \
      a0 = S::add(a0, S::loadu(p + i));                                   \
      a1 = S::add(a1, S::loadu(p + i + W));                               \
      a2 = S::add(a2, S::loadu(p + i + 2 * W));                           \
      a3 = S::add(a3, S::loadu(p + i + 3 * W));                           \
    }                                                                     \
    float s = S::reduce_add(S::add(S::add(a0, a1), S::add(a2, a3)));      \
    for (; i < n; ++i) s += p[i];                                         \
    return s;                                                             \
  }
RING_BENCH_SIMD_SUM(avx512, RING_TARGET_AVX512)
RING_BENCH_SIMD_SUM(avx2, RING_TARGET_AVX2)
RING_BENCH_SIMD_SUM(scalar, )
#undef RING_BENCH_SIMD_SUM

float simd_sum(const float* p, int64_t n) {
  switch (ring::kernels::cpu::active_isa()) {
    case ring::kernels::cpu::Isa::kAvx512:
      return simd_sum_avx512(p, n);
    case ring::kernels::cpu::Isa::kAvx2:
      return simd_sum_avx2(p, n);
    case ring::kernels::cpu::Isa::kScalar:
      break;
  }
  return simd_sum_scalar(p, n);
}

// One streaming read of buf on the pool's threads (sums, kept), in chunks of whole cache lines:
// seconds. simd: the widest ISA's loads (simd_sum); else a plain loop of 16 float accumulators
// as compiled for baseline x86-64 (the floor this bench used first: on one thread of this
// machine it reads at about 2/3 of what the wide loads reach).
double read_pass(ring::gen::ThreadPool* pool, const std::vector<float>& buf, bool simd) {
  const int64_t n = static_cast<int64_t>(buf.size());
  const int64_t chunks = pool->size() * 16;
  std::vector<double> sums(static_cast<size_t>(chunks));
  const auto t0 = Clock::now();
  pool->parallel_for(chunks, [&](int64_t c) {
    const int64_t lo = n * c / chunks / 16 * 16,
                  hi = c + 1 == chunks ? n : n * (c + 1) / chunks / 16 * 16;
    if (simd) {
      sums[static_cast<size_t>(c)] = simd_sum(buf.data() + lo, hi - lo);
      return;
    }
    float acc[16] = {};
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += buf[static_cast<size_t>(i + l)];
    float s = 0;
    for (float a : acc) s += a;
    for (; i < hi; ++i) s += buf[static_cast<size_t>(i)];
    sums[static_cast<size_t>(c)] = s;
  });
  const double t = seconds_since(t0);
  double total = 0;
  for (double x : sums) total += x;
  if (total < 0) std::printf("%f\n", total);  // keep the sums alive
  return t;
}

// This process's resident set (VmRSS of /proc/self/status), MiB: the cache, the bandwidth
// buffer and the model.
double rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmRSS: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib / 1024.0;
}

std::vector<int64_t> parse_lens(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// torch's median step seconds per length, from bench/torch_decode.py (one line "LEN SECONDS").
std::vector<double> torch_times(const std::vector<int64_t>& lens, int threads, int reps) {
  std::string lens_arg;
  for (int64_t l : lens) {
    if (!lens_arg.empty()) lens_arg += ',';
    lens_arg += std::to_string(l);
  }
  std::string cmd = "/usr/bin/python3 ";
  cmd += RING_SOURCE_DIR;
  cmd += "/bench/torch_decode.py --threads ";
  cmd += std::to_string(threads);
  cmd += " --reps ";
  cmd += std::to_string(reps);
  cmd += " --lens ";
  cmd += lens_arg;
  std::vector<double> out(lens.size(), 0.0);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[256];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    long long len = 0;
    double sec = 0;
    if (std::sscanf(line, "%lld %lf", &len, &sec) == 2)
      for (size_t i = 0; i < lens.size(); ++i)
        if (lens[i] == len) out[i] = sec;
  }
  ::pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Idle OpenMP threads sleep instead of spinning (for us and for torch, which inherits it): on
  // a shared machine a spinning team steals the cores the other side of a comparison needs.
  ::setenv("OMP_WAIT_POLICY", "passive", 0);
  int threads = 2, reps = 9;
  int64_t page_tokens = 1024;
  std::string lens_s = "32768,131072";
  bool torch = true;
  int64_t prefix = 131072;
  int batch = 8;
  int64_t prefill_len = 16384;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name, std::string* out) {
      const std::string p = std::string(name) + "=";
      if (a.rfind(p, 0) != 0) return false;
      *out = a.substr(p.size());
      return true;
    };
    std::string v;
    if (val("--threads", &v)) threads = std::stoi(v);
    else if (val("--reps", &v)) reps = std::stoi(v);
    else if (val("--lens", &v)) lens_s = v;
    else if (val("--page-tokens", &v)) page_tokens = std::stoll(v);
    else if (val("--prefix", &v)) prefix = std::stoll(v);
    else if (val("--batch", &v)) batch = std::stoi(v);
    else if (val("--prefill", &v)) prefill_len = std::stoll(v);
    else if (a == "--no-torch") torch = false;
    else {
      std::fprintf(stderr,
                   "decode_bench: unknown argument '%s' (--threads=N --reps=R --lens=L1,L2 "
                   "--page-tokens=P --prefix=T --batch=B --prefill=T --no-torch)\n",
                   argv[i]);
      return 2;
    }
  }
  const std::vector<int64_t> lens = parse_lens(lens_s);

  ring::model::ModelConfig c;
  c.layers = 2;
  c.d_model = 256;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.mlp_hidden = 512;
  c.vocab = 256;
  std::string err;
  auto be = ring::kernels::create_backend("cpu", threads, &err);
  if (!be) {
    std::fprintf(stderr, "decode_bench: %s\n", err.c_str());
    return 1;
  }
  std::vector<float> params;
  {
    ring::model::LocalAttention att(be.get());
    ring::model::Model m(c, be.get(), &att);
    m.init_params(1);
    params = m.get_params();
  }

  std::printf(
      "decode step, batch 1, all pages in the host tier, %d threads, page %lld tokens, ISA %s, "
      "OMP_WAIT_POLICY=%s\n",
      threads, static_cast<long long>(page_tokens),
      ring::kernels::cpu::isa_name(ring::kernels::cpu::active_isa()),
      std::getenv("OMP_WAIT_POLICY"));
  std::printf("%9s %10s %9s %9s %22s %8s %10s %18s %10s %9s %9s %9s\n", "context", "KV MiB", "GB/s",
              "plain", "step ms (min..max)", "attn ms", "floor ms", "x floor (min..max)",
              "torch ms", "speed-up", "host MiB", "RSS MiB");
  std::vector<double> torch_s;
  if (torch) torch_s = torch_times(lens, threads, reps);
  for (size_t li = 0; li < lens.size(); ++li) {
    const int64_t len = lens[li];
    ring::gen::GeneratorOptions o;
    o.threads = threads;
    o.cache.page_tokens = page_tokens;
    o.cache.fast_bytes = 0;
    o.cache.window = 0;
    ring::gen::Generator g(c, params.data(), be.get(), o);
    std::vector<int32_t> ids(static_cast<size_t>(len));
    std::mt19937_64 rng(len);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 256);
    const int seq = g.attach(ids, {}, [&](int, float* k, float* v) {
      std::normal_distribution<float> nd(0.f, 1.f);
      const int64_t n = len * c.kv_dim();
      for (int64_t i = 0; i < n; ++i) {
        k[i] = nd(rng);
        v[i] = nd(rng);
      }
    });
    const int64_t kv_bytes = len * c.layers * c.kv_dim() * 4 * 2;
    // Each repetition: a streaming read of the same number of bytes with wide loads, the decode
    // step (measured), the plain read, another step (not measured). Every read and every step
    // follows 64+ MiB of other data, so each finds its bytes as cold as the other does (two
    // reads of a 64 MiB buffer back to back would find part of it still in the 32 MiB L3). The
    // floor of repetition r is the faster of its two reads; the ratio is paired per repetition
    // (the bandwidth of this machine drifts with its load).
    std::vector<float> buf(static_cast<size_t>(kv_bytes / 4), 1.f);
    std::vector<double> steps, floors, plain, attn;
    std::vector<float> logits;
    int32_t tok = 1;
    read_pass(&g.pool(), buf, true);  // touch the buffer
    for (int r = 0; r < reps + 1; ++r) {
      const double wide_s = read_pass(&g.pool(), buf, true);
      ring::gen::StepTiming t = g.step({seq}, {tok}, &logits);
      tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      const double plain_s = read_pass(&g.pool(), buf, false);
      g.step({seq}, {tok}, &logits);
      tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (r == 0) continue;  // the first steps warm the threads
      steps.push_back(t.seconds);
      attn.push_back(t.attention_seconds);
      floors.push_back(std::min(wide_s, plain_s));
      plain.push_back(plain_s);
    }
    const auto s = ring::bench::spread(steps);
    const auto f = ring::bench::spread(floors);
    const auto pl = ring::bench::spread(plain);
    const auto at = ring::bench::spread(attn);
    const auto ratio = ring::bench::paired_ratio(steps, floors);
    const double ts = torch ? torch_s[li] : 0.0;
    const ring::gen::CacheStats cs = g.cache().stats();
    std::printf(
        "%9lld %10.1f %9.2f %9.2f %8.2f (%6.2f..%6.2f) %8.2f %10.2f %5.2f (%4.2f..%4.2f) "
        "%10.2f %9.2f %9.1f %9.1f\n",
        static_cast<long long>(len), kv_bytes / 1048576.0, kv_bytes / f.median / 1e9,
        kv_bytes / pl.median / 1e9, s.median * 1e3, s.min * 1e3, s.max * 1e3, at.median * 1e3,
        f.median * 1e3, ratio.median, ratio.min, ratio.max, ts * 1e3, ts > 0 ? ts / s.median : 0.0,
        cs.host_bytes / 1048576.0, rss_mib());
    std::fflush(stdout);
  }
  // Prefix sharing: a batch of `batch` sequences sharing a `prefix`-token prefix (each with one
  // page of its own after it) against the same batch with nothing shared (other prefix tokens,
  // same lengths). Pages in the host tier; one batch decode step per repetition.
  if (prefix > 0 && batch > 0) {
    std::printf("\nprefix sharing: batch %d, %lld-token prefix, host tier, %d threads\n", batch,
                static_cast<long long>(prefix), threads);
    std::printf("%10s %22s %22s %9s\n", "", "shared ms (min..max)", "separate ms (min..max)",
                "speed-up");
    auto run_batch = [&](bool shared) {
      ring::gen::GeneratorOptions o;
      o.threads = threads;
      o.cache.page_tokens = page_tokens;
      o.cache.fast_bytes = 0;
      o.cache.window = 0;
      ring::gen::Generator g(c, params.data(), be.get(), o);
      std::vector<int> seqs;
      std::mt19937_64 rng(7);
      std::vector<int32_t> common(static_cast<size_t>(prefix));
      for (auto& id : common) id = static_cast<int32_t>(rng() % 256);
      std::vector<float> kv_common;  // the shared prefix's K/V per layer
      for (int b = 0; b < batch; ++b) {
        std::vector<int32_t> ids = common;
        if (!shared)
          for (auto& id : ids) id = static_cast<int32_t>(rng() % 256);
        for (int64_t i = 0; i < page_tokens; ++i) ids.push_back(static_cast<int32_t>(rng() % 256));
        const int64_t len = static_cast<int64_t>(ids.size());
        seqs.push_back(g.attach(ids, {}, [&](int, float* k, float* v) {
          std::normal_distribution<float> nd(0.f, 1.f);
          for (int64_t i = 0; i < len * c.kv_dim(); ++i) {
            k[i] = nd(rng);
            v[i] = nd(rng);
          }
        }));
      }
      std::vector<int32_t> toks(static_cast<size_t>(batch), 1);
      std::vector<float> logits;
      std::vector<double> t;
      for (int r = 0; r < reps + 1; ++r) {
        ring::gen::StepTiming st = g.step(seqs, toks, &logits);
        if (r > 0) t.push_back(st.seconds);
      }
      return t;
    };
    const auto shared = run_batch(true);
    const auto separate = run_batch(false);
    const auto a = ring::bench::spread(shared), b = ring::bench::spread(separate);
    std::printf("%10s %8.2f (%6.2f..%6.2f) %8.2f (%6.2f..%6.2f) %9.2f\n", "step", a.median * 1e3,
                a.min * 1e3, a.max * 1e3, b.median * 1e3, b.min * 1e3, b.max * 1e3,
                b.median / a.median);
  }
  if (prefill_len > 0) {
    std::printf("\nprefill: %lld tokens, host tier, %d threads\n",
                static_cast<long long>(prefill_len), threads);
    std::vector<int32_t> ids(static_cast<size_t>(prefill_len));
    std::mt19937_64 rng(3);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 256);
    std::vector<int32_t> labels(ids.size(), -1);
    std::vector<int64_t> pos(ids.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
    ring::model::LocalAttention att(be.get());
    ring::model::ModelConfig rc = c;
    rc.recompute = true;  // as the generator's prefill model
    ring::model::Model m(rc, be.get(), &att);
    m.set_params(params);
    ring::gen::GeneratorOptions o;
    o.threads = threads;
    o.cache.page_tokens = page_tokens;
    o.cache.fast_bytes = 0;
    o.cache.window = 0;
    ring::gen::Generator g(c, params.data(), be.get(), o);
    std::vector<double> fwd, pre;
    for (int r = 0; r < std::max(3, reps / 3); ++r) {
      auto t0 = Clock::now();
      m.forward({prefill_len, ids.data(), labels.data(), pos.data(), nullptr}, 1);
      fwd.push_back(seconds_since(t0));
      t0 = Clock::now();
      const int seq = g.prefill(ids, {}, nullptr);
      pre.push_back(seconds_since(t0));
      g.release(seq);
    }
    const auto a = ring::bench::spread(pre), b = ring::bench::spread(fwd);
    const auto ratio = ring::bench::paired_ratio(fwd, pre);
    std::printf("%22s %22s %18s\n", "prefill tok/s (min..max)", "forward tok/s (min..max)",
                "prefill / forward");
    std::printf("%8.0f (%6.0f..%6.0f) %8.0f (%6.0f..%6.0f) %6.2f (%4.2f..%4.2f)\n",
                prefill_len / a.median, prefill_len / a.max, prefill_len / a.min,
                prefill_len / b.median, prefill_len / b.max, prefill_len / b.min, ratio.median,
                ratio.min, ratio.max);
  }
  return 0;
}
