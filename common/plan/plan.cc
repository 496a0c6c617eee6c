#include "common/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace ring::plan {

using spec::Backend;
using spec::Compression;
using spec::JobSpec;
using spec::MlpKind;
using spec::Offload;

const std::vector<GpuModel>& gpu_models() {
  // Total memory as the driver reports it (nvidia-smi "FB Memory Usage: Total").
  static const std::vector<GpuModel> m = {
      {spec::GpuType::kA100_80G, "A100-80G", 81920.0 * (1 << 20)},
      {spec::GpuType::kH100_80G, "H100-80G", 81559.0 * (1 << 20)},
      {spec::GpuType::kH200_141G, "H200-141G", 143771.0 * (1 << 20)},
  };
  return m;
}

namespace {

double sum(const std::vector<Item>& items) {
  double s = 0;
  for (const auto& i : items) s += i.bytes;
  return s;
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (std::fabs(b) >= 1000.0 && u < 5) b /= 1000.0, ++u;
  if (u == 0) return fmt::format("{:.0f} B", b);
  return fmt::format("{:.{}f} {}", b, b >= 100 ? 1 : 3, units[u]);
}

std::string human_count(double n) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  // Step up where the value would round to 1000: 999,999 reads "1.00 M", not "1000 K".
  while (u < 4 && std::fabs(n) >= 999.5) n /= 1000.0, ++u;
  if (u == 0) return fmt::format("{:.0f}", n);
  const double a = std::fabs(n);
  return fmt::format("{:.{}f}{}", n, a >= 99.95 ? 0 : a >= 9.995 ? 1 : 2, units[u]);
}

FlatLayout flat_layout(const JobSpec& s) {
  // __int128: a spec's largest shapes (d_model, vocab, layers at their key maxima) overflow
  // int64 only in products we then saturate.
  using I = __int128;
  constexpr I kAlign = 16;  // common/contract/layout.h kParamAlign
  const auto& m = s.model;
  const I d = m.d_model, h = s.resolved.mlp_hidden, V = m.vocab;
  const I q_dim = I{m.heads} * s.resolved.head_dim,
          kv_dim = I{s.resolved.kv_heads} * s.resolved.head_dim;
  I total = 0, bucket_begin = 0, largest = 0;
  std::string largest_name;
  auto up = [&](I x) { return (x + kAlign - 1) / kAlign * kAlign; };
  auto add = [&](I size) { total = up(total) + size; };
  auto close = [&](const std::string& name) {
    total = up(total);
    if (total - bucket_begin > largest) largest = total - bucket_begin, largest_name = name;
    bucket_begin = total;
  };
  add(d);                             // final_norm.gain
  if (!m.tie_embeddings) add(V * d);  // lm_head.weight
  close("head");
  // Every block has the same shape: lay out one and repeat it (each block starts aligned).
  const I block_begin = total;
  add(d);                                           // attn_norm.gain
  add(q_dim * d);                                   // wq
  add(kv_dim * d);                                  // wk
  add(kv_dim * d);                                  // wv
  add(d * q_dim);                                   // wo
  add(d);                                           // mlp_norm.gain
  if (m.mlp == spec::MlpKind::kSwiGLU) add(h * d);  // w_gate
  add(h * d);                                       // w_up
  add(d * h);                                       // w_down
  total = up(total);
  const I block = total - block_begin;
  if (m.layers > 0 && block > largest) largest = block, largest_name = "layers.N (each block)";
  total = block_begin + block * I{m.layers};
  bucket_begin = total;
  add(V * d);  // embedding.weight
  close("embedding");
  const I cap = std::numeric_limits<int64_t>::max();
  FlatLayout f;
  f.elements = static_cast<int64_t>(std::min(total, cap));
  f.largest_bucket = static_cast<int64_t>(std::min(largest, cap));
  f.largest_bucket_name = largest_name;
  return f;
}

