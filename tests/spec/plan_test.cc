// ringctl plan: formulas checked against hand computation and published model sizes.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/contract/layout.h"
#include "common/cp/ring_messages.h"
#include "common/contract/shard.h"
#include "common/plan/plan.h"
#include "common/spec/parse.h"
#include "tests/common/run.h"

namespace ring::plan {
namespace {

// The planner sizes designs this build cannot run yet (bf16 on H100s): its limits as warnings,
// as `ringctl plan --what-if` loads them.
spec::JobSpec load(const std::string& text) {
  spec::LoadOptions o;
  o.runtime_limits_are_errors = false;
  auto r = spec::load_spec_string(text, "plan.yaml", o);
  EXPECT_TRUE(r.ok()) << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
  return r.ok() ? *r.spec : spec::JobSpec{};
}

std::string gpu_spec(int64_t seq_len, int64_t ranks, bool recompute, const std::string& extra) {
  return fmt::format(R"(job: {{name: p}}
model:
  layers: 32
  d_model: 4096
  heads: 32
  mlp_hidden: 11008
  vocab: 32000
  dtype: bf16
  tie_embeddings: false
  recompute: {}
data: {{source: passkey, seq_len: {}}}
parallel: {{context_ranks: {}}}
train: {{steps: 1}}
resources: {{backend: cuda, nodes: 1, workers_per_node: {}, gpus_per_node: {},
             gpu_type: H100-80G, host_memory_gb: 2000}}
{}
)",
                     recompute ? "true" : "false", seq_len, ranks, ranks, ranks, extra);
}

// The issue's hand computation: 1,000,000 tokens, d_model 4096, no GQA, 2 bytes per value:
// K + V per layer = 2 x 1e6 x 4096 x 2 = 16.384 GB.
TEST(Plan, KvPerLayerMatchesHandComputation) {
  auto s = load(gpu_spec(1000000, 8, true, ""));
  Plan p = make_plan(s);
  EXPECT_DOUBLE_EQ(p.kv_sequence_per_layer, 16.384e9);
  EXPECT_EQ(human_bytes(p.kv_sequence_per_layer), "16.384 GB");
  EXPECT_DOUBLE_EQ(p.kv_sequence_total, 32 * 16.384e9);
  EXPECT_DOUBLE_EQ(p.kv_local_per_layer, 16.384e9 / 8);
  EXPECT_EQ(p.tokens_per_rank, 125000);
}

// LLaMA-7B's published parameter count is 6,738,415,616.
TEST(Plan, ParameterCountMatchesLlama7B) {
  Plan p = make_plan(load(gpu_spec(1 << 20, 64, true, "")));
  EXPECT_EQ(p.params, 6738415616);
  EXPECT_EQ(p.params_embedding, 2 * 32000 * 4096);
  // One block: 4 d^2 attention + 3 d h MLP + 2 d norm gains.
  EXPECT_EQ(p.params_per_layer, 4LL * 4096 * 4096 + 3LL * 4096 * 11008 + 2 * 4096);
}

// Parameter counts read at any size: three significant digits, never "0.000 B".
TEST(Plan, HumanCount) {
  EXPECT_EQ(human_count(0), "0");
  EXPECT_EQ(human_count(812), "812");
  EXPECT_EQ(human_count(999.4), "999");
  EXPECT_EQ(human_count(999.6), "1.00 K");
  EXPECT_EQ(human_count(50213), "50.2 K");
  EXPECT_EQ(human_count(99960), "100 K");
  EXPECT_EQ(human_count(123456789), "123 M");
  EXPECT_EQ(human_count(999999), "1.00 M");
  EXPECT_EQ(human_count(6738415616), "6.74 B");
  EXPECT_EQ(human_count(270e9), "270 B");
  EXPECT_EQ(human_count(4.2e12), "4.20 T");
  Plan p = make_plan(load(gpu_spec(1 << 20, 64, true, "")));
  EXPECT_NE(to_text(p, load(gpu_spec(1 << 20, 64, true, ""))).find("model: 6.74 B params"),
            std::string::npos);
}

TEST(Plan, WorkerMemoryItemsAndRecompute) {
  Plan with = make_plan(load(gpu_spec(1 << 20, 64, true, "")));
  Plan without = make_plan(load(gpu_spec(1 << 20, 64, false, "")));
  double sum = 0;
  for (const auto& i : with.worker) sum += i.bytes;
  EXPECT_DOUBLE_EQ(sum, with.worker_total);
  EXPECT_DOUBLE_EQ(with.worker[0].bytes, 6738415616.0 * 2);  // bf16 weights
  EXPECT_DOUBLE_EQ(with.worker[1].bytes, 6738415616.0 * 4);  // fp32 gradients
  EXPECT_LT(with.activations_recompute, without.activations_no_recompute / 5);
  EXPECT_GT(without.worker_total, with.worker_total);
  EXPECT_DOUBLE_EQ(with.activations_no_recompute, without.activations_no_recompute);
}

// Memory per worker is linear in the tokens per rank: doubling seq_len at fixed ranks doubles
// every token-proportional item exactly (no L^2 term anywhere).
// bf16 activations as worker/model/model.h keeps them (docs/precision.md, docs/planning.md), by
// hand for the 7B spec (d 4096, 32 heads of 128, no GQA, h 11008, 32 layers, T = 2^20 / 64): the
// residual stream x, x_mid and the MLP's gate, up, product fp32; h1, h2, q, o, k, v bf16, plus
// one layer's fp32 work set of them; lse and two RMS statistics fp32. Recompute: every layer's
// input fp32 and one layer's whole set fp32. The bf16 GEMM operands: T x 2 (max(h, V, d) +
// max(h, d)).
TEST(Plan, Bf16ActivationsCountTheModelsStorage) {
  Plan p = make_plan(load(gpu_spec(1 << 20, 64, false, "")));
  const double T = (1 << 20) / 64.0, L = 32, d = 4096, qd = 4096, kvd = 4096, h = 11008;
  const double six = 2 * d + 2 * qd + 2 * kvd, fp32_rest = 2 * d + 3 * h, stats = 4 * 32 + 8;
  EXPECT_DOUBLE_EQ(p.activations_no_recompute,
                   L * T * (4 * fp32_rest + 2 * six + stats) + T * 4 * six);
  EXPECT_DOUBLE_EQ(p.activations_recompute, L * T * 4 * d + T * (4 * fp32_rest + 4 * six + stats));
  double operands = 0;
  for (const auto& i : p.worker)
    if (i.name == "bf16 GEMM operands") operands = i.bytes;
  EXPECT_DOUBLE_EQ(operands, T * 2 * (32000 + 11008));
}

// Selective recompute (model.recompute_policy selective), by hand for the same 7B spec: per layer
// the input x fp32, q, o, k, v bf16 and lse fp32; one layer's x_mid and MLP gate, up, product
// fp32, h1 and h2 bf16 and the two RMS statistics; the bf16 work set. The ring sends what it
// sends without recompute (no recompute hops), where full recompute replays the forward's.
TEST(Plan, SelectiveActivationsByHand) {
  const std::string base = gpu_spec(1 << 20, 64, true, "");
  auto spec = load(base);
  spec.model.recompute_policy = ring::spec::RecomputePolicy::kSelective;
  Plan p = make_plan(spec);
  const double T = (1 << 20) / 64.0, L = 32, d = 4096, qd = 4096, kvd = 4096, h = 11008;
  const double six = 2 * d + 2 * qd + 2 * kvd;
  const double per_layer = 4 * d + 2 * (2 * qd + 2 * kvd) + 4 * 32;  // 49,280 bytes a token
  const double shared = 4 * (d + 3 * h) + 2 * 2 * d + 8;               // one layer's
  EXPECT_DOUBLE_EQ(per_layer, 49280.0);
  EXPECT_DOUBLE_EQ(p.activations_selective, L * T * per_layer + T * shared + T * 4 * six);
  double listed = 0;
  for (const auto& i : p.worker)
    if (i.name == "activations (selective recompute)") listed = i.bytes;
  EXPECT_DOUBLE_EQ(listed, p.activations_selective);
  EXPECT_LT(p.activations_selective, p.activations_no_recompute / 3);
  EXPECT_GT(p.activations_selective, p.activations_recompute);
  auto none = load(base);
  none.model.recompute = false;
  const Plan full = make_plan(load(base)), plain = make_plan(none);
  EXPECT_DOUBLE_EQ(p.ring_bytes_per_step, plain.ring_bytes_per_step);
  EXPECT_GT(full.ring_bytes_per_step, plain.ring_bytes_per_step);
}

TEST(Plan, ActivationMemoryIsLinearInTokens) {
  Plan a = make_plan(load(gpu_spec(1 << 19, 64, false, "")));
  Plan b = make_plan(load(gpu_spec(1 << 20, 64, false, "")));
  // Weights and gradients, and the 64-byte headers of the ring buffers (2 K/V + 3 dK/dV
  // messages, common/cp/ring_messages.h) do not grow with the tokens.
  const double headers = 5.0 * ring::cp::kRingHeaderBytes;
  const double fixed = a.worker[0].bytes + a.worker[1].bytes + headers;
  EXPECT_DOUBLE_EQ((b.worker_total - fixed), 2.0 * (a.worker_total - fixed));
}

TEST(Plan, RingCommunication) {
  Plan p = make_plan(load(gpu_spec(1 << 20, 64, false, "")));
  const double T = (1 << 20) / 64.0;
  // The block as the ring sends it: a 64-byte header, positions (int64) and document ids
  // (int32) of the local tokens, then K and V in bf16 (T is a multiple of 64: no padding).
  const double kv = 64 + T * 8 + T * 4 + 2.0 * T * 4096 * 2;
  EXPECT_DOUBLE_EQ(p.ring_bytes_per_hop, kv);
  // fwd (P-1) K/V hops + bwd (P-1) K/V hops, per layer, and the dK/dV accumulators (fp32:
  // header, dK and dV of the rows attended so far). Zigzag, one document: position q attends to
  // block o's early chunk (T/2 rows) always and to its late chunk iff q < o, so block o's
  // accumulator carries T/2 rows at hops 1..63-o and T rows once the hops wrap past position 63
  // (hops 64-o..63). Over the 64 blocks: 2016 half and 2016 full messages, 31.5 each per rank.
  auto dkv = [](double rows) { return 64 + 2.0 * rows * 4096 * 4; };
  EXPECT_DOUBLE_EQ(p.ring_bytes_per_step,
                   32 * (63 * kv + 63 * kv + 31.5 * (dkv(T / 2) + dkv(T))));
  // Contiguous chunks: block o is attended whole by every later position, by no earlier one:
  // blocks 0..P-2 carry T rows at all P-1 hops, the last block nothing (0-byte messages).
  auto sc = load(gpu_spec(1 << 20, 64, false, ""));
  sc.parallel.causal_balance = spec::CausalBalance::kContiguous;
  EXPECT_DOUBLE_EQ(make_plan(sc).ring_bytes_per_step,
                   32 * (63 * kv + 63 * kv + 63.0 * 63 / 64 * dkv(T)));
  // Packed documents (data.max_doc_len = T), modelled as ringctl simulate does (documents of
  // max_doc_len back to back): fewer rows are attended than with one document, never fewer
  // than none.
  auto sd = load(gpu_spec(1 << 20, 64, false, ""));
  sd.data.pack = true;
  sd.data.max_doc_len = static_cast<int64_t>(T);
  const double packed = make_plan(sd).ring_bytes_per_step;
  EXPECT_LT(packed, p.ring_bytes_per_step);
  EXPECT_GT(packed, 32 * (63 * kv + 63 * kv));
  Plan one = make_plan(load(gpu_spec(1 << 14, 1, false, "")));
  EXPECT_EQ(one.ring_bytes_per_step, 0);
}

// Two levels (parallel.head_ranks 2 over 4 context ranks, 2 nodes of 2): worked out by hand.
// heads 4, kv_heads 2, head_dim 8, 2 layers, fp32, seq_len 64 of text: T = 16 tokens per rank; the ring
// runs over R = 2 groups with blocks of U T = 32 tokens and 1 K/V head (hkv = 2 / 2).
//   hop = 64 + 32x8 + 32x4 + 2 x 32x8x4 = 64 + 256 + 128 + 2048 = 2496
//   a group's block is its members' chunks in position order (8 tokens each; group 0: chunks
//   0, 1, 6, 7; group 1: 2..5), so group 1 attends to group 0's first 16 rows and group 0 to all
//   32 of group 1's: dK/dV = 64 + 2 x 16x8x4 = 1088 and 64 + 2 x 32x8x4 = 2112, 1600 a position;
//   per rank = 2 layers x (2 x 1 x 2496 + 1600) = 13184
//   all-to-all to the 1 other member, per layer: forward gather 128 + 64 + 1024 + 2 x 512 =
//   2240 and return 1024 + 128 = 1152; backward gather 2240 + 2 x 1024 + 128 = 4416 and return
//   1024 + 2 x 512 = 2048: 2 x (3392 + 6464) = 19712
//   node 0 (ranks 0, 1 = group 0) sends both slots' ring traffic to node 1: 2 x 13184 = 26368.
// The single ring of 4: hop = 64 + 128 + 64 + 2 x 16x16x4 = 2304; zigzag, one document: block
//   o's dK/dV accumulator carries its early chunk (8 rows: 64 + 2 x 8x16x4 = 1088) at hops
//   1..3-o and the whole block (2112) at hops 4-o..3: 6 + 6 messages over 4 ranks; per rank
//   2 x (2 x 3 x 2304 + 1.5 x 1088 + 1.5 x 2112) = 37248, and one rank per node crosses: 37248.
TEST(Plan, TwoLevelRingAndAllToAllBytesByHand) {
  const std::string yaml = R"(job: {name: p}
model: {layers: 2, d_model: 32, heads: 4, kv_heads: 2, mlp_hidden: 64, vocab: 256}
data: {source: text, paths: [/usr/share/common-licenses], seq_len: 64}
parallel: {context_ranks: 4, head_ranks: 2}
train: {steps: 1}
resources: {nodes: 2, workers_per_node: 2}
)";
  const Plan p = make_plan(load(yaml));
  EXPECT_EQ(p.head_ranks, 2);
  EXPECT_EQ(p.ring_groups, 2);
  EXPECT_DOUBLE_EQ(p.ring_bytes_per_hop, 2496);
  EXPECT_DOUBLE_EQ(p.ring_bytes_per_step, 13184);
  EXPECT_DOUBLE_EQ(p.a2a_bytes_per_step, 19712);
  EXPECT_DOUBLE_EQ(p.inter_node_ring_bytes_per_node, 26368);
  EXPECT_DOUBLE_EQ(p.single_ring_bytes_per_step, 37248);
  EXPECT_DOUBLE_EQ(p.single_inter_node_ring_bytes_per_node, 37248);
  const std::string text = to_text(p, load(yaml));
  EXPECT_NE(text.find("the ring over 2 groups"), std::string::npos) << text;
  EXPECT_NE(text.find("single ring: 37.248 kB"), std::string::npos) << text;
  const nlohmann::json j = to_json(p, load(yaml));
  EXPECT_EQ(j["communication"]["head_all_to_all_bytes_per_step_per_rank"], 19712.0);
}

