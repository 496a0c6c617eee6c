// Full training step (forward, backward, global-norm clip, AdamW) of ringmaster's model against
// the same model in PyTorch 1.13 (bench/torch_train_step.py, explicit masked-softmax attention,
// torch.set_num_threads equal to ours), measured in the same run; and peak memory (VmHWM) per
// sequence length, each measured in a fresh process.
//
//   train_step_bench [--threads 2] [--reps 3] [--seq-len 8192]
//                    [--mem-seq-lens 2048,4096,8192,16384] [--torch-max-seq 8192] [--no-torch]
//   train_step_bench --bf16 [--seq-len 16384] [--reps 6]
//
// --bf16: the whole step (forward, backward, clip, AdamW) with model.dtype bf16 against fp32 on
// the same batch and weights, alternating fp32 and bf16 steps in one run: median, min..max and
// the ratio of medians (docs/precision.md, docs/performance.md).
//
// Model: 2 layers, d_model 256, 4 heads (head_dim 64), 2 kv heads, swiglu (hidden 704), vocab
// 256, tied embeddings. Batch: packed documents of deterministic random lengths in [64, 2048]
// with random byte tokens, labels shifted within each document.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/train/trainer.h"

namespace {

namespace fs = std::filesystem;
using ring::train::StepStats;

struct Options {
  int threads = 2;
  int reps = 3;
  int64_t seq_len = 8192;
  std::vector<int64_t> mem_seq_lens = {2048, 4096, 8192, 16384};
  int64_t torch_max_seq = 8192;
  bool torch = true;
  bool bf16 = false;
  int64_t child_mem = 0;  // internal: measure our peak memory at this length and exit
};

ring::spec::JobSpec bench_spec(int64_t seq_len, bool bf16 = false) {
  std::string yaml = R"(
job: {name: train-step-bench}
model: {layers: 2, d_model: 256, heads: 4, kv_heads: 2, mlp: swiglu, vocab: 256,
        tie_embeddings: true, dtype: )" + std::string(bf16 ? "bf16" : "fp32") + R"(}
data: {source: passkey, seq_len: )" + std::to_string(seq_len) + R"(}
optimizer: {lr: 1.0e-4, weight_decay: 0.1, offload: none, schedule: constant}
train: {steps: 100, grad_clip: 1.0, seed: 1}
resources: {nodes: 1, workers_per_node: 1, backend: cpu, host_memory_gb: 8}
)";
  auto r = ring::spec::load_spec_string(yaml, "train_step_bench");
  if (!r.ok()) {
    for (auto& d : r.diagnostics) std::fprintf(stderr, "%s\n", d.str().c_str());
    std::exit(1);
  }
  return *r.spec;
}

struct HostBatch {
  std::vector<int32_t> ids, labels, docs;
  std::vector<int64_t> pos;
  int64_t valid = 0;
  ring::model::Batch batch() const {
    return {static_cast<int64_t>(ids.size()), ids.data(), labels.data(), pos.data(), docs.data()};
  }
};

HostBatch make_batch(int64_t t) {
  std::mt19937_64 rng(42);
  HostBatch b;
  int32_t doc = 0;
  int64_t left = 64 + static_cast<int64_t>(rng() % (2048 - 64 + 1));
  for (int64_t i = 0; i < t; ++i) {
    if (left == 0) {
      ++doc;
      left = 64 + static_cast<int64_t>(rng() % (2048 - 64 + 1));
    }
    b.ids.push_back(static_cast<int32_t>(rng() % 256));
    b.docs.push_back(doc);
    b.pos.push_back(i);
    --left;
  }
  for (int64_t i = 0; i < t; ++i) {
    bool last = i + 1 == t || b.docs[i + 1] != b.docs[i];
    b.labels.push_back(last ? -1 : b.ids[i + 1]);
    b.valid += !last;
  }
  return b;
}

int64_t vmhwm_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

template <typename T>
void write_raw(const fs::path& p, const std::vector<T>& v) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

