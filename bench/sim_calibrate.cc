// Measures this machine's rates for `ringctl simulate --gpu cpu --calibration FILE` with the CPU
// backend, at a spec's shapes (default configs/examples/tiny.yaml), on its cpus_per_worker threads:
//   gemm_flops            the projections' GEMM [T, d] x [d, 3 d] (2 T d 3d FLOPs), median
//   attention_fwd_flops   one fully allowed T x T block (every key before every query): the
//   attention_bwd_flops   simulator's convention, 4 (forward) and 10 (backward) x heads x
//                         head_dim per allowed (query, key) pair
//   intra_node_bytes_per_s  one-thread memcpy of 64 MiB / 2 (the shared-memory transport copies
//                         into the segment and out of it)
//   adamw_params_per_s    Backend::adamw_step over 16 Mi floats, all cores (ringd's threads)
//   checkpoint_bytes_per_s  256 MiB write + fdatasync in the output file's directory
// Every figure is the median of --reps repetitions; the spread (min..max) is printed.
//
//   sim_calibrate [--spec FILE] [--reps N] -o FILE
#include <fcntl.h>
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

#include "common/spec/parse.h"
#include "kernels/backend.h"

namespace {

using Clock = std::chrono::steady_clock;
using ring::kernels::Status;

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
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

}  // namespace

int main(int argc, char** argv) {
  std::string spec_path = "configs/examples/tiny.yaml", out_path;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--spec" && i + 1 < argc) spec_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if ((a == "-o" || a == "--output") && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: sim_calibrate [--spec FILE] [--reps N] -o FILE\n");
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
  // AdamW on all cores.
  auto all = ring::kernels::create_backend("cpu", 0, &err);
  const int64_t n = 16 << 20;
  std::vector<float> p(n, 0.1f), gr(n, 0.01f), m(n), vv(n);
  ring::kernels::Backend::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  std::vector<double> ad;
  for (int k = 0; k < reps; ++k) {
    auto t0 = Clock::now();
    check(all->adamw_step(n, hp, p.data(), gr.data(), m.data(), vv.data()), "adamw_step");
    ad.push_back(static_cast<double>(n) / seconds(t0));
    ++hp.step;
  }
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
  show("gemm", G, 1e9, "GFLOP/s");
  show("attention forward", AF, 1e9, "GFLOP/s");
  show("attention backward", AB, 1e9, "GFLOP/s");
  show("intra-node copy", CP, 1e9, "GB/s");
  show("AdamW (all cores)", AD, 1e9, "Gparam/s");
  show("checkpoint write", CK, 1e9, "GB/s");
  nlohmann::json j = {{"gemm_flops", G.median},
                      {"attention_fwd_flops", AF.median},
                      {"attention_bwd_flops", AB.median},
                      {"intra_node_bytes_per_s", CP.median},
                      {"adamw_params_per_s", AD.median},
                      {"checkpoint_bytes_per_s", CK.median},
                      {"threads", threads},
                      {"machine", std::to_string(std::thread::hardware_concurrency()) + " cores"},
                      {"measured", "bench/sim_calibrate on " + spec_path}};
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