TEST(Plan, TopkPayloadIsSmallerByOneOverTwoDensity) {
  auto s = load(gpu_spec(1 << 20, 8, true,
                         "optimizer: {compression: topk, density: 0.001}"));
  s.resources.nodes = 4;  // inter-node exchange
  Plan p = make_plan(s);
  EXPECT_EQ(p.topk_k, static_cast<int64_t>(std::ceil(0.001 * 6738415616.0)));
  EXPECT_NEAR(p.grad_payload_dense / p.grad_payload_topk, 500.0, 0.01);
  EXPECT_DOUBLE_EQ(p.grad_sent_dense_per_node, 2.0 * 3 / 4 * p.grad_payload_dense);
  // At the owner (the default): the dense gradient of the ranges it does not own to their
  // owners, then (shard none) the owners' sparse sets to every node.
  EXPECT_TRUE(p.topk_at_owner);
  EXPECT_DOUBLE_EQ(p.grad_topk_reduce_scatter_per_node, 3.0 / 4 * p.grad_payload_dense);
  EXPECT_DOUBLE_EQ(p.grad_topk_sparse_per_node, 3.0 / 4 * p.grad_payload_topk);
  EXPECT_DOUBLE_EQ(p.grad_sent_topk_per_node,
                   p.grad_topk_reduce_scatter_per_node + p.grad_topk_sparse_per_node);
  EXPECT_NE(to_text(p, s).find("dense reduce-scatter + owners' sparse sets all-gathered"),
            std::string::npos);
  bool has_residual = false;
  for (const auto& i : p.host) has_residual |= i.name.find("residual") != std::string::npos;
  EXPECT_TRUE(has_residual);
  // At the sender: only the sparse sets cross nodes, every node's to every other.
  s.optimizer.compress_at = spec::CompressAt::kSender;
  Plan q = make_plan(s);
  EXPECT_FALSE(q.topk_at_owner);
  EXPECT_DOUBLE_EQ(q.grad_sent_topk_per_node, 3 * q.grad_payload_topk);
  EXPECT_EQ(q.grad_topk_reduce_scatter_per_node, 0);
  EXPECT_NE(to_text(q, s).find("at each sender (compress_at: sender)"), std::string::npos);
}

