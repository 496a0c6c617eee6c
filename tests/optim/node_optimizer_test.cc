// ring_optim (daemon/optim): the offloaded optimizer reproduces the in-worker Trainer's update
// bit for bit, top-k with error feedback keeps residual + sent == accumulated, warm-up steps are
// dense, lazy mode touches only the selected coordinates (with the dense kernel's bits), several
// nodes in threads end with bit-identical master weights (and equal to one node fed the summed
// gradient), checkpoint state restores exactly, torch.optim.AdamW agrees within stated
// tolerances, and bad calls fail with clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/spec/parse.h"
#include "daemon/optim/node_optimizer.h"
#include "kernels/backend.h"
#include "tests/common/run.h"
#include "worker/model/attention.h"
#include "worker/train/trainer.h"

namespace ring::optim {
namespace {

spec::JobSpec load(const std::string& optimizer, double grad_clip) {
  const std::string yaml = R"(
job: {name: optim-test}
model: {layers: 2, d_model: 64, heads: 4, kv_heads: 2, mlp: swiglu, vocab: 256}
data: {source: passkey, seq_len: 128, passkey_digits: 5, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, schedule: cosine, lr_warmup_steps: 2, weight_decay: 0.1,
            )" + optimizer + R"(}
train: {steps: 20, grad_clip: )" + std::to_string(grad_clip) + R"(, seed: 1, log_every: 10}
resources: {nodes: 1, workers_per_node: 1, backend: cpu, host_memory_gb: 4}
)";
  spec::LoadResult r = spec::load_spec_string(yaml, "optim_test.yaml");
  for (const auto& d : r.diagnostics) ADD_FAILURE() << d.str();
  if (!r.ok()) throw std::runtime_error("invalid test spec");
  return *r.spec;
}

const char* kDense = "offload: cpu, compression: none";
const char* kTopkDense = "offload: cpu, compression: topk, density: 0.01, warmup_steps: 0";
const char* kTopkLazy =
    "offload: cpu, compression: topk, density: 0.01, warmup_steps: 0, update: lazy";

contract::ParamLayout layout_of(const spec::JobSpec& s) {
  return contract::ParamLayout(contract::ModelConfig::from_spec(s));
}

// Gradient-like values (zero in the alignment gaps), different per seed, scales spanning 1e-4..1.
std::vector<float> make_grad(const contract::ParamLayout& layout, uint64_t seed) {
  std::vector<float> g(layout.total(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const contract::ParamView& v : layout.views()) {
    const float scale = std::pow(10.f, -static_cast<float>(rng() % 4)) * 0.01f;
    for (int64_t i = 0; i < v.size; ++i) g[v.offset + i] = nd(rng) * scale;
  }
  return g;
}

std::vector<float> make_params(const contract::ParamLayout& layout, uint64_t seed) {
  std::vector<float> p = make_grad(layout, seed);
  for (float& x : p) x *= 10.f;
  return p;
}

StepResult run_step(NodeOptimizer& opt, int64_t step, std::vector<float> grad) {
  opt.begin_step(step);
  for (const contract::GradBucket& b : opt.layout().buckets()) {
    opt.bucket_ready(b.index, grad.data() + b.begin);
  }
  return opt.finish_step();
}

std::vector<float> copy_of(const float* p, int64_t n) {
  return std::vector<float>(p, p + n);
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * n) == 0;
}

// ---- equality with the in-worker optimizer --------------------------------------------------
// The Trainer steps on random sequences; its reduced gradient is captured through the
// grad-reduce hook and handed to a NodeOptimizer that started from the same weights.
void expect_matches_trainer(double grad_clip, int steps) {
  spec::JobSpec spec = load(kDense, grad_clip);
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(backend) << err;
  model::LocalAttention attention(backend.get());
  train::Trainer trainer(spec, backend.get(), &attention, spec.train.steps);
  const int64_t n = trainer.model().layout().total();
  std::vector<float> captured(n);
  trainer.set_grad_reduce([&](float* g, int64_t count, model::LossResult*) {
    std::memcpy(captured.data(), g, sizeof(float) * count);
  });
  LocalExchange one;
  NodeOptimizer opt(spec, trainer.model().layout(), spec.train.steps, 2, &one);
  opt.init_master(trainer.model().params());

  std::mt19937 rng(5);
  const int64_t t = spec.data.seq_len;
  std::vector<int32_t> ids(t), labels(t);
  std::vector<int64_t> pos(t);
  int clipped = 0;
  for (int s = 1; s <= steps; ++s) {
    for (int64_t i = 0; i < t; ++i) {
      ids[i] = static_cast<int32_t>(rng() % 256);
      pos[i] = i;
    }
    for (int64_t i = 0; i < t; ++i) labels[i] = i + 1 < t ? ids[i + 1] : -1;
    model::Batch batch{t, ids.data(), labels.data(), pos.data(), nullptr};
    train::StepStats st = trainer.train_step(batch, t - 1);
    StepResult r = run_step(opt, s, captured);
    clipped += r.clipped;
    EXPECT_EQ(r.step, st.step);
    EXPECT_DOUBLE_EQ(r.lr, st.lr);
    EXPECT_NEAR(r.grad_norm, st.grad_norm, 1e-12 * st.grad_norm) << "step " << s;
    EXPECT_TRUE(r.all_changed);
    EXPECT_FALSE(r.compressed);
    EXPECT_EQ(r.bytes_sent, 4 * n);
    ASSERT_TRUE(same_bits(opt.master(), trainer.model().params(), n))
        << "master weights differ from the Trainer's after step " << s;
  }
  if (grad_clip > 0) {
    EXPECT_EQ(clipped, steps) << "the test meant to exercise clipping";
  }
}

TEST(OptimDense, MatchesTrainerBitwiseWithoutClipping) {
  // grad_clip 0: every bucket is updated on the pipeline thread as it arrives.
  expect_matches_trainer(0.0, 4);
}

TEST(OptimDense, MatchesTrainerBitwiseWithClipping) {
  // grad_clip far below the norm: clipped every step, the update runs in finish_step.
  expect_matches_trainer(0.01, 4);
}

// ---- top-k and error feedback ---------------------------------------------------------------
TEST(OptimTopk, ErrorFeedbackResidualPlusSentEqualsAccumulated) {
  spec::JobSpec spec = load(kTopkLazy, 0.0);
  contract::ParamLayout layout = layout_of(spec);
  const int64_t n = layout.total();
  LocalExchange one;
  NodeOptimizer opt(spec, layout, 20, 2, &one);
  opt.init_master(make_params(layout, 1).data());
  std::vector<float> residual(n, 0.f);
  for (int s = 1; s <= 5; ++s) {
    std::vector<float> g = make_grad(layout, 100 + s);
    std::vector<float> acc(n);
    for (int64_t i = 0; i < n; ++i) acc[i] = residual[i] + g[i];
    StepResult r = run_step(opt, s, g);
    ASSERT_TRUE(r.compressed);
    ASSERT_FALSE(r.all_changed);
    const std::vector<int64_t>& sent = opt.changed();
    ASSERT_TRUE(std::is_sorted(sent.begin(), sent.end()));
    const float* res = opt.state_buffer("residual").data;
    ASSERT_NE(res, nullptr);
    std::vector<char> is_sent(n, 0);
    for (int64_t i : sent) is_sent[i] = 1;
    int64_t expected_sent = 0;
    for (const contract::GradBucket& b : layout.buckets()) {
      const int64_t size = b.end - b.begin;
      const int64_t k = static_cast<int64_t>(std::ceil(0.01 * size));
      int64_t got = 0;
      float min_sent = INFINITY, max_kept = 0;
      for (int64_t i = b.begin; i < b.end; ++i) {
        if (is_sent[i]) {
          ++got;
          min_sent = std::min(min_sent, std::fabs(acc[i]));
          EXPECT_EQ(res[i], 0.f) << "sent coordinate " << i << " left in the residual";
        } else {
          max_kept = std::max(max_kept, std::fabs(acc[i]));
          // residual + sent == accumulated, exactly.
          ASSERT_EQ(res[i], acc[i]) << "coordinate " << i << " step " << s;
        }
      }
      EXPECT_EQ(got, k) << "bucket " << b.name;
      EXPECT_GE(min_sent, max_kept) << "bucket " << b.name << ": a larger |acc| was kept";
      expected_sent += k;
    }
    EXPECT_EQ(r.selected, expected_sent);
    EXPECT_EQ(r.changed_count, expected_sent);
    EXPECT_EQ(r.bytes_sent,
              8 * expected_sent + 4 * static_cast<int64_t>(layout.buckets().size()));
    residual.assign(res, res + n);
  }
}

TEST(OptimTopk, WarmupStepsAreDenseThenCompressed) {
  spec::JobSpec spec = load(
      "offload: cpu, compression: topk, density: 0.001, warmup_steps: 2, update: lazy", 1.0);
  contract::ParamLayout layout = layout_of(spec);
  const int64_t n = layout.total();
  LocalExchange one;
  NodeOptimizer opt(spec, layout, 20, 2, &one);
  opt.init_master(make_params(layout, 2).data());
  for (int s = 1; s <= 4; ++s) {
    StepResult r = run_step(opt, s, make_grad(layout, 200 + s));
    const float* res = opt.state_buffer("residual").data;
    if (s <= 2) {
      EXPECT_FALSE(r.compressed) << "step " << s;
      EXPECT_TRUE(r.all_changed);
      EXPECT_EQ(r.bytes_sent, 4 * n);
      EXPECT_TRUE(opt.changed().empty());
      EXPECT_TRUE(std::all_of(res, res + n, [](float x) { return x == 0.f; }))
          << "warm-up must not build a residual";
    } else {
      EXPECT_TRUE(r.compressed) << "step " << s;
      EXPECT_FALSE(r.all_changed);
      EXPECT_GT(r.bytes_dense, 100 * r.bytes_sent)
          << "density 0.001 should send > 100x fewer bytes: " << r.bytes_sent << " of "
          << r.bytes_dense;
      std::printf("step %d: %lld bytes sent vs %lld dense (%.0fx)\n", s,
                  static_cast<long long>(r.bytes_sent), static_cast<long long>(r.bytes_dense),
                  static_cast<double>(r.bytes_dense) / r.bytes_sent);
    }
  }
}

// Lazy mode: unselected coordinates (master, m, v) keep their bits; selected ones get exactly
// what the dense kernel computes for that coordinate with the (clipped) sparse gradient.
void expect_lazy_exact(double grad_clip) {
  spec::JobSpec spec = load(kTopkLazy, grad_clip);
  contract::ParamLayout layout = layout_of(spec);
  const int64_t n = layout.total();
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(backend) << err;
  LocalExchange one;
  NodeOptimizer opt(spec, layout, 20, 2, &one);
  opt.init_master(make_params(layout, 3).data());
  std::vector<char> decay(n, 1);
  for (const contract::ParamView& v : layout.views()) {
    std::fill(decay.begin() + v.offset, decay.begin() + v.offset + v.size, v.decay ? 1 : 0);
  }
  std::vector<float> residual(n, 0.f);
  for (int s = 1; s <= 4; ++s) {
    const float* st[4] = {opt.state_buffer("master").data, opt.state_buffer("adam_m").data,
                          opt.state_buffer("adam_v").data, opt.state_buffer("residual").data};
    std::vector<float> p0 = copy_of(st[0], n), m0 = copy_of(st[1], n), v0 = copy_of(st[2], n);
    std::vector<float> g = make_grad(layout, 300 + s);
    std::vector<float> acc(n);
    for (int64_t i = 0; i < n; ++i) acc[i] = residual[i] + g[i];
    StepResult r = run_step(opt, s, g);
    residual = copy_of(st[3], n);
    std::vector<char> sel(n, 0);
    double ss = 0;
    for (int64_t i : opt.changed()) {
      sel[i] = 1;
      ss += static_cast<double>(acc[i]) * acc[i];
    }
    EXPECT_NEAR(r.grad_norm, std::sqrt(ss), 1e-9 * std::sqrt(ss));
    const float scale =
        r.clipped ? static_cast<float>(grad_clip / (r.grad_norm + 1e-6)) : 1.f;
    if (grad_clip > 0) {
      EXPECT_TRUE(r.clipped);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!sel[i]) {
        ASSERT_TRUE(st[0][i] == p0[i] && st[1][i] == m0[i] && st[2][i] == v0[i])
            << "unselected coordinate " << i << " changed at step " << s;
        continue;
      }
      float p = p0[i], m = m0[i], v = v0[i], gi = acc[i];
      if (r.clipped) gi *= scale;
      kernels::Backend::AdamWParams hp{static_cast<float>(r.lr), 0.9f, 0.95f, 1e-8f,
                                       decay[i] ? 0.1f : 0.f, s};
      ASSERT_EQ(backend->adamw_step(1, hp, &p, &gi, &m, &v), kernels::Status::kOk);
      ASSERT_TRUE(st[0][i] == p && st[1][i] == m && st[2][i] == v)
          << "coordinate " << i << " step " << s << ": " << st[0][i] << " vs " << p;
    }
  }
}

