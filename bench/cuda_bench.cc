// GPU figures of the CUDA backend against baselines measured in the same run:
//   - attention block forward and backward TFLOP/s (bf16 storage, causal, one block pair
//     q_len = kv_len = L) vs cuBLAS bf16 GEMM TFLOP/s (C[n,n] = A B, n = 8192, fp32 accumulate);
//     targets: forward >= 0.5, backward >= 0.35 of the GEMM rate;
//   - device-to-host bandwidth of the offload path (offload_to_host into a pinned POSIX shm
//     mapping, on the backend's own D2H stream) vs a plain cudaMemcpy (copy_to_host) into the
//     same pinned memory and into ordinary pageable memory.
//
//   cuda_bench [--len L] [--heads H] [--head-dim D] [--reps R] [--mib M]
//
// FLOPs of attention are what the kernels report in AttentionStats::flops (4 rows keys hd per
// computed tile in the forward, 10 in the backward; skipped tiles count nothing). Each
// repetition times attention forward, backward (prepare + backward), GEMM and the copies once,
// interleaved; ratios are per repetition, reported as median and min..max. Exit 2 when no GPU.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace {

using ring::kernels::AttentionArgs;
using ring::kernels::AttentionStats;
using ring::kernels::Backend;
using ring::kernels::DType;
using ring::kernels::Status;

struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Spread s;
  if (v.empty()) return s;
  s.min = v.front();
  s.max = v.back();
  const size_t h = v.size() / 2;
  s.median = v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  return s;
}

[[noreturn]] void die(const std::string& what, Backend* b) {
  std::fprintf(stderr, "cuda_bench: %s%s%s\n", what.c_str(), b ? ": " : "",
               b ? b->last_error().c_str() : "");
  std::exit(1);
}
void ok(Status s, const char* what, Backend* b) {
  if (s != Status::kOk)
    die(std::string(what) + " failed (" + ring::kernels::status_string(s) + ")", b);
}