// Shard full: the ranks gather every block's weights in the forward and again in the backward
// and reduce-scatter the gradient, every micro-batch; the nodes' ringd exchange nothing.
TEST(Plan, ShardFullCommunicationIsTheGathersAndTheReduceScatter) {
  auto s = load(gpu_spec(1 << 20, 8, true, "optimizer: {compression: topk, density: 0.001}"));
  s.resources.nodes = 4;
  s.parallel.shard = spec::ShardMode::kFull;
  s.train.micro_batches = 2;
  Plan p = make_plan(s);
  const double n = static_cast<double>(p.flat_floats), S = static_cast<double>(p.worker_shard);
  ASSERT_LT(S, n / 8);  // 32 ranks share the model
  // What the worker's store moves, from the objects it is built on (contract::ParamLayout,
  // worker_shards): per micro-batch the head and the (untied) embedding are gathered once and
  // every layer twice, in bf16 (the spec's model.dtype: 2 bytes a value); every bucket is
  // reduce-scattered once, in fp32. The rank with the smallest parts moves the most.
  ASSERT_EQ(s.model.dtype, spec::DType::kBf16);
  auto fp32 = s;  // the layout is the same in any dtype
  fp32.model.dtype = spec::DType::kFp32;
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(fp32));
  const auto shards = contract::worker_shards(layout, 4, 8);
  ASSERT_EQ(shards.size(), 32u);
  double gathered = 0, scattered = 0;
  for (const contract::WorkerShard& w : shards) {
    double g = 0, r = 0;
    for (const contract::GradBucket& b : layout.buckets()) {
      const int64_t mine = std::max<int64_t>(0, std::min(b.end, w.end) - std::max(b.begin, w.begin));
      const int times = (&b == &layout.head_bucket() || &b == &layout.embedding_bucket()) ? 1 : 2;
      g += times * 2.0 * static_cast<double>(b.end - b.begin - mine);
      r += 4.0 * static_cast<double>(b.end - b.begin - mine);
    }
    gathered = std::max(gathered, g);
    scattered = std::max(scattered, r);
  }
  EXPECT_DOUBLE_EQ(p.shard_gathered_per_rank, 2 * gathered);  // 2 micro-batches
  EXPECT_DOUBLE_EQ(p.shard_scattered_per_rank, 2 * scattered);
  // About 2 (n - S) x 2 and (n - S) x 4: the head and embedding are gathered once.
  EXPECT_LT(p.shard_gathered_per_rank, 2 * 2 * (n - S) * 2.0);
  EXPECT_GT(p.shard_gathered_per_rank, 2 * 1.5 * (n - S) * 2.0);
  EXPECT_GE(p.shard_scattered_per_rank, 2 * (n - S) * 4.0);
  // An fp32 spec gathers twice the bytes; the reduce-scatters are the same.
  const Plan p32 = make_plan(fp32);
  EXPECT_DOUBLE_EQ(p32.shard_gathered_per_rank, 2 * p.shard_gathered_per_rank);
  EXPECT_DOUBLE_EQ(p32.shard_scattered_per_rank, p.shard_scattered_per_rank);
  EXPECT_EQ(p.grad_sent_dense_per_node, 0);
  EXPECT_EQ(p.grad_sent_topk_per_node, 0);
  s.parallel.shard = spec::ShardMode::kOptimizer;
  Plan o = make_plan(s);
  EXPECT_EQ(o.shard_gathered_per_rank, 0);
  EXPECT_GT(o.grad_sent_dense_per_node, 0);
}