// Writes the model and batch for torch_train_step.py (the layout of tests/worker/torch_model.py).
void write_torch_dir(const fs::path& dir, ring::model::Model& model, const HostBatch& b) {
  fs::create_directories(dir);
  const auto& c = model.config();
  nlohmann::json j{{"layers", c.layers},         {"d_model", c.d_model},
                   {"heads", c.heads},           {"kv_heads", c.kv_heads},
                   {"head_dim", c.head_dim},     {"mlp", ring::spec::to_string(c.mlp)},
                   {"tie_embeddings", c.tie_embeddings}, {"rope_theta", c.rope_theta},
                   {"norm_eps", c.norm_eps},     {"global_valid", b.valid},
                   {"total", model.layout().total()}};
  for (const auto& v : model.layout().views()) {
    j["params"].push_back({{"name", v.name}, {"shape", v.shape}, {"offset", v.offset},
                           {"size", v.size}});
  }
  std::ofstream(dir / "config.json") << j.dump();
  write_raw(dir / "params.f32", model.get_params());
  write_raw(dir / "ids.i32", b.ids);
  write_raw(dir / "labels.i32", b.labels);
  write_raw(dir / "docs.i32", b.docs);
  write_raw(dir / "pos.i64", b.pos);
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  int rc = pclose(p);
  if (rc != 0) std::fprintf(stderr, "command failed (%d): %s\n%s", rc, cmd.c_str(), out.c_str());
  return rc == 0 ? out : std::string();
}

