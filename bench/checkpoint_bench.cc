// Checkpoint save throughput against a plain sequential write of the same bytes to the same
// disk, and the training stall a checkpoint causes at the tiny example's size, measured in the
// same run.
//
//   checkpoint_bench [--dir /var/tmp/ringmaster-ckpt-bench] [--mib 256] [--reps 5]
//                    [--spec configs/examples/tiny.yaml] [--tokens 4096] [--threads 1]
//
// Throughput: `reps` pairs, in alternating order, of (a) write() of the state in 4 MiB pieces to
// one file + fdatasync, and (b) a Checkpointer save of the same bytes (3 tensors, fsync on:
// fallocate, pwrite from live memory with xxh3, fdatasync, manifests, renames, directory
// fsyncs). Ratio = time(a) / time(b) = our throughput relative to the plain write; target >= 0.8.
//
// Stall: the tiny spec's model on one rank's share of the context (--tokens; tiny: 16384 over 4
// ranks = 4096), its real training step on `threads` threads; the optimizer state is master, m
// and v of its parameters (what ringd holds). Per repetition: start a checkpoint, run the next
// step's forward/backward (the real trainer step), then an AdamW-like update over the state
// bucket by bucket (1 Mi floats), calling before_modify() first. The stall is the time spent in
// start() plus in before_modify() (SaveResult::stall_s); reported against the step time measured
// without checkpoints; target <= 5%. Also reported: the same with the update right after start()
// (no compute in between: the guard's worst case), and ringd's policy today (wait for the whole
// checkpoint before the first bucket of the next update).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/spec/parse.h"
#include "common/checkpoint/checkpoint.h"
#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/train/trainer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return {};
  size_t h = v.size() / 2;
  return {v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]), v.front(), v.back()};
}

void die(const std::string& m) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", m.c_str());
  std::exit(1);
}