TEST(OptimLazy, TouchesOnlySelectedCoordinatesWithDenseKernelBits) {
  expect_lazy_exact(0.0);
}

TEST(OptimLazy, ClippedSparseGradient) {
  expect_lazy_exact(1e-4);
}

// ---- several nodes --------------------------------------------------------------------------
// N NodeOptimizers in threads over an InProcessExchange, each with its own gradients: master
// weights (and moments) are bit-identical on every node after every step.
std::vector<std::vector<float>> run_nodes(const spec::JobSpec& spec, int nodes, int steps,
                                          std::vector<StepResult>* node0_results) {
  contract::ParamLayout layout = layout_of(spec);
  InProcessExchange ex(nodes, 30.0);
  std::vector<std::unique_ptr<NodeOptimizer>> opts;
  const std::vector<float> init = make_params(layout, 4);
  for (int i = 0; i < nodes; ++i) {
    opts.push_back(std::make_unique<NodeOptimizer>(spec, layout, 20, 1, ex.endpoint(i)));
    opts.back()->init_master(init.data());
  }
  std::vector<std::vector<std::vector<float>>> states(nodes);
  std::vector<std::string> errors(nodes);
  std::vector<std::thread> threads;
  for (int i = 0; i < nodes; ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int s = 1; s <= steps; ++s) {
          StepResult r = run_step(*opts[i], s, make_grad(layout, 1000 * s + i));
          if (i == 0 && node0_results) node0_results->push_back(r);
          std::vector<float> snap;
          for (const char* kind : {"master", "adam_m", "adam_v"}) {
            const NodeOptimizer::StateBuffer b = opts[i]->state_buffer(kind);
            snap.insert(snap.end(), b.data, b.data + (b.end - b.begin));
          }
          states[i].push_back(std::move(snap));
        }
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < nodes; ++i) EXPECT_EQ(errors[i], "") << "node " << i;
  for (int i = 1; i < nodes; ++i) {
    for (int s = 0; s < steps && s < static_cast<int>(states[i].size()); ++s) {
      EXPECT_TRUE(states[0][s].size() == states[i][s].size() &&
                  same_bits(states[0][s].data(), states[i][s].data(),
                            static_cast<int64_t>(states[0][s].size())))
          << "node " << i << " differs from node 0 after step " << s + 1;
    }
  }
  return states[0];
}