// Seconds of one call of f, the device drained before and after.
double timed(Backend* b, const std::function<void()>& f) {
  ok(b->synchronize(), "synchronize", b);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  ok(b->synchronize(), "synchronize", b);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void* dev_alloc(Backend* b, size_t bytes) {
  void* p = nullptr;
  ok(b->alloc(bytes, &p), "alloc", b);
  return p;
}

// bf16 bits of N(0, 1) samples.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x = static_cast<uint16_t>(u >> 16);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t len = 16384, heads = 16, hd = 128, gemm_n = 8192;
  int reps = 7;
  size_t mib = 1024;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cuda_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--len") {
      len = std::atoll(next());
    } else if (a == "--heads") {
      heads = std::atoll(next());
    } else if (a == "--head-dim") {
      hd = std::atoll(next());
    } else if (a == "--reps") {
      reps = std::atoi(next());
    } else if (a == "--mib") {
      mib = static_cast<size_t>(std::atoll(next()));
    } else {
      std::fprintf(stderr,
                   "usage: cuda_bench [--len L] [--heads H] [--head-dim D] [--reps R] [--mib M]\n");
      return 2;
    }
  }
  if (len <= 0 || heads <= 0 || hd <= 0 || hd > 128 || reps <= 0 || mib == 0) {
    std::fprintf(stderr,
                 "cuda_bench: --len, --heads, --reps, --mib > 0 and --head-dim in 1..128\n");
    return 2;
  }
  std::string err;
  auto be = ring::kernels::create_backend("cuda", 0, &err);
  if (!be) {
    std::fprintf(stderr, "cuda_bench: no CUDA backend: %s\n", err.c_str());
    return 2;
  }
  Backend* b = be.get();

  // ---- attention inputs --------------------------------------------------------------------
  const size_t qn = static_cast<size_t>(len * heads * hd);
  void* q = dev_alloc(b, qn * 2);
  void* k = dev_alloc(b, qn * 2);
  void* v = dev_alloc(b, qn * 2);
  void* dout = dev_alloc(b, qn * 2);
  for (void* p : {q, k, v, dout}) {
    auto h = random_bf16(qn, reinterpret_cast<uintptr_t>(p));
    ok(b->copy_to_device(p, h.data(), qn * 2), "copy", b);
  }
  std::vector<int64_t> pos(len);
  for (int64_t i = 0; i < len; ++i) pos[i] = i;
  auto* dpos = static_cast<int64_t*>(dev_alloc(b, sizeof(int64_t) * len));
  ok(b->copy_to_device(dpos, pos.data(), sizeof(int64_t) * len), "copy", b);
  auto* out = static_cast<float*>(dev_alloc(b, qn * 4));
  auto* lse = static_cast<float*>(dev_alloc(b, len * heads * 4));
  auto* delta = static_cast<float*>(dev_alloc(b, len * heads * 4));
  auto* dq = static_cast<float*>(dev_alloc(b, qn * 4));
  auto* dk = static_cast<float*>(dev_alloc(b, qn * 4));
  auto* dv = static_cast<float*>(dev_alloc(b, qn * 4));
  AttentionArgs a;
  a.q_len = a.kv_len = len;
  a.heads = a.kv_heads = heads;
  a.head_dim = hd;
  a.scale = 1.f / std::sqrt(static_cast<float>(hd));
  a.causal = true;
  a.dtype = DType::kBF16;
  a.q = q;
  a.k = k;
  a.v = v;
  a.q_pos = a.k_pos = dpos;
  AttentionStats fst, bst;
  ok(b->attention_forward(a, out, lse, &fst), "attention_forward", b);
  ok(b->attention_backward_prepare(DType::kBF16, len, heads, hd, out, dout, delta), "prepare", b);
  ok(b->attention_backward(a, dout, lse, delta, dq, dk, dv, &bst), "attention_backward", b);

  // ---- GEMM inputs ---------------------------------------------------------------------------
  const size_t gn = static_cast<size_t>(gemm_n * gemm_n);
  void* ga = dev_alloc(b, gn * 2);
  void* gb = dev_alloc(b, gn * 2);
  void* gc = dev_alloc(b, gn * 2);
  {
    auto h = random_bf16(gn, 1);
    ok(b->copy_to_device(ga, h.data(), gn * 2), "copy", b);
    ok(b->copy_to_device(gb, h.data(), gn * 2), "copy", b);
  }
  const double gemm_flops = 2.0 * gemm_n * gemm_n * gemm_n;
  auto gemm = [&] {
    ok(b->gemm(DType::kBF16, false, false, gemm_n, gemm_n, gemm_n, 1.f, ga, gemm_n, gb, gemm_n, 0.f,
               gc, gemm_n),
       "gemm", b);
  };
  gemm();  // warm-up (cuBLAS heuristics, clocks)

  // ---- copy buffers --------------------------------------------------------------------------
  const size_t bytes = mib << 20;
  void* src = dev_alloc(b, bytes);
  ok(b->fill(static_cast<int64_t>(bytes / 4), 1.f, static_cast<float*>(src)), "fill", b);
  const std::string shm = "/ring-cuda-bench-" + std::to_string(getpid());
  int fd = shm_open(shm.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    die("shm_open/ftruncate " + shm, nullptr);
  shm_unlink(shm.c_str());
  void* pinned = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (pinned == MAP_FAILED) die("mmap of " + shm, nullptr);
  ok(b->pin_host(pinned, bytes), "pin_host", b);
  std::vector<char> pageable(bytes);

  std::vector<double> fwd_t, bwd_t, gemm_t, off_t_, cpy_pinned_t, cpy_pageable_t;
  for (int r = 0; r < reps; ++r) {
    fwd_t.push_back(timed(b, [&] { ok(b->attention_forward(a, out, lse, nullptr), "fwd", b); }));
    bwd_t.push_back(timed(b, [&] {
      ok(b->attention_backward_prepare(DType::kBF16, len, heads, hd, out, dout, delta), "prep", b);
      ok(b->attention_backward(a, dout, lse, delta, dq, dk, dv, nullptr), "bwd", b);
    }));
    gemm_t.push_back(timed(b, gemm));
    off_t_.push_back(timed(b, [&] {
      ok(b->offload_to_host(pinned, src, bytes), "offload_to_host", b);
      ok(b->offload_wait(), "offload_wait", b);
    }));
    cpy_pinned_t.push_back(timed(b, [&] { ok(b->copy_to_host(pinned, src, bytes), "copy", b); }));
    cpy_pageable_t.push_back(
        timed(b, [&] { ok(b->copy_to_host(pageable.data(), src, bytes), "copy", b); }));
  }
  std::vector<double> fwd_ratio, bwd_ratio, off_ratio_pinned, off_ratio_pageable;
  for (int r = 0; r < reps; ++r) {
    const double g = gemm_flops / gemm_t[r];
    fwd_ratio.push_back(fst.flops / fwd_t[r] / g);
    bwd_ratio.push_back(bst.flops / bwd_t[r] / g);
    off_ratio_pinned.push_back(cpy_pinned_t[r] / off_t_[r]);
    off_ratio_pageable.push_back(cpy_pageable_t[r] / off_t_[r]);
  }
  auto tf = [](double flops, const std::vector<double>& t) {
    Spread s = spread(t);
    return std::vector<double>{flops / s.median / 1e12, flops / s.max / 1e12, flops / s.min / 1e12};
  };
  auto gbs = [&](const std::vector<double>& t) {
    Spread s = spread(t);
    return std::vector<double>{bytes / s.median / 1e9, bytes / s.max / 1e9, bytes / s.min / 1e9};
  };
  std::printf(
      "cuda_bench: %d repetitions; attention bf16 causal L=%lld heads=%lld head_dim=%lld "
      "(%lld of %lld tiles skipped); GEMM bf16 n=%lld; copies %zu MiB\n",
      reps, static_cast<long long>(len), static_cast<long long>(heads), static_cast<long long>(hd),
      static_cast<long long>(fst.tiles_skipped), static_cast<long long>(fst.tiles_total),
      static_cast<long long>(gemm_n), mib);
  auto row = [](const char* name, const std::vector<double>& v, const char* unit) {
    std::printf("  %-40s %9.2f %s  (%.2f..%.2f)\n", name, v[0], unit, v[1], v[2]);
  };
  row("cuBLAS bf16 GEMM", tf(gemm_flops, gemm_t), "TFLOP/s");
  row("attention forward", tf(fst.flops, fwd_t), "TFLOP/s");
  row("attention backward (prepare + backward)", tf(bst.flops, bwd_t), "TFLOP/s");
  row("D2H offload (pinned shm, own stream)", gbs(off_t_), "GB/s");
  row("D2H cudaMemcpy into the same pinned memory", gbs(cpy_pinned_t), "GB/s");
  row("D2H cudaMemcpy into pageable memory", gbs(cpy_pageable_t), "GB/s");
  auto ratio = [](const char* name, const std::vector<double>& v, const char* target) {
    Spread s = spread(v);
    std::printf("  ratio %-46s %6.3f  (%.3f..%.3f)  %s\n", name, s.median, s.min, s.max, target);
  };
  ratio("attention forward / GEMM", fwd_ratio, "target >= 0.5");
  ratio("attention backward / GEMM", bwd_ratio, "target >= 0.35");
  ratio("offload D2H / cudaMemcpy (pinned)", off_ratio_pinned, "");
  ratio("offload D2H / cudaMemcpy (pageable)", off_ratio_pageable, "");
  b->unpin_host(pinned);
  munmap(pinned, bytes);
  for (void* p : {q, k, v, dout, ga, gb, gc, src}) b->free(p);
  for (void* p : {static_cast<void*>(dpos), static_cast<void*>(out), static_cast<void*>(lse),
                  static_cast<void*>(delta), static_cast<void*>(dq), static_cast<void*>(dk),
                  static_cast<void*>(dv)}) {
    b->free(p);
  }
  return 0;
}