TEST(Plan, FitVerdicts) {
  // 64 CUDA workers on one node: the segment holds 64 gradient slots of 4 n (1.7 TB) besides
  // ringd's state (1.9 TB in all), over the 1.5 TB given; spread over 8 nodes of 8 it fits.
  auto one_node = load(gpu_spec(1 << 20, 64, true, ""));
  one_node.resources.host_memory_gb = 1500;
  EXPECT_TRUE(make_plan(one_node).fits_device);
  EXPECT_FALSE(make_plan(one_node).fits_host);
  one_node.resources.nodes = 8;
  one_node.resources.workers_per_node = 8;
  Plan fits = make_plan(one_node);
  EXPECT_TRUE(fits.fits()) << to_text(fits, one_node);
  EXPECT_EQ(fits.device_name, "H100-80G");
  EXPECT_DOUBLE_EQ(fits.device_usable, 81559.0 * (1 << 20) - kGpuReserveBytes);
  // Without recompute, 16K tokens per rank of a 7B model no longer fit in 80 GB.
  Plan no = make_plan(load(gpu_spec(1 << 20, 64, false, "")));
  EXPECT_FALSE(no.fits_device);
  // Host memory too small for the offloaded optimizer state (7B x 16 bytes > 100 GB).
  auto s = load(gpu_spec(1 << 20, 64, true, ""));
  s.resources.host_memory_gb = 100;
  EXPECT_FALSE(make_plan(s).fits_host);
}

