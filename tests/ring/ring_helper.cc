// One rank of a ring for ring_test.cc:
//   ring_helper MODE RANK WORLD DIR BALANCE SEQ_LEN MAX_DOC SEED STEPS [LAYERS [ORDER [DTYPE
//     [WIRE [HEAD_RANKS [DKV_WIRE]]]]]]
// MODE grads: one forward/backward of the test model on random_sequence(SEQ_LEN, MAX_DOC, SEED),
//   gradients and loss summed over the ring; writes DIR/result-RANK (double loss, int64 n,
//   float grads[n]) and DIR/stats-RANK (attention work of this rank).
// MODE train: STEPS optimizer steps (sequence seed SEED + step); writes DIR/result-RANK (one
//   loss per line, %.17g) and DIR/params-RANK (the final parameters, raw fp32).
// MODE kill: trains until killed; DIR/ready-RANK appears after 2 steps.
// Exit: 0 ok, 1 transport failure (message on stderr), 2 usage, 3 other errors.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "kernels/backend.h"
#include "tests/ring/ring_test_util.h"
#include "worker/data/split.h"
#include "worker/model/model.h"
#include "worker/ring/head_attention.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_rank.h"
#include "worker/train/trainer.h"

using namespace ring;

namespace {

int run(int argc, char** argv) {
  const std::string mode = argv[1];
  const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]);
  const std::string dir = argv[4], balance = argv[5];
  const int64_t seq_len = std::atoll(argv[6]), max_doc = std::atoll(argv[7]);
  const uint64_t seed = std::strtoull(argv[8], nullptr, 10);
  const int64_t steps = std::atoll(argv[9]);
  const int layers = argc > 10 ? std::atoi(argv[10]) : 2;
  const std::string order = argc > 11 ? argv[11] : "natural";
  // argv[12] bf16: model.dtype bf16 (docs/precision.md); WIRE: how K/V travel (fp32 or bf16).
  const bool wire_bf16 = argc > 13 && std::string(argv[13]) == "bf16";
  // argv[14]: parallel.head_ranks (two-level context parallelism, worker/ring/head_attention.h).
  const int head_ranks = argc > 14 ? std::atoi(argv[14]) : 1;
  // argv[15]: how dK/dV accumulators travel (fp32 or bf16).
  const bool dkv_bf16 = argc > 15 && std::string(argv[15]) == "bf16";
  spec::JobSpec spec = test::ring_spec(seq_len, world, balance, layers, order);
  spec.parallel.head_ranks = head_ranks;
  // argv[16]: model.recompute: none, full or selective (model.recompute_policy).
  const std::string recompute = argc > 16 ? argv[16] : "none";
  spec.model.recompute = recompute != "none";
  if (recompute == "selective") spec.model.recompute_policy = spec::RecomputePolicy::kSelective;
  if (argc > 12 && std::string(argv[12]) == "bf16") spec.model.dtype = spec::DType::kBf16;
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  if (!backend) throw std::runtime_error(err);

  cp::RankOptions ro;
  ro.rank = rank;
  ro.world = world;
  ro.rendezvous = dir;
  ro.bootstrap_timeout_ms = 30000;
  ro.op_timeout_ms = 30000;  // peer failures must be found by detection, not by this bound
  cp::RingRank rr(spec, ro);
  cp::RingAttention::Options ao;
  ao.timeout_ms = 30000;
  if (wire_bf16) ao.wire = kernels::DType::kBF16;
  if (dkv_bf16) ao.dkv_wire = kernels::DType::kBF16;
  const std::unique_ptr<cp::ContextAttention> attention_owner =
      cp::make_context_attention(backend.get(), &rr.progress(), rr.ring(), head_ranks, ao);
  cp::ContextAttention& attention = *attention_owner;
  const std::string out = dir + "/result-" + std::to_string(rank);
  // The models live out here: a transport error inside body exits at once (no unwinding), since
  // transfers may still be in flight into their buffers and into attention's.
  std::optional<model::Model> grads_model;
  std::optional<train::Trainer> trainer_storage;
  auto body = [&]() -> int {
    if (mode == "grads") {
      model::Model& m =
          grads_model.emplace(model::ModelConfig::from_spec(spec), backend.get(), &attention);
      m.init_params(static_cast<uint64_t>(spec.train.seed));
      data::Sequence seq = test::random_sequence(seq_len, max_doc, seed);
      data::SequenceShard shard =
          data::shard_sequence(seq, world, rank, spec.parallel.causal_balance);
      const int64_t local_valid = cp::valid_labels(shard);
      const int64_t global_valid = rr.global_count(local_valid);
      m.zero_grads();
      model::LossResult r = m.forward_backward(cp::shard_batch(shard), global_valid);
      rr.reduce(m.grads(), m.layout().total(), &r);
      std::vector<float> g = m.get_grads();
      const double loss = r.loss_sum / static_cast<double>(global_valid);
      const int64_t n = static_cast<int64_t>(g.size());
      std::ofstream f(out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(&loss), sizeof(loss));
      f.write(reinterpret_cast<const char*>(&n), sizeof(n));
      f.write(reinterpret_cast<const char*>(g.data()), n * sizeof(float));
      const kernels::AttentionStats k = attention.stats();
      const cp::RingStats& s = attention.ring_stats();
      std::ofstream(dir + "/stats-" + std::to_string(rank))
          << k.flops << " " << k.tiles_total << " " << k.tiles_skipped << " " << s.blocks_total
          << " " << s.blocks_skipped << " " << s.hops << " " << s.bytes_sent << "\n";
      rr.shutdown();
      return 0;
    }

    train::Trainer& trainer =
        trainer_storage.emplace(spec, backend.get(), &attention, steps > 0 ? steps : 1000000);
    trainer.set_grad_reduce(rr.grad_reducer());
    std::ofstream f(out);
    for (int64_t s = 1; mode == "kill" || s <= steps; ++s) {
      data::Sequence seq = test::random_sequence(seq_len, max_doc, seed + s);
      data::SequenceShard shard =
          data::shard_sequence(seq, world, rank, spec.parallel.causal_balance);
      const int64_t local_valid = cp::valid_labels(shard);
      train::StepStats st =
          trainer.train_step(cp::shard_batch(shard), rr.global_count(local_valid));
      char line[64];
      std::snprintf(line, sizeof(line), "%.17g\n", st.loss);
      f << line << std::flush;
      if (mode == "kill" && s == 2)
        std::ofstream(dir + "/ready-" + std::to_string(rank)) << "ready\n";
    }
    std::vector<float> p = trainer.weights();  // bf16: the fp32 master
    std::ofstream(dir + "/params-" + std::to_string(rank), std::ios::binary)
        .write(reinterpret_cast<const char*>(p.data()), p.size() * sizeof(float));
    rr.shutdown();
    return 0;
  };
  const std::string who = "ring_helper rank " + std::to_string(rank);
  try {
    return body();
  } catch (const transport::TransportError& e) {
    cp::exit_now(who, e.what(), 1);
  } catch (const std::exception& e) {
    cp::exit_now(who, e.what(), 3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 10) {
    std::fprintf(stderr,
                 "usage: %s grads|train|kill RANK WORLD DIR BALANCE SEQ_LEN MAX_DOC SEED STEPS "
                 "[LAYERS [ORDER [fp32|bf16 [WIRE fp32|bf16 [HEAD_RANKS [DKV_WIRE fp32|bf16]]]]]]\n",
                 argv[0]);
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const transport::TransportError& e) {
    std::fprintf(stderr, "ring_helper rank %s: %s\n", argv[2], e.what());
    std::fflush(stderr);
    _exit(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ring_helper rank %s: %s\n", argv[2], e.what());
    std::fflush(stderr);
    _exit(3);
  }
}