double plain_write(const std::string& path, const std::vector<std::vector<float>*>& bufs) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die(path + ": cannot create");
  const size_t piece = 4u << 20;
  for (auto* b : bufs) {
    const char* p = reinterpret_cast<const char*>(b->data());
    size_t n = b->size() * sizeof(float);
    while (n > 0) {
      ssize_t w = ::write(fd, p, std::min(n, piece));
      if (w <= 0) die(path + ": write failed");
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  if (::fdatasync(fd) != 0) die(path + ": fdatasync failed");
  ::close(fd);
  return since(t0);
}

void adamw_like(std::vector<float>& w, std::vector<float>& m, std::vector<float>& v,
                ring::ckpt::Checkpointer* ck, size_t bucket) {
  for (size_t b = 0; b < w.size(); b += bucket) {
    size_t e = std::min(w.size(), b + bucket);
    if (ck) {
      ck->before_modify(w.data() + b, (e - b) * 4);
      ck->before_modify(m.data() + b, (e - b) * 4);
      ck->before_modify(v.data() + b, (e - b) * 4);
    }
    for (size_t i = b; i < e; ++i) {
      float g = 1e-3f * static_cast<float>((i * 2654435761u) & 1023) - 0.5f;
      m[i] = 0.9f * m[i] + 0.1f * g;
      v[i] = 0.999f * v[i] + 0.001f * g * g;
      w[i] -= 1e-3f * (m[i] / (std::sqrt(v[i]) + 1e-8f) + 0.1f * w[i]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp/ringmaster-ckpt-bench", spec_file = "configs/examples/tiny.yaml";
  int64_t mib = 256, tokens = 4096;
  int reps = 5, threads = 1;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) die(f + " needs a value");
      return argv[++i];
    };
    if (f == "--dir") dir = val();
    else if (f == "--mib") mib = std::atoll(val().c_str());
    else if (f == "--reps") reps = std::atoi(val().c_str());
    else if (f == "--spec") spec_file = val();
    else if (f == "--tokens") tokens = std::atoll(val().c_str());
    else if (f == "--threads") threads = std::atoi(val().c_str());
    else die("unknown flag " + f + " (see the comment at the top of bench/checkpoint_bench.cc)");
  }
  if (mib < 1 || reps < 1 || tokens < 16 || threads < 1) die("flags out of range");
  fs::remove_all(dir);
  fs::create_directories(dir);

  // ---- throughput ----------------------------------------------------------------------------
  {
    size_t n = static_cast<size_t>(mib) * (1u << 20) / sizeof(float) / 3;
    std::vector<float> w(n), m(n), v(n);
    std::mt19937 rng(1);
    for (size_t i = 0; i < n; ++i) w[i] = float(rng()) * 1e-9f, m[i] = w[i] * 0.5f, v[i] = w[i] * w[i];
    std::vector<double> plain_s, ckpt_s, ratio;
    for (int r = 0; r < reps; ++r) {
      double a = 0, b = 0;
      for (int order = 0; order < 2; ++order) {
        bool plain_first = (r % 2 == 0);
        if ((order == 0) == plain_first) {
          a = plain_write(dir + "/plain.bin", {&w, &m, &v});
          fs::remove(dir + "/plain.bin");
        } else {
          ring::ckpt::Options o;
          o.dir = dir + "/ckpt";
          o.keep_last = 1;
          ring::ckpt::Checkpointer ck(o);
          ck.add_tensor("master", ring::ckpt::DType::kF32, {int64_t(n)}, w.data());
          ck.add_tensor("adam_m", ring::ckpt::DType::kF32, {int64_t(n)}, m.data());
          ck.add_tensor("adam_v", ring::ckpt::DType::kF32, {int64_t(n)}, v.data());
          auto t0 = Clock::now();
          ck.start(r + 1, {{"cursor", {{"epoch", 0}}}});
          auto res = ck.wait();
          b = since(t0);
          if (!res.ok) die("checkpoint failed: " + res.error);
          fs::remove_all(o.dir);
        }
      }
      plain_s.push_back(a);
      ckpt_s.push_back(b);
      ratio.push_back(a / b);
    }
    double gb = 3.0 * n * 4 / 1e9;
    auto P = spread(plain_s), C = spread(ckpt_s), R = spread(ratio);
    std::printf("throughput: %.0f MiB state in %s, %d pairs\n", 3.0 * n * 4 / (1 << 20),
                dir.c_str(), reps);
    std::printf("  plain write+fdatasync : %.3f s median (%.3f-%.3f), %.2f GB/s\n", P.median,
                P.min, P.max, gb / P.median);
    std::printf("  checkpoint save       : %.3f s median (%.3f-%.3f), %.2f GB/s\n", C.median,
                C.min, C.max, gb / C.median);
    std::printf("  ratio (plain time / checkpoint time) : %.3f median (%.3f-%.3f)  [target >= 0.8]\n",
                R.median, R.min, R.max);
  }

  // ---- stall at the tiny size ---------------------------------------------------------------
  {
    auto lr = ring::spec::load_spec_file(spec_file);
    if (!lr.ok()) die(spec_file + ": invalid spec");
    ring::spec::JobSpec spec = *lr.spec;
    spec.data.seq_len = tokens;
    std::string err;
    auto backend = ring::kernels::create_backend("cpu", threads, &err);
    if (!backend) die("cpu backend: " + err);
    ring::model::LocalAttention attention(backend.get());
    ring::train::Trainer trainer(spec, backend.get(), &attention, 1000);
    // A batch of random bytes: one document per 1024 tokens.
    std::vector<int32_t> ids(tokens), labels(tokens), docs(tokens);
    std::vector<int64_t> pos(tokens);
    std::mt19937 rng(7);
    for (int64_t i = 0; i < tokens; ++i) {
      ids[i] = int32_t(rng() % 256);
      docs[i] = int32_t(i / 1024);
      pos[i] = i;
    }
    for (int64_t i = 0; i < tokens; ++i)
      labels[i] = (i + 1 < tokens && docs[i + 1] == docs[i]) ? ids[i + 1] : -1;
    int64_t valid = std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l >= 0; });
    ring::model::Batch batch{tokens, ids.data(), labels.data(), pos.data(), docs.data()};

    const size_t n = static_cast<size_t>(trainer.model().layout().total());
    std::vector<float> w(trainer.model().get_params()), m(n, 0.f), v(n, 0.f);
    const size_t bucket = 1u << 20;

    trainer.train_step(batch, valid);  // warm-up
    std::vector<double> step_s;
    for (int r = 0; r < 3; ++r) {
      auto t0 = Clock::now();
      trainer.train_step(batch, valid);
      adamw_like(w, m, v, nullptr, bucket);
      step_s.push_back(since(t0));
    }
    double T = spread(step_s).median;

    ring::ckpt::Options o;
    o.dir = dir + "/tiny";
    o.keep_last = 2;
    ring::ckpt::Checkpointer ck(o);
    ck.add_tensor("master", ring::ckpt::DType::kF32, {int64_t(n)}, w.data());
    ck.add_tensor("adam_m", ring::ckpt::DType::kF32, {int64_t(n)}, m.data());
    ck.add_tensor("adam_v", ring::ckpt::DType::kF32, {int64_t(n)}, v.data());
    std::vector<double> stall, b2b, ringd_wait, save_s;
    for (int r = 0; r < reps; ++r) {
      // (1) the pattern of training: checkpoint, next step's compute, then the update.
      auto t0 = Clock::now();
      ck.start(3 * r + 1, {});
      double start_s = since(t0);
      trainer.train_step(batch, valid);
      adamw_like(w, m, v, &ck, bucket);
      auto res = ck.wait();
      if (!res.ok) die("checkpoint failed: " + res.error);
      stall.push_back(start_s + res.stall_s);
      save_s.push_back(res.total_s);
      // (2) worst case: the update right after start().
      t0 = Clock::now();
      ck.start(3 * r + 2, {});
      start_s = since(t0);
      adamw_like(w, m, v, &ck, bucket);
      res = ck.wait();
      if (!res.ok) die("checkpoint failed: " + res.error);
      b2b.push_back(start_s + res.stall_s);
      // (3) ringd today: wait for the whole checkpoint before the next update.
      ck.start(3 * r + 3, {});
      trainer.train_step(batch, valid);
      t0 = Clock::now();
      if (ck.busy()) ck.wait();
      else ck.poll();
      ringd_wait.push_back(since(t0));
      adamw_like(w, m, v, nullptr, bucket);
    }
    auto S = spread(stall), B = spread(b2b), W = spread(ringd_wait), V = spread(save_s);
    std::printf("stall: %s model at %lld tokens, %d thread(s): %zu params, state %.1f MiB "
                "(master, m, v), step %.3f s (median of 3)\n",
                spec_file.c_str(), static_cast<long long>(tokens), threads, n,
                3.0 * n * 4 / (1 << 20), T);
    std::printf("  checkpoint save time (async)            : %.4f s median (%.4f-%.4f)\n",
                V.median, V.min, V.max);
    std::printf("  stall, update after the next step       : %.6f s median (%.6f-%.6f) = %.3f%% "
                "of a step  [target <= 5%%]\n",
                S.median, S.min, S.max, 100 * S.median / T);
    std::printf("  stall, update right after start (worst) : %.6f s median (%.6f-%.6f) = %.3f%% "
                "of a step\n",
                B.median, B.min, B.max, 100 * B.median / T);
    std::printf("  ringd's whole-checkpoint wait           : %.6f s median (%.6f-%.6f) = %.3f%% "
                "of a step\n",
                W.median, W.min, W.max, 100 * W.median / T);
  }
  fs::remove_all(dir);
  return 0;
}