TEST(Plan, RingctlPlanTextJsonAndCheck) {
  const std::string ringctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";
  auto text = test::run(ringctl + " plan " + test::source_path("configs/examples/tiny.yaml"));
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("verdict: fits"), std::string::npos) << text.output;
  // The tiny model's count in its own unit (millions), not "0.003 B params".
  auto tiny = nlohmann::json::parse(
      test::run(ringctl + " plan --json " + test::source_path("configs/examples/tiny.yaml"))
          .output);
  const auto params = tiny["model"]["params"].get<double>();
  ASSERT_LT(params, 1e8);
  EXPECT_NE(text.output.find("model: " + human_count(params) + " params ("), std::string::npos)
      << text.output;
  EXPECT_EQ(text.output.find(" B params"), std::string::npos) << text.output;
  // (--what-if prints this build's limits as warnings on stderr: only stdout is JSON)
  auto json =
      test::run("(" + ringctl + " plan --what-if --json " +
                test::source_path("configs/examples/llama7b-1m-64x8-h100.yaml") + " 2>/dev/null)");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["model"]["params"].get<int64_t>(), 6738415616);
  EXPECT_TRUE(j["fit"]["fits"].get<bool>());
  EXPECT_EQ(j["sequence"]["tokens_per_rank"].get<int64_t>(), 16384);
  // The 270B example fits fully sharded; without sharding the weights alone exceed an H200,
  // and --check says so with exit 3.
  auto big = test::run(ringctl + " plan --what-if --check " +
                       test::source_path("configs/examples/270b-1.2m-64x8-h200.yaml"));
  EXPECT_EQ(big.exit_code, 0) << big.output;
  EXPECT_NE(big.output.find("verdict: fits"), std::string::npos) << big.output;
  EXPECT_NE(big.output.find("full       "), std::string::npos) << big.output;
  auto unsharded = test::run(ringctl + " plan --what-if --check --set parallel.shard=none " +
                             test::source_path("configs/examples/270b-1.2m-64x8-h200.yaml"));
  EXPECT_EQ(unsharded.exit_code, 3) << unsharded.output;
  EXPECT_NE(unsharded.output.find("DOES NOT FIT"), std::string::npos);
  // The bf16 example itself plans without --what-if (model.dtype bf16 runs)...
  auto plain = test::run(ringctl + " plan --check " +
                         test::source_path("configs/examples/270b-1.2m-64x8-h200.yaml"));
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("verdict: fits"), std::string::npos) << plain.output;
  // ...but without --what-if, plan refuses what `run`/`submit` would refuse, with the reason.
  auto refused = test::run(ringctl + " plan --set model.head_dim=256 " +
                           test::source_path("configs/examples/270b-1.2m-64x8-h200.yaml"));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("model.head_dim: not supported by this build"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("--what-if"), std::string::npos) << refused.output;
  auto bad = test::run(ringctl + " plan " + test::source_path("configs/invalid/bad-enum.yaml"));
  EXPECT_EQ(bad.exit_code, 1);
}

spec::JobSpec example(const std::string& name) {
  spec::LoadOptions o = spec::job_spec_options();
  o.runtime_limits_are_errors = false;
  auto r = spec::load_spec_file(test::source_path("configs/examples/" + name), o);
  EXPECT_TRUE(r.ok()) << name;
  return r.ok() ? *r.spec : spec::JobSpec{};
}

// The dense reduce at a bucket's owner with 64 nodes: windows of 256 MiB / (2 x 63 x 4 B) floats,
// two per other node in flight (daemon/ringd/transport_exchange.cc).
constexpr double kWindow64 = static_cast<double>((int64_t{256} << 20) / (2 * 63 * 4));
constexpr double kStage64 = 2.0 * 63 * 4 * kWindow64;

double item(const std::vector<Item>& items, const std::string& prefix) {
  for (const auto& i : items)
    if (i.name.rfind(prefix, 0) == 0) return i.bytes;
  return -1;
}