Plan make_plan(const JobSpec& s) {
  Plan p;
  const auto& m = s.model;
  const double d = static_cast<double>(m.d_model);
  const double H = static_cast<double>(m.heads);
  const double K = static_cast<double>(s.resolved.kv_heads);
  const double hd = static_cast<double>(s.resolved.head_dim);
  const double h = static_cast<double>(s.resolved.mlp_hidden);
  const double L = static_cast<double>(m.layers);
  const double V = static_cast<double>(m.vocab);
  const int64_t P = s.parallel.context_ranks;
  const double b = spec::dtype_bytes(m.dtype);
  p.storage_bytes = spec::dtype_bytes(m.dtype);
  p.ranks = P;
  p.tokens_per_rank = s.data.seq_len / P;
  const double T = static_cast<double>(p.tokens_per_rank);
  const double N = static_cast<double>(s.data.seq_len);

  // ---- parameters
  const double mlp_params = (m.mlp == MlpKind::kSwiGLU ? 3.0 : 2.0) * d * h;
  const double attn_params = d * H * hd + 2.0 * d * K * hd + H * hd * d;
  p.params_per_layer = static_cast<int64_t>(attn_params + mlp_params + 2.0 * d);
  p.params_embedding = static_cast<int64_t>(V * d * (m.tie_embeddings ? 1.0 : 2.0));
  p.params = p.params_embedding + m.layers * p.params_per_layer + m.d_model;
  const double Pn = static_cast<double>(p.params);

  // ---- activations saved for backward, per layer per local token (storage dtype, lse fp32):
  // layer input and attention residual (2d), both norm outputs (2d), q and attention output
  // (2 H hd), k and v (2 K hd), MLP intermediates (swiglu: gate, up, product = 3h; gelu: 2h),
  // fp32 lse per head and two fp32 RMS statistics.
  const double mlp_act = (m.mlp == MlpKind::kSwiGLU ? 3.0 : 2.0) * h;
  const double act_per_token_layer =
      b * (4.0 * d + 2.0 * H * hd + 2.0 * K * hd + mlp_act) + 4.0 * H + 8.0;
  p.activations_no_recompute = L * T * act_per_token_layer;
  // Recompute keeps each layer's input, plus one layer's full set while it is recomputed.
  p.activations_recompute = L * T * b * d + T * act_per_token_layer;
  const double activations = m.recompute ? p.activations_recompute : p.activations_no_recompute;

  p.kv_local_per_layer = 2.0 * T * K * hd * b;
  p.kv_local_total = L * p.kv_local_per_layer;
  p.kv_sequence_per_layer = 2.0 * N * K * hd * b;
  p.kv_sequence_total = L * p.kv_sequence_per_layer;

  // ---- per worker
  auto& w = p.worker;
  w.push_back({"weights", Pn * b, "params x dtype bytes"});
  w.push_back({"weight gradients (fp32)", Pn * 4.0, "params x 4"});
  if (s.optimizer.offload == Offload::kNone) {
    w.push_back({"AdamW moments (fp32)", Pn * 8.0, "params x 8 (m, v)"});
    if (b != 4.0) w.push_back({"master weights (fp32)", Pn * 4.0, "params x 4"});
  }
  w.push_back({m.recompute ? "activations (recompute)" : "activations",
               activations,
               m.recompute ? "layers x T x d x b + one layer's full set"
                           : "layers x T x (b (4d + 2H hd + 2K hd + mlp) + 4H + 8)"});
  // Ring buffers at the peak (backward): K/V block in flight and in use (2 x 2 T K hd b) plus
  // the travelling dK/dV accumulators, double-buffered, and the local ones (3 x 2 T K hd 4).
  const double kv_block = 2.0 * T * K * hd * b;
  const double dkv_block = 2.0 * T * K * hd * 4.0;
  if (P > 1)
    w.push_back({"ring buffers (K/V, dK/dV)", 2.0 * kv_block + 3.0 * dkv_block,
                 "2 x (2 T K hd b) + 3 x (2 T K hd 4)"});
  // fp32 accumulators of attention: output and lse being merged, dQ in the backward.
  w.push_back({"attention accumulators (fp32)", 2.0 * T * H * hd * 4.0 + T * H * 4.0,
               "2 T H hd 4 + T H 4"});
  w.push_back({"logits and their gradient (fp32)", 2.0 * T * V * 4.0, "2 T V 4"});
  p.worker_total = sum(w);

  // ---- per node host memory
  auto& hs = p.host;
  const double wpn = static_cast<double>(s.resources.workers_per_node);
  if (s.optimizer.offload == Offload::kCpu) {
    hs.push_back({"master weights (fp32)", Pn * 4.0, "params x 4"});
    hs.push_back({"AdamW moments (fp32)", Pn * 8.0, "params x 8"});
    hs.push_back({"node gradient (fp32, shared memory)", Pn * 4.0, "params x 4"});
    hs.push_back({"weights for workers (shared memory)", Pn * b, "params x b"});
    if (s.optimizer.compression == Compression::kTopk && s.optimizer.error_feedback)
      hs.push_back({"error-feedback residual (fp32)", Pn * 4.0, "params x 4"});
  }
  if (s.resources.backend == Backend::kCpu)
    hs.push_back({fmt::format("workers ({} x worker total)", s.resources.workers_per_node),
                  wpn * p.worker_total, "workers_per_node x worker total"});
  p.host_total = sum(hs);

  // ---- communication per step, per rank
  p.ring_bytes_per_hop = kv_block;
  if (P > 1) {
    const double Pm1 = static_cast<double>(P - 1);
    // Forward: P-1 K/V hops per layer. Backward: P-1 K/V hops plus P dK/dV hops (the last one
    // brings the accumulators home). Recompute replays the forward ring.
    double per_layer = Pm1 * kv_block + Pm1 * kv_block + static_cast<double>(P) * dkv_block;
    if (m.recompute) per_layer += Pm1 * kv_block;
    p.ring_bytes_per_step = L * per_layer;
  }
  const double nodes = static_cast<double>(s.resources.nodes);
  p.grad_payload_dense = Pn * 4.0;
  p.topk_k = static_cast<int64_t>(std::ceil(s.optimizer.density * Pn));
  p.grad_payload_topk = static_cast<double>(p.topk_k) * 8.0;  // u32 index + fp32 value
  p.grad_sent_dense_per_node = 2.0 * (nodes - 1.0) / nodes * p.grad_payload_dense;
  p.grad_sent_topk_per_node = (nodes - 1.0) * p.grad_payload_topk;

  // ---- fit
  p.host_capacity = s.resources.host_memory_gb * 1e9;
  p.fits_host = p.host_total <= p.host_capacity;
  if (s.resources.backend == Backend::kCuda) {
    for (const auto& g : gpu_models())
      if (g.type == s.resources.gpu_type) {
        p.device_name = g.name;
        p.device_capacity = g.capacity_bytes;
        p.device_usable = g.capacity_bytes - kGpuReserveBytes;
      }
    p.fits_device = p.worker_total <= p.device_usable;
  } else {
    p.device_name = "host";
    p.device_capacity = p.host_capacity;
    p.device_usable = p.host_capacity;
    p.fits_device = p.fits_host;  // workers are counted in host_total
  }
  return p;
}

