// parallel.shard full on a device backend: the block store stages every block through CUDA
// memory (worker/ring/full_shard.h). One rank, the CUDA model with staged blocks against the CPU
// model's flat buffers: loss within 1e-5 relative and gradients within the CUDA model test's
// tolerance (tests/gpu/cuda_backend_test.cc CudaModel.LossAndGradientsMatchCpu); the CUDA model
// with staged blocks against its own flat buffers: the same arithmetic, so within 1e-6 normwise
// (micro-batches add in another order).
// Without a GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/worker/full_shard_stage.h"

namespace ring::test {
namespace {

struct Backends {
  std::unique_ptr<kernels::Backend> gpu, cpu;
  std::string why;
};

Backends& backends() {
  static Backends b = [] {
    Backends r;
    std::string err;
    r.gpu = kernels::create_backend("cuda", 0, &err);
    if (!r.gpu) r.why = err;
    r.cpu = kernels::create_backend("cpu", 2, &err);
    return r;
  }();
  return b;
}

// Largest |a - b| / (atol + rtol |b|) over the vectors.
double worst(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::abs(static_cast<double>(a[i]) - b[i]) / (atol + rtol * std::abs(b[i])));
  return w;
}

// ||a - b|| / ||b||.
double normwise(const std::vector<float>& a, const std::vector<float>& b) {
  double d2 = 0, n2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    d2 += d * d;
    n2 += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d2 / n2);
}

TEST(FullShardGpu, StagedBlocksMatchTheFlatModels) {
  if (!backends().gpu) GTEST_SKIP() << "no CUDA backend: " << backends().why;
  kernels::Backend* gpu = backends().gpu.get();
  kernels::Backend* cpu = backends().cpu.get();
  for (bool tied : {false, true}) {
    for (int micro : {1, 2}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + ", micro-batches " +
                   std::to_string(micro));
      const model::ModelConfig cfg = stage_model(tied, micro == 2);
      std::vector<float> params;
      {
        model::LocalAttention attention(cpu);
        model::Model m(cfg, cpu, &attention);
        params = m.initial_params(13);
      }
      std::vector<StageTokens> batches;
      for (int i = 0; i < micro; ++i) batches.push_back(stage_tokens(256, cfg.vocab, 21 + i));
      const StageRun ref = run_flat(cfg, cpu, params, batches);
      const StageRun flat = run_flat(cfg, gpu, params, batches);
      const StageRun staged = run_store(cfg, gpu, gpu, params, batches);
      EXPECT_NEAR(staged.loss, ref.loss, 1e-5 * std::abs(ref.loss));
      EXPECT_LE(worst(staged.grads, ref.grads, 1e-4, 1e-3), 1.0);
      EXPECT_NEAR(staged.loss, flat.loss, 1e-6 * std::abs(flat.loss));
      EXPECT_LE(normwise(staged.grads, flat.grads), 1e-6);
    }
  }
}

}  // namespace
}  // namespace ring::test
