// The flat parameter layout: every weight of the model is a named view into ONE fp32 buffer, and
// the gradients use a second buffer with the same layout (same offsets).
//
// Order = the order in which the backward pass finishes each gradient, so a consumer (ringd's
// gradient buckets) can take a growing PREFIX of the gradient buffer as soon as the
// backward is done with a layer:
//
//   bucket 0          final_norm.gain [d], lm_head.weight [vocab, d] (untied only)
//   bucket 1          layers.{L-1}.*   (the last layer: its backward runs first)
//   ...
//   bucket L          layers.0.*
//   bucket L+1        embedding.weight [vocab, d]  (with tied embeddings it is also the LM head:
//                     its gradient is complete only after the embedding backward, at the end)
//
// Inside a layer: attn_norm.gain [d], attn.wq [heads*head_dim, d], attn.wk [kv_heads*head_dim, d],
// attn.wv [kv_heads*head_dim, d], attn.wo [d, heads*head_dim], mlp_norm.gain [d], then
// swiglu: mlp.w_gate [hidden, d], mlp.w_up [hidden, d], mlp.w_down [d, hidden];
// gelu:   mlp.w_up [hidden, d], mlp.w_down [d, hidden].
// Projection weights are [out, in] (torch.nn.Linear's convention): y = x W^T.
//
// Every tensor starts at a multiple of kParamAlign floats (64 bytes); the gaps are zero in both
// buffers and never read by the model, so buckets and tensors are cache-line / vector aligned.
// The order and the alignment are layout_rules.h's, which the planner applies too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/contract/layout_rules.h"
#include "common/contract/model_config.h"

namespace ring::contract {

struct ParamView {
  std::string name;            // "layers.3.attn.wq"
  std::vector<int64_t> shape;  // [out, in] for projections, [d] for gains
  int64_t offset = 0;          // floats from the start of the flat buffer
  int64_t size = 0;            // product of shape
  int layer = -1;              // transformer block index, -1 for embedding / final norm / head
  bool decay = true;           // AdamW weight decay applies (false for norm gains)
};

// A contiguous range of the gradient buffer that becomes final at once during the backward.
struct GradBucket {
  int index = 0;       // 0 .. num_buckets-1, in completion order
  std::string name;    // "head", "layers.5", "embedding"
  int layer = -1;      // block index, -1 for head / embedding
  int64_t begin = 0;   // floats, inclusive
  int64_t end = 0;     // floats, exclusive; bucket i+1 begins where bucket i ends
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config);

  const std::vector<ParamView>& views() const { return views_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int64_t total() const { return total_; }  // floats in the flat buffer (with alignment gaps)
  int64_t num_params() const;               // floats in tensors (without gaps)

  // Throws ModelError for an unknown name.
  const ParamView& view(const std::string& name) const;
  int64_t offset(const std::string& name) const { return view(name).offset; }
  // The bucket holding block `layer`'s parameters.
  const GradBucket& layer_bucket(int layer) const { return buckets_[1 + (num_layers_ - 1 - layer)]; }
  const GradBucket& head_bucket() const { return buckets_.front(); }
  const GradBucket& embedding_bucket() const { return buckets_.back(); }

 private:
  void add(const std::string& name, std::vector<int64_t> shape, int layer, bool decay);
  void close_bucket(const std::string& name, int layer);

  int num_layers_ = 0;
  int64_t total_ = 0;
  int64_t bucket_begin_ = 0;
  std::vector<ParamView> views_;
  std::vector<GradBucket> buckets_;
};

}  // namespace ring::contract