namespace {

nlohmann::json items_json(const std::vector<Item>& items) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& i : items) a.push_back({{"name", i.name}, {"bytes", i.bytes},
                                           {"formula", i.formula}});
  return a;
}

}  // namespace

nlohmann::json to_json(const Plan& p, const JobSpec& s) {
  return {
      {"job", s.job.name},
      {"model",
       {{"params", p.params},
        {"params_per_layer", p.params_per_layer},
        {"params_embedding", p.params_embedding},
        {"layers", s.model.layers},
        {"d_model", s.model.d_model},
        {"heads", s.model.heads},
        {"kv_heads", s.resolved.kv_heads},
        {"head_dim", s.resolved.head_dim},
        {"mlp_hidden", s.resolved.mlp_hidden},
        {"dtype", spec::to_string(s.model.dtype)},
        {"recompute", s.model.recompute}}},
      {"sequence",
       {{"seq_len", s.data.seq_len},
        {"context_ranks", p.ranks},
        {"tokens_per_rank", p.tokens_per_rank},
        {"kv_bytes_per_layer", p.kv_sequence_per_layer},
        {"kv_bytes_total", p.kv_sequence_total}}},
      {"worker",
       {{"items", items_json(p.worker)},
        {"total_bytes", p.worker_total},
        {"activations_no_recompute_bytes", p.activations_no_recompute},
        {"activations_recompute_bytes", p.activations_recompute},
        {"kv_local_per_layer_bytes", p.kv_local_per_layer},
        {"kv_local_total_bytes", p.kv_local_total}}},
      {"host", {{"items", items_json(p.host)}, {"total_bytes", p.host_total}}},
      {"communication",
       {{"ring_bytes_per_hop", p.ring_bytes_per_hop},
        {"ring_bytes_per_step_per_rank", p.ring_bytes_per_step},
        {"grad_payload_dense_bytes", p.grad_payload_dense},
        {"grad_payload_topk_bytes", p.grad_payload_topk},
        {"topk_k", p.topk_k},
        {"grad_sent_dense_per_node_bytes", p.grad_sent_dense_per_node},
        {"grad_sent_topk_per_node_bytes", p.grad_sent_topk_per_node}}},
      {"fit",
       {{"device", p.device_name},
        {"device_capacity_bytes", p.device_capacity},
        {"device_usable_bytes", p.device_usable},
        {"fits_device", p.fits_device},
        {"host_capacity_bytes", p.host_capacity},
        {"fits_host", p.fits_host},
        {"fits", p.fits()}}},
  };
}

