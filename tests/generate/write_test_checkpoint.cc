// Writes the checkpoint the generation tests use (format 2, its layout record naming the model):
// a random model of 2 layers, d_model 64, 4 query heads over 2 K/V heads of 16, swiglu 128, byte
// vocab, attention and embedding scaled x8 so that greedy tokens are decided by clear margins.
//   write_test_checkpoint DIR      (DIR/step-00000002 appears)
// Used by tests/slurm/generate_slurm_test.sh. Exit 0 ok, 1 failure (message on stderr), 2 usage.
#include <cstdio>
#include <string>
#include <vector>

#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "common/checkpoint/checkpoint.h"
#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    ring::model::ModelConfig c;
    c.layers = 2;
    c.d_model = 64;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 16;
    c.mlp_hidden = 128;
    c.vocab = 256;
    std::string err;
    auto be = ring::kernels::create_backend("cpu", 1, &err);
    if (!be) throw std::runtime_error(err);
    ring::model::LocalAttention att(be.get());
    ring::model::Model m(c, be.get(), &att);
    m.init_params(21);
    std::vector<float> params = m.get_params();
    for (const auto& v : m.layout().views())
      if (v.name.find("attn.w") != std::string::npos || v.name == "embedding.weight")
        for (int64_t i = 0; i < v.size; ++i) params[static_cast<size_t>(v.offset + i)] *= 8.f;
    const ring::contract::ParamLayout pl(c);
    ring::ckpt::Options co;
    co.dir = argv[1];
    co.keep_last = 1;
    co.fsync = false;
    co.spec_hash = "test";
    ring::ckpt::Layout l;
    l.shard = "none";
    l.nodes = 1;
    l.total_floats = pl.total();
    for (const auto& r : ring::contract::shard_ranges(pl, 1))
      l.ranges.push_back({r.node, r.begin, r.end, r.first_bucket, r.end_bucket});
    l.model = ring::contract::model_record(c);
    co.layout = l;
    ring::ckpt::Checkpointer ck(co);
    for (const auto& v : pl.views())
      ck.add_tensor("master/" + v.name, ring::ckpt::DType::kF32, v.shape, params.data() + v.offset);
    ck.start(2, {});
    if (!ck.wait().ok) throw std::runtime_error("the checkpoint was not written");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_test_checkpoint: %s\n", e.what());
    return 1;
  }
}