TEST(OptimMultiNode, DenseBitIdenticalAndEqualToSummedGradient) {
  spec::JobSpec spec = load(kDense, 0.05);
  const int nodes = 3, steps = 3;
  std::vector<std::vector<float>> multi = run_nodes(spec, nodes, steps, nullptr);
  // One node fed the gradient summed in node order gives the same bits.
  contract::ParamLayout layout = layout_of(spec);
  LocalExchange one;
  NodeOptimizer opt(spec, layout, 20, 1, &one);
  opt.init_master(make_params(layout, 4).data());
  for (int s = 1; s <= steps; ++s) {
    std::vector<float> sum = make_grad(layout, 1000 * s);
    for (int i = 1; i < nodes; ++i) {
      std::vector<float> g = make_grad(layout, 1000 * s + i);
      for (size_t q = 0; q < sum.size(); ++q) sum[q] += g[q];
    }
    run_step(opt, s, sum);
  }
  EXPECT_TRUE(same_bits(opt.master(), multi.back().data(), layout.total()));
}

// Top-k at the owner (the default) and at the sender: every node ends each step with the same
// bits.
TEST(OptimMultiNode, TopkDenseUpdateBitIdentical) {
  for (const std::string at : {"", ", compress_at: sender"}) {
    SCOPED_TRACE(at);
    std::vector<StepResult> r0;
    run_nodes(load(kTopkDense + at, 0.05), 3, 3, &r0);
    ASSERT_EQ(r0.size(), 3u);
    EXPECT_TRUE(r0.back().compressed);
    EXPECT_TRUE(r0.back().all_changed);
  }
}

