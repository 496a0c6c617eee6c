// One rank of parallel.shard full's block store over a real transport, for
// full_shard_ranks_test.cc:
//   full_shard_helper RANK WORLD WORKERS_PER_NODE DIR DTYPE GATHER
// The test model (tests/ring/ring_test_util.h ring_spec, model.dtype DTYPE: fp32 or bf16) with
// the same initial weights on every rank, one forward_backward of its own packed tokens (a data
// replica: local attention), its blocks from a FullShardStore over all WORLD ranks whose weight
// gathers carry GATHER (fp32 or bf16). Writes DIR/result-RANK (double loss_sum, int64 valid, then
// every bucket's delivered part: int64 begin, int64 end, float grad[end - begin]) and
// DIR/stats-RANK (gathers scatters gather_bytes_sent scatter_bytes_sent, one line).
// Exit: 0 ok, 2 usage, 3 errors (message on stderr).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/contract/shard.h"
#include "kernels/backend.h"
#include "tests/worker/full_shard_stage.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"
#include "worker/ring/full_shard.h"
#include "worker/ring/ring_rank.h"

using namespace ring;

namespace {

int run(int argc, char** argv) {
  const int rank = std::atoi(argv[1]), world = std::atoi(argv[2]), per_node = std::atoi(argv[3]);
  const std::string dir = argv[4];
  const bool bf16 = std::string(argv[5]) == "bf16";
  const kernels::DType gather =
      std::string(argv[6]) == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32;
  const spec::JobSpec spec = test::shard_ranks_spec(world, per_node, bf16);
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  if (!backend) throw std::runtime_error(err);
  const model::ModelConfig cfg = model::ModelConfig::from_spec(spec);
  std::vector<float> params;
  {
    model::LocalAttention attention(backend.get());
    model::Model m(cfg, backend.get(), &attention);
    params = m.initial_params(11);
  }
  cp::RankOptions ro;
  ro.rank = rank;
  ro.world = world;
  ro.rendezvous = dir;
  ro.bootstrap_timeout_ms = 30000;
  ro.op_timeout_ms = 30000;
  cp::RingRank rr(spec, ro);
  const contract::ParamLayout layout(cfg);
  // Declared out here: a transport error exits at once (transfers may be in flight into them).
  std::optional<cp::FullShardStore> store;
  std::optional<model::LocalAttention> attention;
  std::optional<model::Model> m;
  return cp::run_then_exit_on_error("full_shard_helper", 3, [&]() -> int {
    store.emplace(layout, contract::worker_shards(layout, world / per_node, per_node), rank,
                  per_node, &rr.world_progress(), 30000, nullptr, gather);
    attention.emplace(backend.get());
    m.emplace(cfg, backend.get(), &*attention, &*store);
    const test::StageTokens tokens = test::stage_tokens(150, cfg.vocab, 5 + rank);
    const int64_t global_valid = rr.global_count(tokens.valid);
    store->set_shard_weights(params.data() + store->shard().begin);
    std::ofstream out(dir + "/result-" + std::to_string(rank), std::ios::binary);
    std::vector<char> parts;
    store->begin_batch(true, true, [&](int, int64_t lo, int64_t hi, const float* g) {
      const char* p = reinterpret_cast<const char*>(&lo);
      parts.insert(parts.end(), p, p + 8);
      p = reinterpret_cast<const char*>(&hi);
      parts.insert(parts.end(), p, p + 8);
      if (hi > lo) {
        p = reinterpret_cast<const char*>(g);
        parts.insert(parts.end(), p, p + (hi - lo) * sizeof(float));
      }
    });
    const model::LossResult r = m->forward_backward(tokens.batch(), global_valid);
    out.write(reinterpret_cast<const char*>(&r.loss_sum), sizeof(r.loss_sum));
    out.write(reinterpret_cast<const char*>(&global_valid), sizeof(global_valid));
    out.write(parts.data(), static_cast<std::streamsize>(parts.size()));
    const cp::ShardStats& st = store->stats();
    std::ofstream(dir + "/stats-" + std::to_string(rank))
        << st.gathers << ' ' << st.scatters << ' ' << st.gather_bytes_sent << ' '
        << st.scatter_bytes_sent << '\n';
    rr.shutdown();
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: full_shard_helper RANK WORLD WORKERS_PER_NODE DIR DTYPE GATHER\n");
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "full_shard_helper rank %s: %s\n", argv[1], e.what());
    return 3;
  }
}