// The llama7b example (shard none, 64 nodes, top-k with error feedback at the owner, CUDA
// workers): ringd keeps master, m, v and the node gradient (16 n bytes) plus the residual of its
// range (4 R) and the node's segment holds the weights, the lazy index and 8 gradient slots
// (44 n): 60 n + 4 R ~ 405 GB plus the top-k buffers, where the planner used to show 148 GB
// (with compress_at sender the residual is full size: 64 n ~ 431 GB). The 8 CUDA workers keep
// no host copy (weights and gradient buckets go between the device and the segment directly).
TEST(Plan, Llama7bHostMemoryIsWhatTheCodeAllocates) {
  // Shard none (the example runs shard optimizer since `ringctl plan --search` picked it).
  auto s = example("llama7b-1m-64x8-h100.yaml");
  s.parallel.shard = spec::ShardMode::kNone;
  const Plan p = make_plan(s);
  const double n = 6738415616.0;  // every tensor of this model is a multiple of 16 floats
  ASSERT_EQ(p.flat_floats, 6738415616);
  EXPECT_EQ(item(p.host_ringd, "optimizer master"), 12 * n);
  // 34 buckets over 64 nodes: the largest range is the largest bucket.
  const double R = static_cast<double>(p.residual_floats);
  EXPECT_EQ(p.residual_floats, p.largest_bucket);
  EXPECT_EQ(item(p.host_ringd, "error-feedback residual"), 4 * R);
  EXPECT_EQ(item(p.host_ringd, "node gradient"), 4 * n);
  EXPECT_EQ(item(p.host_ringd, "checkpoint staging"), 16.0 * (1 << 20));
  EXPECT_EQ(item(p.host_ringd, "weight all-gather"), -1);  // shard none
  EXPECT_NEAR(p.host_shm_total, 44 * n, 256);
  EXPECT_EQ(p.host_shm_total, shm_bytes(6738415616, 8));
  // The top-k buffers: the owners' sets of k = 0.001 x bucket, 8 bytes an entry, the dense
  // reduce staging of the largest bucket (63 nodes') and the exchange buffers.
  EXPECT_LT(p.host_ringd_total - 16 * n - 4 * R,
            0.001 * 8 * n * 1.01 + kStage64 + 400e6);
  EXPECT_NEAR(p.host_ringd_total + p.host_shm_total, 60 * n + 4 * R, 60e9);
  EXPECT_GT(p.host_ringd_total + p.host_shm_total, 400e9);
  auto sender = s;
  sender.optimizer.compress_at = spec::CompressAt::kSender;
  const Plan q = make_plan(sender);
  EXPECT_EQ(item(q.host_ringd, "error-feedback residual"), 4 * n);
  EXPECT_LT(q.host_ringd_total - 20 * n, 0.001 * 64 * 8 * n * 1.01 + 200e6);
  EXPECT_NEAR(q.host_ringd_total + q.host_shm_total, 64 * n, 4e9);
  EXPECT_EQ(p.worker_host_total, 0);
  EXPECT_EQ(p.host_workers_total, 0);
  EXPECT_DOUBLE_EQ(p.host_total,
                   p.host_ringd_total + p.host_shm_total + p.host_workers_total);
  EXPECT_TRUE(p.fits());  // 456 GB of the 1.8 TB it declares
  EXPECT_LT(p.host_total, 460e9);
}