TEST(OptimMultiNode, TopkLazyBitIdentical) {
  for (const std::string at : {"", ", compress_at: sender"}) {
    SCOPED_TRACE(at);
    std::vector<StepResult> r0;
    run_nodes(load(kTopkLazy + at, 0.05), 4, 3, &r0);
    ASSERT_EQ(r0.size(), 3u);
    EXPECT_FALSE(r0.back().all_changed);
    EXPECT_GT(r0.back().changed_count, 0);
  }
}

// ---- checkpoints ----------------------------------------------------------------------------
TEST(OptimState, RestoreContinuesBitIdentically) {
  spec::JobSpec spec = load(kTopkLazy, 0.05);
  contract::ParamLayout layout = layout_of(spec);
  LocalExchange one;
  NodeOptimizer a(spec, layout, 20, 1, &one);
  a.init_master(make_params(layout, 5).data());
  for (int s = 1; s <= 3; ++s) run_step(a, s, make_grad(layout, 500 + s));
  std::vector<std::vector<float>> saved;
  std::vector<std::string> names;
  for (const StateTensor& t : a.state_tensors()) {
    saved.push_back(copy_of(t.data, t.size));
    names.push_back(t.name);
  }
  EXPECT_EQ(names.size(), 4 * layout.views().size());
  EXPECT_EQ(names.front(), "master/" + layout.views().front().name);
  EXPECT_EQ(names.back(), "residual/" + layout.views().back().name);
  for (int s = 4; s <= 5; ++s) run_step(a, s, make_grad(layout, 500 + s));

  NodeOptimizer b(spec, layout, 20, 2, &one);
  std::vector<StateTensor> st = b.state_tensors();
  for (size_t i = 0; i < st.size(); ++i) {
    std::memcpy(st[i].data, saved[i].data(), sizeof(float) * st[i].size);
  }
  b.restore_step(3);
  EXPECT_EQ(b.step(), 3);
  EXPECT_THROW(b.begin_step(3), OptimError);
  for (int s = 4; s <= 5; ++s) run_step(b, s, make_grad(layout, 500 + s));
  std::vector<StateTensor> sa = a.state_tensors(), sb = b.state_tensors();
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(same_bits(sa[i].data, sb[i].data, sa[i].size)) << sa[i].name;
  }
}

