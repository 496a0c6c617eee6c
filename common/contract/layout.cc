#include "common/contract/layout.h"

#include <string>

namespace ring::contract {

// Sizes in layout_rules.h's order; a vector tensor has cols 0.
ParamLayout::ParamLayout(const ModelConfig& c) : num_layers_(static_cast<int>(c.layers)) {
  c.check();
  const LayoutShape<int64_t> s{c.d_model,    c.q_dim(), c.kv_dim(),         c.mlp_hidden,
                               c.vocab,      c.tie_embeddings, c.mlp == spec::MlpKind::kSwiGLU};
  auto adder = [this](const std::string& prefix, int layer) {
    return [this, prefix, layer](const char* name, int64_t rows, int64_t cols, bool decay) {
      add(prefix + name, cols == 0 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols},
          layer, decay);
    };
  };
  head_tensors(s, adder("", -1));
  close_bucket("head", -1);
  for (int l = num_layers_ - 1; l >= 0; --l) {
    block_tensors(s, adder("layers." + std::to_string(l) + ".", l));
    close_bucket("layers." + std::to_string(l), l);
  }
  embedding_tensors(s, adder("", -1));
  close_bucket("embedding", -1);
}

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, int layer,
                      bool decay) {
  ParamView v;
  v.name = name;
  v.size = 1;
  for (int64_t s : shape) v.size *= s;
  v.shape = std::move(shape);
  v.offset = align_up(total_);
  v.layer = layer;
  v.decay = decay;
  total_ = v.offset + v.size;
  views_.push_back(std::move(v));
}

void ParamLayout::close_bucket(const std::string& name, int layer) {
  total_ = align_up(total_);
  GradBucket b;
  b.index = static_cast<int>(buckets_.size());
  b.name = name;
  b.layer = layer;
  b.begin = bucket_begin_;
  b.end = total_;
  bucket_begin_ = total_;
  buckets_.push_back(std::move(b));
}

int64_t ParamLayout::num_params() const {
  int64_t n = 0;
  for (const ParamView& v : views_) n += v.size;
  return n;
}

const ParamView& ParamLayout::view(const std::string& name) const {
  for (const ParamView& v : views_) {
    if (v.name == name) return v;
  }
  throw ModelError("no parameter named '" + name + "'");
}

}  // namespace ring::contract