// Every mode's lines: shard optimizer divides ringd's state by the node ranges, shard full also
// the workers' weights and gradients (range / workers_per_node each, plus two gathered blocks and
// a block gradient).
TEST(Plan, ShardModesDivideWhatTheyShard) {
  auto s = example("llama7b-1m-64x8-h100.yaml");
  const double n = 6738415616.0;
  auto none = s;
  none.parallel.shard = spec::ShardMode::kNone;
  s.parallel.shard = spec::ShardMode::kOptimizer;
  const Plan o = make_plan(s);
  // 34 buckets over 64 nodes: the largest node owns the largest bucket (the untied head or the
  // embedding, V d + 16 floats... or one block).
  EXPECT_EQ(o.largest_range, o.largest_bucket);
  EXPECT_EQ(item(o.host_ringd, "optimizer master"), 12.0 * static_cast<double>(o.largest_range));
  // At the owner, its range (compress_at sender: full size).
  EXPECT_EQ(item(o.host_ringd, "error-feedback residual"), 4.0 * o.largest_range);
  auto o_sender = s;
  o_sender.optimizer.compress_at = spec::CompressAt::kSender;
  EXPECT_EQ(item(make_plan(o_sender).host_ringd, "error-feedback residual"), 4 * n);
  // The weights are all-gathered straight into the shared segment: no buffer of ringd's own.
  EXPECT_EQ(item(o.host_ringd, "weight all-gather"), -1);
  // Dense steps (200 warm-up steps) reduce each bucket to its owner, which stages the other 63
  // nodes' copies of its largest bucket.
  EXPECT_GT(o.largest_bucket, kWindow64);
  EXPECT_EQ(item(o.host_ringd, "dense reduce staging"), kStage64);
  // Top-k at the owner reduces in every step; at the sender, only the dense steps do.
  auto no_warmup = s;
  no_warmup.optimizer.warmup_steps = 0;
  EXPECT_EQ(item(make_plan(no_warmup).host_ringd, "dense reduce staging"), kStage64);
  no_warmup.optimizer.compress_at = spec::CompressAt::kSender;
  EXPECT_EQ(item(make_plan(no_warmup).host_ringd, "dense reduce staging"), -1);
  // The owner sums the sparse sets of its own buckets only.
  EXPECT_LT(item(o.host_ringd, "summed sparse"),
            item(make_plan(none).host_ringd, "summed sparse") / 20);
  EXPECT_EQ(o.worker_total, make_plan(none).worker_total);

  s.parallel.shard = spec::ShardMode::kFull;
  const Plan f = make_plan(s);
  // The largest node's range cut among its 8 workers, 64-byte aligned.
  const double shard = std::ceil(std::ceil(f.largest_range / 8.0) / 16) * 16;
  EXPECT_EQ(f.worker_shard, static_cast<int64_t>(shard));
  // Backend cuda: the shard and the transfers' buffers are the worker's host memory; the GPU
  // holds only the staged block in use and the block gradient being written (untied head).
  EXPECT_EQ(item(f.worker_host, "weight shard"), shard * 2);
  EXPECT_EQ(item(f.worker_host, "gradient shard"), shard * 4);
  EXPECT_EQ(item(f.worker, "weight shard"), -1);
  EXPECT_FALSE(s.model.tie_embeddings);
  EXPECT_EQ(item(f.worker, "staged block"), 1.0 * f.largest_bucket * 2);
  EXPECT_EQ(item(f.worker, "staged block gradient"), 4.0 * f.largest_bucket);
  // A gather's buffer holds bf16, a gradient's fp32.
  EXPECT_EQ(item(f.worker_host, "block buffers"), (2.0 + 4.0) * f.largest_bucket);
  // Two receive buffers, the running sum and a node's running sum (64 nodes).
  EXPECT_EQ(item(f.worker_host, "reduce-scatter window"),
            16.0 * std::min<double>(shard, f.largest_bucket));
  EXPECT_DOUBLE_EQ(item(f.host_workers, "workers' host buffers"), 8 * f.worker_host_total);
  // Backend cpu: all of it is the worker's (host) memory, blocks prefetched in place.
  auto c = s;
  c.resources.backend = spec::Backend::kCpu;
  const Plan fc = make_plan(c);
  EXPECT_EQ(item(fc.worker, "weight shard"), shard * 2);
  EXPECT_EQ(item(fc.worker, "gathered blocks"), 2.0 * fc.largest_bucket * 2);
  EXPECT_EQ(item(fc.worker, "block gradient"), 4.0 * fc.largest_bucket);
  EXPECT_TRUE(fc.worker_host.empty());
  EXPECT_LT(f.worker_total, o.worker_total);
  EXPECT_EQ(item(f.host_ringd, "node gradient"), 4.0 * f.largest_range);
  EXPECT_LT(f.host_shm_total, o.host_shm_total / 20);
  EXPECT_LT(f.host_total, o.host_total);
  // The comparison lists the three modes, the spec's own totals among them.
  ASSERT_EQ(f.modes.size(), 3u);
  EXPECT_EQ(f.modes[2].mode, spec::ShardMode::kFull);
  EXPECT_DOUBLE_EQ(f.modes[2].host_total, f.host_total);
  EXPECT_DOUBLE_EQ(f.modes[1].host_total, o.host_total);
}

// The large examples fit only fully sharded; the 70B one says which mode in its comment.
TEST(Plan, LargeExamplesFitFullySharded) {
  for (const char* name : {"270b-1.2m-64x8-h200.yaml", "70b-1m-64x8-h100.yaml"}) {
    const auto s = example(name);
    EXPECT_EQ(s.parallel.shard, spec::ShardMode::kFull) << name;
    const Plan p = make_plan(s);
    EXPECT_TRUE(p.fits()) << name << "\n" << to_text(p, s);
    ASSERT_EQ(p.modes.size(), 3u);
    EXPECT_FALSE(p.modes[0].fits_device) << name;  // whole bf16 weights on every GPU
    EXPECT_FALSE(p.modes[1].fits_device) << name;
    EXPECT_TRUE(p.modes[2].fits_device && p.modes[2].fits_host) << name;
  }
  const std::string text = test::read_file(test::source_path("configs/examples/70b-1m-64x8-h100.yaml"));
  EXPECT_NE(text.find("Mode: parallel.shard: full"), std::string::npos);
}

// --json carries every line and the comparison.
TEST(Plan, JsonHasTheShardSection) {
  const auto s = example("270b-1.2m-64x8-h200.yaml");
  const Plan p = make_plan(s);
  const auto j = to_json(p, s);
  EXPECT_EQ(j["shard"]["mode"], "full");
  EXPECT_EQ(j["shard"]["largest_range_floats"].get<int64_t>(), p.largest_range);
  EXPECT_EQ(j["shard"]["modes"].size(), 3u);
  EXPECT_EQ(j["host"]["ringd"]["items"].size(), p.host_ringd.size());
  EXPECT_DOUBLE_EQ(j["host"]["shm"]["total_bytes"].get<double>(), p.host_shm_total);
  EXPECT_DOUBLE_EQ(j["host"]["total_bytes"].get<double>(), p.host_total);
  EXPECT_EQ(j["worker_host"]["items"].size(), p.worker_host.size());
  const std::string t = to_text(p, s);
  EXPECT_NE(t.find("shard modes"), std::string::npos) << t;
}