// ---- PyTorch reference ----------------------------------------------------------------------
// torch.optim.AdamW (two groups: decay / no decay) with clip_grad_norm_, 6 steps at a constant
// lr. Tolerance: |ours - torch| <= 1e-6 + 1e-5 |torch| per coordinate (fp32 rounding of the
// moments and of the step over 6 steps; torch computes the update in a different order).
TEST(OptimTorch, MatchesTorchAdamW) {
  spec::JobSpec spec = load(kDense, 0.5);
  spec.optimizer.schedule = spec::LrSchedule::kConstant;
  spec.optimizer.lr_warmup_steps = 0;
  contract::ParamLayout layout = layout_of(spec);
  const int64_t n = layout.total();
  const int steps = 6;
  char tmpl[] = "/tmp/ring_optim_torch_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir(tmpl);
  std::vector<float> p0 = make_params(layout, 6);
  std::vector<uint8_t> decay(n, 1);
  for (const contract::ParamView& v : layout.views()) {
    std::fill(decay.begin() + v.offset, decay.begin() + v.offset + v.size, v.decay ? 1 : 0);
  }
  std::vector<std::vector<float>> grads;
  {
    std::ofstream meta(dir / "meta.txt");
    meta.precision(17);
    const spec::OptimizerSection& o = spec.optimizer;
    meta << n << " " << steps << " " << o.lr << " " << static_cast<float>(o.beta1) << " "
         << static_cast<float>(o.beta2) << " " << static_cast<float>(o.eps) << " "
         << static_cast<float>(o.weight_decay) << " " << spec.train.grad_clip << "\n";
    std::ofstream(dir / "decay.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(decay.data()), n);
    std::ofstream(dir / "params.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(p0.data()), 4 * n);
    std::ofstream gf(dir / "grads.bin", std::ios::binary);
    for (int s = 1; s <= steps; ++s) {
      grads.push_back(make_grad(layout, 600 + s));
      if (s % 2 == 0) {  // every other step under the clip threshold
        for (float& x : grads.back()) x *= 1e-3f;
      }
      gf.write(reinterpret_cast<const char*>(grads.back().data()), 4 * n);
    }
  }
  const test::RunResult rr = test::run("/usr/bin/python3 " + test::source_path("tests/optim/torch_adamw_ref.py") +
                                       " " + dir.string());
  if (rr.output.find("No module named 'torch'") != std::string::npos) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  }
  ASSERT_EQ(rr.exit_code, 0) << rr.output;
  std::vector<float> ref(n);
  std::ifstream(dir / "out.bin", std::ios::binary).read(reinterpret_cast<char*>(ref.data()), 4 * n);
  std::filesystem::remove_all(dir);

  LocalExchange one;
  NodeOptimizer opt(spec, layout, 20, 2, &one);
  opt.init_master(p0.data());
  int clipped = 0;
  for (int s = 1; s <= steps; ++s) clipped += run_step(opt, s, grads[s - 1]).clipped;
  EXPECT_EQ(clipped, steps / 2);
  double worst = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(opt.master()[i]) - ref[i]);
    const double tol = 1e-6 + 1e-5 * std::fabs(ref[i]);
    worst = std::max(worst, d / tol);
    bad += d > tol;
  }
  std::printf("vs torch.optim.AdamW: worst |diff| / tolerance = %.3f over %lld values\n", worst,
              static_cast<long long>(n));
  EXPECT_EQ(bad, 0);
}

