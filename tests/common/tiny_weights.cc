#include "tests/common/tiny_weights.h"

#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::test {

std::vector<float> tiny_params(const contract::ModelConfig& c, kernels::Backend* backend,
                               uint64_t seed, const Sharpen& sharpen) {
  model::LocalAttention att(backend);
  model::Model m(c, backend, &att);
  std::vector<float> p = m.initial_params(seed);  // fp32 as drawn, for either dtype
  for (const auto& v : m.layout().views()) {
    bool scaled = false;
    for (const auto& name : sharpen.names)
      scaled = scaled || v.name.find(name) != std::string::npos;
    if (scaled)
      for (int64_t i = 0; i < v.size; ++i) p[static_cast<size_t>(v.offset + i)] *= sharpen.factor;
  }
  return p;
}

ckpt::SaveResult write_checkpoint(const std::string& dir, const contract::ModelConfig& c,
                                  const std::vector<float>& params) {
  const contract::ParamLayout pl(c);
  ckpt::Options co;
  co.dir = dir;
  co.keep_last = 1;
  co.fsync = false;
  co.spec_hash = "test";
  ckpt::Layout l;
  l.shard = "none";
  l.nodes = 1;
  l.total_floats = pl.total();
  for (const auto& r : contract::shard_ranges(pl, 1))
    l.ranges.push_back({r.node, r.begin, r.end, r.first_bucket, r.end_bucket});
  l.model = contract::model_record(c);
  co.layout = l;
  ckpt::Checkpointer ck(co);
  for (const auto& v : pl.views())
    ck.add_tensor("master/" + v.name, ckpt::DType::kF32, v.shape, params.data() + v.offset);
  ck.start(2, {});
  return ck.wait();
}

}  // namespace ring::test