// Model FLOPs per step (docs/planning.md, "FLOPs per step"), by hand.
// A tiny model: layers 2, d_model 64, heads 4 (no GQA), SwiGLU hidden 128, vocab 256 tied.
//   params = 2 x (4 x 64^2 + 3 x 64 x 128 + 2 x 64) + 256 x 64 + 64
//          = 2 x (16384 + 24576 + 128) + 16384 + 64 = 98,624
//   per sequence of N = 1024: dense 6 x 98624 x 1024 = 605,945,856
//                             attention 6 x 2 x 64 x 1024^2 = 805,306,368
//   data_replicas 2 x micro_batches 3 = 6 sequences: model 6 x 1,411,252,224 = 8,467,513,344
//   recompute: 6 x (2 x 98624 x 1024 + 2 x 2 x 64 x 1024^2) = 6 x 470,417,408 = 2,822,504,448
//   hardware 11,290,017,792
//   selective recompute: only the output projection and the MLP's gate/up again,
//   6 x 1024 x 2 layers x 2 x 64 x (4 x 16 + 2 x 128) = 6 x 1024 x 2 x 2 x 64 x 320
//   = 503,316,480; hardware 8,970,829,824
TEST(Plan, StepFlopsOfATinyModelByHand) {
  const std::string text = R"(job: {name: f}
model: {layers: 2, d_model: 64, heads: 4, mlp_hidden: 128, vocab: 256, dtype: fp32,
        tie_embeddings: true, recompute: true}
data: {source: passkey, seq_len: 1024}
parallel: {context_ranks: 2, data_replicas: 2}
train: {steps: 1, micro_batches: 3}
resources: {backend: cpu, nodes: 1, workers_per_node: 4, host_memory_gb: 8}
)";
  Plan p = make_plan(load(text));
  ASSERT_EQ(p.params, 98624);
  EXPECT_EQ(p.flops.sequences, 6);
  EXPECT_DOUBLE_EQ(p.flops.dense_per_sequence, 605945856.0);
  EXPECT_DOUBLE_EQ(p.flops.attention_per_sequence, 805306368.0);
  EXPECT_DOUBLE_EQ(p.flops.model_per_step, 8467513344.0);
  EXPECT_DOUBLE_EQ(p.flops.recompute_per_step, 2822504448.0);
  EXPECT_DOUBLE_EQ(p.flops.hardware_per_step, 11290017792.0);
  // Without recompute the hardware FLOPs are the model's.
  auto s = load(text);
  s.model.recompute = false;
  const StepFlops f = step_flops(s, p.params);
  EXPECT_DOUBLE_EQ(f.hardware_per_step, f.model_per_step);
  EXPECT_DOUBLE_EQ(f.recompute_per_step, 0.0);
  s.model.recompute = true;
  s.model.recompute_policy = ring::spec::RecomputePolicy::kSelective;
  const StepFlops sel = step_flops(s, p.params);
  EXPECT_DOUBLE_EQ(sel.recompute_per_step, 503316480.0);
  EXPECT_DOUBLE_EQ(sel.hardware_per_step, 8970829824.0);
}

// The llama7b example: params 6,738,415,616 (LLaMA-7B's published count), N = 2^20 = 1,048,576,
// 32 layers, d_model 4096, data_replicas 8 x micro_batches 1 = 8 sequences, recompute on.
//   dense per sequence     6 x 6,738,415,616 x 2^20            = 42,394,445,357,776,896
//   attention per sequence 6 x 32 x 4096 x 2^40                = 864,691,128,455,135,232
//   model per step         8 x 907,085,573,812,912,128         = 7.256684590503297e18
//   recompute              8 x (2 x 6,738,415,616 x 2^20 + 2 x 32 x 4096 x 2^40) = 2.418894863501099e18
//   hardware               9.675579454004396e18
// `ringctl plan --json` carries them as model_flops_per_step and hardware_flops_per_step.
TEST(Plan, StepFlopsOfTheLlama7bExampleByHand) {
  const spec::JobSpec s = example("llama7b-1m-64x8-h100.yaml");
  Plan p = make_plan(s);
  ASSERT_EQ(p.params, 6738415616);
  EXPECT_EQ(p.flops.sequences, 8);
  EXPECT_DOUBLE_EQ(p.flops.dense_per_sequence, 42394445357776896.0);
  EXPECT_DOUBLE_EQ(p.flops.attention_per_sequence, 864691128455135232.0);
  EXPECT_NEAR(p.flops.model_per_step / 7.256684590503297e18, 1.0, 1e-12);
  EXPECT_NEAR(p.flops.hardware_per_step / 9.675579454004396e18, 1.0, 1e-12);
  const nlohmann::json j = to_json(p, s);
  EXPECT_DOUBLE_EQ(j["model_flops_per_step"].get<double>(), p.flops.model_per_step);
  EXPECT_DOUBLE_EQ(j["hardware_flops_per_step"].get<double>(), p.flops.hardware_per_step);
  EXPECT_NE(to_text(p, s).find("FLOPs per step (8 sequence(s) of 1048576 tokens"), std::string::npos);
}

}  // namespace
}  // namespace ring::plan