// ---- errors ---------------------------------------------------------------------------------
class FailingExchange : public Exchange {
 public:
  int node() const override { return 0; }
  int nodes() const override { return 2; }
  void allreduce_sum(float*, int64_t) override { throw std::runtime_error("peer 1 died"); }
  void allreduce_sum(double*, int64_t) override { throw std::runtime_error("peer 1 died"); }
  std::vector<std::vector<uint8_t>> allgather(const void*, int64_t) override {
    throw std::runtime_error("peer 1 died");
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const OptimError& e) {
    return e.what();
  }
  return "(no OptimError)";
}

TEST(OptimErrors, ClearMessagesForBadCalls) {
  spec::JobSpec spec = load(kDense, 1.0);
  contract::ParamLayout layout = layout_of(spec);
  LocalExchange one;
  EXPECT_NE(error_of([&] { NodeOptimizer(spec, layout, 0, 1, &one); }).find("total_steps"),
            std::string::npos);
  EXPECT_NE(error_of([&] { NodeOptimizer(spec, layout, 5, 1, nullptr); }).find("exchange"),
            std::string::npos);
  spec::JobSpec lazy_dense = spec;
  lazy_dense.optimizer.update = spec::UpdateMode::kLazy;
  EXPECT_NE(error_of([&] { NodeOptimizer(lazy_dense, layout, 5, 1, &one); }).find("lazy"),
            std::string::npos);
  spec::JobSpec sender_full = load(kTopkDense, 0.05);
  sender_full.optimizer.compress_at = spec::CompressAt::kSender;
  sender_full.parallel.shard = spec::ShardMode::kFull;
  EXPECT_NE(error_of([&] { NodeOptimizer(sender_full, layout, 5, 1, &one); })
                .find("optimizer.compress_at: sender cannot be used with parallel.shard: full"),
            std::string::npos);

  NodeOptimizer opt(spec, layout, 5, 1, &one);
  opt.init_master(make_params(layout, 7).data());
  std::vector<float> g = make_grad(layout, 8);
  EXPECT_NE(error_of([&] { opt.begin_step(2); }).find("the next step is 1"), std::string::npos);
  EXPECT_NE(error_of([&] { opt.bucket_ready(0, g.data()); }).find("begin_step"),
            std::string::npos);
  opt.begin_step(1);
  EXPECT_NE(error_of([&] { opt.bucket_ready(1, g.data()); }).find("expected bucket 0"),
            std::string::npos);
  opt.bucket_ready(0, g.data());
  EXPECT_NE(error_of([&] { opt.finish_step(); }).find("bucket_ready missing"), std::string::npos);
  for (size_t b = 1; b < layout.buckets().size(); ++b) {
    opt.bucket_ready(static_cast<int>(b), g.data() + layout.buckets()[b].begin);
  }
  EXPECT_NO_THROW(opt.finish_step());
  EXPECT_EQ(opt.step(), 1);

  FailingExchange failing;
  NodeOptimizer f(spec, layout, 5, 1, &failing);
  f.init_master(make_params(layout, 7).data());
  const std::string msg = error_of([&] { run_step(f, 1, make_grad(layout, 9)); });
  EXPECT_NE(msg.find("peer 1 died"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step 1"), std::string::npos) << msg;
}

TEST(OptimErrors, InProcessExchangeTimesOutNamingTheMissingNode) {
  InProcessExchange ex(3, 2.0);  // (node 1's thread must have arrived before node 0 times out)
  float x = 1.f;
  std::string e0, e1;
  std::thread t([&] { e1 = error_of([&] { ex.endpoint(1)->allreduce_sum(&x, 1); }); });
  float y = 2.f;
  e0 = error_of([&] { ex.endpoint(0)->allreduce_sum(&y, 1); });
  t.join();
  EXPECT_NE(e0.find("node(s) 2"), std::string::npos) << e0;
  EXPECT_NE(e1.find("InProcessExchange"), std::string::npos) << e1;
  EXPECT_NE(error_of([&] { ex.endpoint(3); }).find("out of range"), std::string::npos);
}

}  // namespace
}  // namespace ring::optim
