#include "common/contract/layout.h"

#include <string>

namespace ring::contract {

ParamLayout::ParamLayout(const ModelConfig& c) : num_layers_(static_cast<int>(c.layers)) {
  c.check();
  const int64_t d = c.d_model;
  add("final_norm.gain", {d}, -1, false);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab, d}, -1, true);
  close_bucket("head", -1);
  for (int l = num_layers_ - 1; l >= 0; --l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "attn_norm.gain", {d}, l, false);
    add(p + "attn.wq", {c.q_dim(), d}, l, true);
    add(p + "attn.wk", {c.kv_dim(), d}, l, true);
    add(p + "attn.wv", {c.kv_dim(), d}, l, true);
    add(p + "attn.wo", {d, c.q_dim()}, l, true);
    add(p + "mlp_norm.gain", {d}, l, false);
    if (c.mlp == spec::MlpKind::kSwiGLU) add(p + "mlp.w_gate", {c.mlp_hidden, d}, l, true);
    add(p + "mlp.w_up", {c.mlp_hidden, d}, l, true);
    add(p + "mlp.w_down", {d, c.mlp_hidden}, l, true);
    close_bucket("layers." + std::to_string(l), l);
  }
  add("embedding.weight", {c.vocab, d}, -1, true);
  close_bucket("embedding", -1);
}

void ParamLayout::add(const std::string& name, std::vector<int64_t> shape, int layer,
                      bool decay) {
  ParamView v;
  v.name = name;
  v.size = 1;
  for (int64_t s : shape) v.size *= s;
  v.shape = std::move(shape);
  v.offset = (total_ + kParamAlign - 1) / kParamAlign * kParamAlign;
  v.layer = layer;
  v.decay = decay;
  total_ = v.offset + v.size;
  views_.push_back(std::move(v));
}

void ParamLayout::close_bucket(const std::string& name, int layer) {
  total_ = (total_ + kParamAlign - 1) / kParamAlign * kParamAlign;
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