std::string to_text(const Plan& p, const JobSpec& s) {
  std::string o;
  auto line = [&](const std::string& name, double bytes, const std::string& note = "") {
    o += fmt::format("  {:<40} {:>12}{}\n", name, human_bytes(bytes),
                     note.empty() ? "" : "   " + note);
  };
  o += fmt::format("plan for job '{}'\n\n", s.job.name);
  o += fmt::format(
      "model: {} params ({} layers, d_model {}, heads {}/{} kv, head_dim {}, {} "
      "hidden {}, vocab {}), {}\n",
      human_count(static_cast<double>(p.params)), s.model.layers, s.model.d_model, s.model.heads,
      s.resolved.kv_heads, s.resolved.head_dim, spec::to_string(s.model.mlp), s.resolved.mlp_hidden,
      s.model.vocab, spec::to_string(s.model.dtype));
  o += fmt::format("sequence: {} tokens over {} ranks ({}): {} tokens per rank; {} x {} nodes "
                   "= {} workers, {} replica(s)\n\n",
                   s.data.seq_len, p.ranks, spec::to_string(s.parallel.causal_balance),
                   p.tokens_per_rank, s.resources.workers_per_node, s.resources.nodes,
                   s.resolved.total_workers, s.parallel.data_replicas);
  o += fmt::format("memory per worker ({}):\n",
                   s.resources.backend == Backend::kCuda ? "GPU" : "host");
  for (const auto& i : p.worker) line(i.name, i.bytes);
  line("total", p.worker_total);
  o += fmt::format("  (activations: {} without recompute, {} with recompute)\n",
                   human_bytes(p.activations_no_recompute),
                   human_bytes(p.activations_recompute));
  o += "\nK/V (K+V, storage dtype):\n";
  line("per layer, this rank", p.kv_local_per_layer);
  line("all layers, this rank", p.kv_local_total);
  line("per layer, whole sequence", p.kv_sequence_per_layer);
  line("all layers, whole sequence", p.kv_sequence_total);
  o += "\nhost memory per node:\n";
  if (p.host.empty()) o += "  (nothing: optimizer on the workers)\n";
  for (const auto& i : p.host) line(i.name, i.bytes);
  line("total", p.host_total);
  o += "\ncommunication per step:\n";
  line("ring K/V per hop (one layer)", p.ring_bytes_per_hop);
  line("ring sent per rank (fwd + bwd)", p.ring_bytes_per_step);
  line("node gradient, dense (fp32)", p.grad_payload_dense);
  line(fmt::format("node gradient, top-k {:g} (k={})", s.optimizer.density, p.topk_k),
       p.grad_payload_topk,
       p.grad_payload_topk > 0
           ? fmt::format("{:.0f}x smaller", p.grad_payload_dense / p.grad_payload_topk)
           : "");
  line("sent per node, dense all-reduce", p.grad_sent_dense_per_node);
  line("sent per node, top-k all-gather", p.grad_sent_topk_per_node);
  o += "\nfit:\n";
  if (s.resources.backend == Backend::kCuda) {
    o += fmt::format("  GPU {}: {} needed, {} usable ({} less {} reserve): {}\n", p.device_name,
                     human_bytes(p.worker_total), human_bytes(p.device_usable),
                     human_bytes(p.device_capacity), human_bytes(kGpuReserveBytes),
                     p.fits_device ? "fits" : "DOES NOT FIT");
  }
  o += fmt::format("  host: {} needed per node, {} given (resources.host_memory_gb): {}\n",
                   human_bytes(p.host_total), human_bytes(p.host_capacity),
                   p.fits_host ? "fits" : "DOES NOT FIT");
  o += fmt::format("  verdict: {}\n", p.fits() ? "fits" : "does not fit");
  return o;
}

}  // namespace ring::plan