double field(const std::string& line, const std::string& key) {
  auto at = line.find(key + "=");
  return at == std::string::npos ? NAN : std::atof(line.c_str() + at + key.size() + 1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

struct Ours {
  std::vector<double> step_s;
  double loss = 0;
};

int child_mem(const Options& o) {
  std::string err;
  auto backend = ring::kernels::create_backend("cpu", o.threads, &err);
  ring::spec::JobSpec spec = bench_spec(o.child_mem);
  HostBatch b = make_batch(o.child_mem);
  ring::model::LocalAttention attention(backend.get());
  ring::train::Trainer trainer(spec, backend.get(), &attention, 100);
  for (int i = 0; i < 2; ++i) trainer.train_step(b.batch(), b.valid);
  std::printf("ours_mem tokens=%lld vmhwm_kb=%lld\n", static_cast<long long>(o.child_mem),
              static_cast<long long>(vmhwm_kb()));
  return 0;
}

// --bf16: fp32 and bf16 steps alternated on the same batch (each trainer from the same seed).
int bf16_vs_fp32(const Options& o, ring::kernels::Backend* backend) {
  HostBatch b = make_batch(o.seq_len);
  ring::model::LocalAttention a32(backend), a16(backend);
  ring::train::Trainer t32(bench_spec(o.seq_len, false), backend, &a32, 100);
  ring::train::Trainer t16(bench_spec(o.seq_len, true), backend, &a16, 100);
  std::printf("bf16 vs fp32 training step: 2 layers, d_model 256, heads 4/2, %lld tokens, %d "
              "threads\n",
              static_cast<long long>(o.seq_len), o.threads);
  std::vector<double> s32, s16;
  for (int r = 0; r <= o.reps; ++r) {  // step 1 of each touches fresh memory: not timed
    const StepStats a = t32.train_step(b.batch(), b.valid);
    const StepStats c = t16.train_step(b.batch(), b.valid);
    std::printf("  step %d: fp32 %.3f s (loss %.5f), bf16 %.3f s (loss %.5f)\n", r + 1,
                a.step_ms / 1000, a.loss, c.step_ms / 1000, c.loss);
    std::fflush(stdout);
    if (r == 0) continue;
    s32.push_back(a.step_ms / 1000);
    s16.push_back(c.step_ms / 1000);
  }
  auto range = [](const std::vector<double>& v) {
    return std::make_pair(*std::min_element(v.begin(), v.end()),
                          *std::max_element(v.begin(), v.end()));
  };
  const auto [lo32, hi32] = range(s32);
  const auto [lo16, hi16] = range(s16);
  std::printf("\nstep at %lld tokens: fp32 median %.3f s (%.3f..%.3f), bf16 median %.3f s "
              "(%.3f..%.3f): bf16 is %.2fx fp32's speed\n",
              static_cast<long long>(o.seq_len), median(s32), lo32, hi32, median(s16), lo16,
              hi16, median(s32) / median(s16));
  return 0;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoll(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--threads") o.threads = std::atoi(val());
    else if (f == "--reps") o.reps = std::atoi(val());
    else if (f == "--seq-len") o.seq_len = std::atoll(val());
    else if (f == "--mem-seq-lens") o.mem_seq_lens = parse_list(val());
    else if (f == "--torch-max-seq") o.torch_max_seq = std::atoll(val());
    else if (f == "--no-torch") o.torch = false;
    else if (f == "--bf16") o.bf16 = true;
    else if (f == "--child-mem") o.child_mem = std::atoll(val());
    else {
      std::fprintf(stderr, "unknown argument %s\n", f.c_str());
      return 2;
    }
  }
  if (o.child_mem > 0) return child_mem(o);

  std::string err;
  auto backend = ring::kernels::create_backend("cpu", o.threads, &err);
  if (!backend) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  if (o.bf16) return bf16_vs_fp32(o, backend.get());
  const fs::path dir = fs::temp_directory_path() / ("train_step_bench_" + std::to_string(getpid()));
  const std::string self = fs::read_symlink("/proc/self/exe").string();

  // ---- throughput at seq_len, ours and torch in the same run (ours before and after torch).
  ring::spec::JobSpec spec = bench_spec(o.seq_len);
  HostBatch b = make_batch(o.seq_len);
  ring::model::LocalAttention attention(backend.get());
  ring::train::Trainer trainer(spec, backend.get(), &attention, 100);
  write_torch_dir(dir, trainer.model(), b);  // torch starts from the same weights
  std::printf("model: 2 layers, d_model 256, heads 4/2 (head_dim 64), swiglu 704, vocab 256, %lld "
              "parameters; %lld tokens, %d documents; %d threads\n",
              static_cast<long long>(trainer.model().layout().num_params()),
              static_cast<long long>(o.seq_len), b.docs.back() + 1, o.threads);
  std::vector<double> ours;
  double first_loss = 0;
  auto time_ours = [&](int reps) {
    for (int r = 0; r < reps; ++r) {
      StepStats s = trainer.train_step(b.batch(), b.valid);
      if (trainer.step() == 1) first_loss = s.loss;
      else ours.push_back(s.step_ms / 1000.0);  // step 1 touches fresh memory: not timed
      std::printf("  ours step %lld: %.3f s (loss %.5f)\n", static_cast<long long>(s.step),
                  s.step_ms / 1000, s.loss);
      std::fflush(stdout);
    }
  };
  time_ours(1 + (o.reps + 1) / 2);
  double torch_s = NAN;
  double torch_loss = NAN;
  if (o.torch) {
    std::string cmd = "/usr/bin/python3 " RING_SOURCE_DIR "/bench/torch_train_step.py " +
                      dir.string() + " " + std::to_string(o.threads) + " " +
                      std::to_string(o.reps) + " 2>&1";
    std::string line = run_capture(cmd);
    std::printf("  %s", line.c_str());
    torch_s = field(line, "median_s");
    torch_loss = field(line, "loss");
  }
  time_ours(o.reps / 2);
  const double ours_s = median(ours);
  std::printf("\nthroughput at %lld tokens: ours %.0f tokens/s (median step %.3f s), torch %.0f "
              "tokens/s (median step %.3f s): ratio %.2fx\n",
              static_cast<long long>(o.seq_len), o.seq_len / ours_s, ours_s, o.seq_len / torch_s,
              torch_s, torch_s / ours_s);
  std::printf("first-step loss: ours %.6f (torch reports its last step's loss %.6f)\n",
              first_loss, torch_loss);

  // ---- peak memory per sequence length, each in a fresh process.
  std::printf("\n| seq_len | ours VmHWM (MiB) | torch VmHWM (MiB) |\n|---|---|---|\n");
  for (int64_t t : o.mem_seq_lens) {
    std::string line = run_capture(self + " --threads " + std::to_string(o.threads) +
                                   " --child-mem " + std::to_string(t));
    double ours_kb = field(line, "vmhwm_kb");
    double torch_kb = NAN;
    if (o.torch && t <= o.torch_max_seq) {
      ring::spec::JobSpec s2 = bench_spec(t);
      HostBatch b2 = make_batch(t);
      ring::model::LocalAttention a2(backend.get());
      ring::model::Model m2(ring::model::ModelConfig::from_spec(s2), backend.get(), &a2);
      m2.init_params(1);
      fs::path d2 = dir / ("mem" + std::to_string(t));
      write_torch_dir(d2, m2, b2);
      std::string tl = run_capture("/usr/bin/python3 " RING_SOURCE_DIR
                                   "/bench/torch_train_step.py " + d2.string() + " " +
                                   std::to_string(o.threads) + " 0 2>&1");
      torch_kb = field(tl, "vmhwm_kb");
    }
    char torch_cell[64];
    if (std::isnan(torch_kb)) std::snprintf(torch_cell, sizeof(torch_cell), "not run");
    else std::snprintf(torch_cell, sizeof(torch_cell), "%.0f", torch_kb / 1024);
    std::printf("| %lld | %.0f | %s |\n", static_cast<long long>(t), ours_kb / 1024, torch_cell);
    std::fflush(stdout);
  }
  fs::remove_all(dir);
  return 0;
}
