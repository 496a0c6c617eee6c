#include "sim/simulate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/plan/plan.h"
#include "common/trace/chrome_trace.h"
#include "fmt/format.h"
#include "sim/engine.h"
#include "sim/step_graph.h"
#include "sim/step_plan.h"
#include "sim/step_summary.h"

namespace ring::sim {

double ring_allreduce_time(int64_t n, double bytes, double alpha, double bw) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * (alpha + bytes / static_cast<double>(n) / bw);
}
double ring_allgather_time(int64_t n, double per, double alpha, double bw) {
  if (n <= 1) return 0;
  return (n - 1) * (alpha + per / bw);
}
double ring_reduce_scatter_time(int64_t n, double bytes, double alpha, double bw) {
  if (n <= 1) return 0;
  return (n - 1) * (alpha + bytes / static_cast<double>(n) / bw);
}

int add_ring_collective(Engine& e, const std::vector<int>& routes, int64_t steps, double chunk,
                        int after, int phase, int track_base) {
  const int n = static_cast<int>(routes.size());
  const int done = e.join(track_base, phase);
  if (n <= 1 || steps <= 0) {
    e.depend(done, after);
    return done;
  }
  std::vector<int> ready(n, -1), flows(n, -1);
  for (int k = 0; k < n; ++k) {
    ready[k] = e.join(track_base + k, phase);
    e.depend(ready[k], after);
  }
  for (int64_t j = 0; j < steps; ++j) {
    for (int k = 0; k < n; ++k) {
      flows[k] = e.flow(routes[k], chunk, track_base + k, phase, -1, static_cast<int>(j));
      e.depend(flows[k], ready[k]);
    }
    for (int k = 0; k < n; ++k) {
      const int r = e.join(track_base + k, phase);
      e.depend(r, flows[k]);                  // own send
      e.depend(r, flows[(k + n - 1) % n]);    // receive from the previous participant
      ready[k] = r;
    }
  }
  for (int k = 0; k < n; ++k) e.depend(done, ready[k]);
  return done;
}

namespace {

using detail::Placement;

// One simulation at the spec's depth: the stages of sim/step_plan.h, the step graph
// (sim/step_graph.h), its run and summary (sim/step_summary.h). With fold_budget > 0 and a task
// graph larger than it, returns early with *per_layer_tasks set and res.tasks = -1. The
// placement is computed once into *cache and reused (folding simulates other depths).
SimResult simulate_once(const spec::JobSpec& spec, const SimOptions& o, int64_t fold_budget,
                        double* per_layer_tasks_out, Placement* cache) {
  SimResult res;
  const Workload w = make_workload(spec);
  const int64_t P = w.P, D = w.D, N = w.nodes, wpn = w.workers_per_node, W = P * D;
  const int64_t L = w.layers;
  if (W != N * wpn)
    throw std::invalid_argument(fmt::format(
        "simulate: context_ranks {} x data_replicas {} = {} ranks but {} node(s) x {} workers",
        P, D, W, N, wpn));
  const std::unique_ptr<Cluster> cl = detail::build_cluster(w, o, &res);

  // Placement: global rank -> (node, local GPU).
  Placement placement;
  if (cache && !cache->slot.empty()) {
    placement = *cache;
  } else {
    placement = detail::place_ranks(spec, o, w, *cl);
    if (cache) *cache = placement;
  }
  const std::vector<std::pair<int, int>>& slot = placement.slot;
  res.ring_order = placement.ring_order;
  if (D == 1 && wpn == 1)
    for (int64_t c = 0; c < P; ++c) res.ring_nodes.push_back(slot[c].first);

  const detail::WhatIfs what_ifs = detail::apply_what_ifs(o, w, *cl, &res);
  const detail::RingTraffic traffic = detail::solve_ring_traffic(w, *cl, slot, what_ifs.cap);

  // Which ranks to simulate, and whether the graph fits.
  detail::Simulated sim = detail::choose_simulated(w, o, *cl, what_ifs, traffic);
  res.simulated_positions = sim.S;
  if (per_layer_tasks_out) *per_layer_tasks_out = sim.per_layer;
  if (o.keep_trace && sim.per_layer * static_cast<double>(L) > 3e6)
    throw std::invalid_argument(fmt::format(
        "--trace: the step has about {:.3g} M tasks, too many for a readable trace (at most 3 M); "
        "trace fewer layers or nodes (--set model.layers=N, --nodes N)",
        sim.per_layer * static_cast<double>(L) / 1e6));
  if (fold_budget > 0 && sim.per_layer * static_cast<double>(L) > static_cast<double>(fold_budget)) {
    res.tasks = -1;
    return res;
  }
  res.mode = sim.full ? fmt::format("full: all {} ranks, flows on the real links", W)
             : sim.slots > 1
                 ? fmt::format("reduced: {} of the {} positions of each of the {} head-slot rings "
                               "{}..{} ({} ranks, whole head groups) stand for all {} ranks "
                               "(symmetry found by one max-min solve of the whole job's traffic)",
                               sim.period, P, sim.slots, sim.ring / sim.slots * sim.slots,
                               sim.ring / sim.slots * sim.slots + sim.slots - 1, sim.S, W)
                 : fmt::format("reduced: {} of ring {}'s {} positions stand for all {} ranks "
                               "(symmetry found by one max-min solve of the whole job's traffic)",
                               sim.S, sim.ring, P, W);
  detail::index_positions(w, &sim);

  const detail::EngineNetwork net =
      detail::engine_network(w, *cl, slot, traffic, sim, what_ifs.cap);
  detail::StepGraph g(spec, w, o.rates, *cl, slot, what_ifs, traffic, sim, net, &res.notes);
  g.build();
  const double end = g.engine().run();
  detail::summarize(g, w, sim, o.keep_trace, end, &res);
  return res;
}

}  // namespace


namespace {

// FLOPs, the compute-only step's companions and MFU (SimResult's accounting).
void account(const spec::JobSpec& spec, const SimOptions& o, SimResult* r) {
  const plan::StepFlops f = plan::step_flops(spec, plan::make_plan(spec).params);
  r->dtype = spec::to_string(spec.model.dtype);
  r->model_flops_per_step = f.model_per_step;
  r->hardware_flops_per_step = f.hardware_per_step;
  r->rates = o.rates;
  r->peak_flops_per_gpu = o.rates.peak_flops(spec.model.dtype != spec::DType::kFp32);
  const double denom = r->step_s * static_cast<double>(r->ranks) * r->peak_flops_per_gpu;
  r->mfu = denom > 0 ? f.model_per_step / denom : 0.0;
  if (spec.model.dtype == spec::DType::kFp32 && o.rates.peak_bf16_flops != o.rates.peak_fp32_flops)
    r->notes.push_back("model.dtype fp32: the kernel rates are bf16's, the MFU's peak is the "
                       "device's dense TF32 peak");
}

SimResult simulate_folded(const spec::JobSpec& spec, const SimOptions& o);

}  // namespace

SimResult simulate(const spec::JobSpec& spec, const SimOptions& o) {
  SimResult r = simulate_folded(spec, o);
  account(spec, o, &r);
  return r;
}

namespace {

SimResult simulate_folded(const spec::JobSpec& spec, const SimOptions& o) {
  double per_layer = 0;
  Placement placement;
  SimResult r = simulate_once(spec, o, o.fold_task_budget, &per_layer, &placement);
  if (r.tasks >= 0) return r;
  // Too deep to build at once: every layer is the same, so simulate two depths L1 < L2 that
  // fit and extend linearly in the layer count (the step's increment per layer).
  const int64_t L = spec.model.layers;
  const int64_t l2 = std::clamp<int64_t>(
      static_cast<int64_t>(static_cast<double>(o.fold_task_budget) / std::max(1.0, per_layer)), 2, L);
  const int64_t l1 = l2 - 1;
  if (o.keep_trace && l2 < L) throw std::invalid_argument(fmt::format(
      "simulate: --trace needs the whole task graph, {:.0f} tasks for {} layers, more than the "
      "budget of {}: trace a spec with fewer layers (--set model.layers=N)", per_layer * L, L, o.fold_task_budget));
  auto at = [&](int64_t layers) {
    spec::JobSpec s = spec;
    s.model.layers = layers;
    return simulate_once(s, o, 0, nullptr, &placement);
  };
  SimResult a = at(l1), b = at(l2);
  const double k = static_cast<double>(L - l2);
  auto ext = [&](double va, double vb) { return vb + k * (vb - va); };
  SimResult out = b;
  out.step_s = ext(a.step_s, b.step_s);
  out.forward_s = ext(a.forward_s, b.forward_s);
  out.backward_s = ext(a.backward_s, b.backward_s);
  out.attention_compute_s = ext(a.attention_compute_s, b.attention_compute_s);
  out.projection_compute_s = ext(a.projection_compute_s, b.projection_compute_s);
  out.compute_only_step_s = ext(a.compute_only_step_s, b.compute_only_step_s);
  out.ring_bytes_per_rank = ext(a.ring_bytes_per_rank, b.ring_bytes_per_rank);
  out.ring_comm_s = ext(a.ring_comm_s, b.ring_comm_s);
  out.ring_exposed_s = ext(a.ring_exposed_s, b.ring_exposed_s);
  out.hidden_share = out.ring_comm_s > 0 ? std::clamp(1.0 - out.ring_exposed_s / out.ring_comm_s, 0.0, 1.0) : 1.0;
  out.a2a_count = static_cast<int64_t>(std::llround(ext(static_cast<double>(a.a2a_count), static_cast<double>(b.a2a_count))));
  out.a2a_bytes_per_rank = ext(a.a2a_bytes_per_rank, b.a2a_bytes_per_rank);
  out.a2a_s = ext(a.a2a_s, b.a2a_s);
  out.a2a_exposed_s = ext(a.a2a_exposed_s, b.a2a_exposed_s);
  out.exchange_s = ext(a.exchange_s, b.exchange_s);
  out.exchange_exposed_s = ext(a.exchange_exposed_s, b.exchange_exposed_s);
  out.optimizer_s = ext(a.optimizer_s, b.optimizer_s);
  out.optimizer_exposed_s = ext(a.optimizer_exposed_s, b.optimizer_exposed_s);
  out.checkpoint_amortised_s = ext(a.checkpoint_amortised_s, b.checkpoint_amortised_s);
  out.shard_gathered_bytes = ext(a.shard_gathered_bytes, b.shard_gathered_bytes);
  out.shard_scattered_bytes = ext(a.shard_scattered_bytes, b.shard_scattered_bytes);
  out.shard_gather_s = ext(a.shard_gather_s, b.shard_gather_s);
  out.shard_gather_exposed_s = ext(a.shard_gather_exposed_s, b.shard_gather_exposed_s);
  out.shard_scatter_s = ext(a.shard_scatter_s, b.shard_scatter_s);
  out.shard_scatter_exposed_s = ext(a.shard_scatter_exposed_s, b.shard_scatter_exposed_s);
  out.shard_gathers = static_cast<int64_t>(std::llround(ext(static_cast<double>(a.shard_gathers), static_cast<double>(b.shard_gathers))));
  out.shard_scatters = static_cast<int64_t>(std::llround(ext(static_cast<double>(a.shard_scatters), static_cast<double>(b.shard_scatters))));
  {
    const double total = out.shard_gather_s + out.shard_scatter_s;
    out.shard_hidden_share = total > 0 ? std::clamp(1.0 - (out.shard_gather_exposed_s + out.shard_scatter_exposed_s) / total, 0.0, 1.0) : 1.0;
  }
  for (HopStats* h : {&out.hop_forward, &out.hop_backward_kv, &out.hop_dkv}) {
    const HopStats& ha = h == &out.hop_forward ? a.hop_forward : h == &out.hop_backward_kv ? a.hop_backward_kv : a.hop_dkv;
    h->count = static_cast<int64_t>(std::llround(ext(static_cast<double>(ha.count), static_cast<double>(h->count))));
  }
  for (auto& p : out.critical_path) {
    double va = 0;
    for (const auto& q : a.critical_path)
      if (q.name == p.name) va = q.seconds;
    p.seconds = std::max(0.0, ext(va, p.seconds));
  }
  std::sort(out.critical_path.begin(), out.critical_path.end(),
            [](const PhaseTime& x, const PhaseTime& y) { return x.seconds > y.seconds; });
  // Layers beyond the simulated depth take the inner layers' times.
  const double f_mid = b.layer_forward_s[l2 / 2], b_mid = b.layer_backward_s[l2 / 2];
  out.layer_forward_s.assign(L, f_mid);
  out.layer_backward_s.assign(L, b_mid);
  out.layer_forward_s.front() = b.layer_forward_s.front();
  out.layer_backward_s.front() = b.layer_backward_s.front();
  out.layer_forward_s.back() = b.layer_forward_s.back();
  out.layer_backward_s.back() = b.layer_backward_s.back();
  out.tokens_per_s = b.tokens_per_s * b.step_s / out.step_s;
  out.tasks = a.tasks + b.tasks;
  out.events = a.events + b.events;
  out.mode += fmt::format("; layers folded: {} and {} of {} layers simulated, the step extended "
                          "linearly ({:.4g} s per layer)", l1, l2, L, b.step_s - a.step_s);
  return out;
}

}  // namespace

namespace {

// Exposed communication per step, by kind: seconds and share of the step.
std::vector<PhaseTime> exposed(const SimResult& r) {
  const double M = static_cast<double>(r.micro_batches);
  std::vector<PhaseTime> v = {{"ring", r.ring_exposed_s * M}};
  if (r.head_ranks > 1) v.push_back({"head_all_to_all", r.a2a_exposed_s * M});
  if (r.shard_full) {
    v.push_back({"shard_gather", r.shard_gather_exposed_s});
    v.push_back({"shard_reduce_scatter", r.shard_scatter_exposed_s});
  }
  v.push_back({"gradient_exchange", r.exchange_exposed_s});
  v.push_back({"optimizer", r.optimizer_exposed_s});
  return v;
}

nlohmann::json exposed_json(const SimResult& r) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& p : exposed(r))
    j[p.name] = {{"seconds", p.seconds}, {"share", r.step_s > 0 ? p.seconds / r.step_s : 0.0}};
  return j;
}

nlohmann::json kernel_efficiency_json(const Rates& q) {
  auto k = [](const Rates::Efficiency& e, double flops) {
    return nlohmann::json{{"fraction_of_peak", e.fraction}, {"flops", flops}, {"source", e.source}};
  };
  return {{"gemm", k(q.gemm_eff, q.gemm_flops)},
          {"attention_forward", k(q.attention_fwd_eff, q.attention_fwd_flops)},
          {"attention_backward", k(q.attention_bwd_eff, q.attention_bwd_flops)},
          {"optimizer", {{"params_per_s_per_node", q.adamw_params_per_s}, {"source", q.optimizer_source}}}};
}

}  // namespace

nlohmann::json to_json(const SimResult& r) {
  auto hop = [](const HopStats& h) {
    return nlohmann::json{{"count", h.count}, {"bytes", h.bytes}, {"mean_s", h.mean_s},
                          {"min_s", h.min_s}, {"max_s", h.max_s},
                          {"posted_mean_s", h.posted_mean_s}, {"posted_median_s", h.posted_median_s}};
  };
  nlohmann::json cp = nlohmann::json::array();
  for (const auto& p : r.critical_path) cp.push_back({{"phase", p.name}, {"seconds", p.seconds}});
  return {
      {"cluster", r.cluster},
      {"rates", r.rates_source},
      {"mode", r.mode},
      {"ring_order", r.ring_order},
      {"ring_nodes", r.ring_nodes},
      {"ranks", r.ranks},
      {"ring_size", r.ring_size},
      {"rings", r.rings},
      {"head_ranks", r.head_ranks},
      {"head_groups", r.head_ranks > 1 ? nlohmann::json{
           {"head_ranks", r.head_ranks}, {"ring_groups", r.ring_size},
           {"all_to_alls", r.a2a_count}, {"bytes_per_rank", r.a2a_bytes_per_rank},
           {"all_to_all_s", r.a2a_s}, {"all_to_all_exposed_s", r.a2a_exposed_s},
           {"ring_exposed_s", r.ring_exposed_s}} : nlohmann::json(nullptr)},
      {"nodes", r.nodes},
      {"simulated_positions", r.simulated_positions},
      {"tasks", r.tasks},
      {"events", r.events},
      {"step_s", r.step_s},
      {"tokens_per_s", r.tokens_per_s},
      {"forward_s", r.forward_s},
      {"head_s", r.head_s},
      {"backward_s", r.backward_s},
      {"layer_forward_s", r.layer_forward_s},
      {"layer_backward_s", r.layer_backward_s},
      {"attention_compute_s", r.attention_compute_s},
      {"projection_compute_s", r.projection_compute_s},
      {"hops", {{"forward", hop(r.hop_forward)}, {"backward_kv", hop(r.hop_backward_kv)}, {"dkv", hop(r.hop_dkv)}}},
      {"hop_layer0_forward_s", r.hop_layer0_forward_s},
      {"ring_bytes_per_rank", r.ring_bytes_per_rank},
      {"effective_ring_bw_bytes_per_s", r.effective_ring_bw},
      {"bottleneck_ring_bw_bytes_per_s", r.bottleneck_ring_bw},
      {"ring_comm_s", r.ring_comm_s},
      {"ring_exposed_s", r.ring_exposed_s},
      {"hidden_share", r.hidden_share},
      {"exchange_s", r.exchange_s},
      {"exchange_exposed_s", r.exchange_exposed_s},
      {"optimizer_s", r.optimizer_s},
      {"optimizer_exposed_s", r.optimizer_exposed_s},
      {"checkpoint_amortised_s", r.checkpoint_amortised_s},
      {"checkpoint_hidden", r.checkpoint_hidden},
      {"shard_full", r.shard_full ? nlohmann::json{
           {"gathers", r.shard_gathers}, {"reduce_scatters", r.shard_scatters},
           {"gathered_bytes_per_rank", r.shard_gathered_bytes},
           {"scattered_bytes_per_rank", r.shard_scattered_bytes},
           {"gather_s", r.shard_gather_s}, {"gather_exposed_s", r.shard_gather_exposed_s},
           {"reduce_scatter_s", r.shard_scatter_s},
           {"reduce_scatter_exposed_s", r.shard_scatter_exposed_s},
           {"hidden_share", r.shard_hidden_share}} : nlohmann::json(nullptr)},
      {"critical_path", cp},
      {"dtype", r.dtype},
      {"model_flops_per_step", r.model_flops_per_step},
      {"hardware_flops_per_step", r.hardware_flops_per_step},
      {"compute_only_step_s", r.compute_only_step_s},
      {"peak_flops_per_gpu", r.peak_flops_per_gpu},
      {"peak_source", r.rates.peak_source},
      {"mfu", r.mfu},
      {"kernel_efficiency", kernel_efficiency_json(r.rates)},
      {"exposed", exposed_json(r)},
      {"notes", r.notes},
  };
}

namespace {
std::string secs(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} us", s * 1e6);
}
}  // namespace

std::string to_text(const SimResult& r) {
  std::string o;
  auto line = [&](const std::string& k, const std::string& v) { o += fmt::format("  {:<34} {}\n", k, v); };
  o += fmt::format("cluster   {}\n", r.cluster);
  o += fmt::format("rates     {}\n", r.rates_source);
  if (r.head_ranks > 1)
    o += fmt::format("job       {} ranks: two levels, head groups of U = {} inside a node, {} ring(s) "
                     "(one per head slot) over R = {} groups, on {} node(s), ring order {}\n",
                     r.ranks, r.head_ranks, r.rings, r.ring_size, r.nodes, r.ring_order);
  else
    o += fmt::format("job       {} ranks: {} ring(s) of {} on {} node(s), ring order {}\n", r.ranks,
                     r.rings, r.ring_size, r.nodes, r.ring_order);
  o += fmt::format("simulated {} ({} tasks, {} events)\n\n", r.mode, r.tasks, r.events);
  o += fmt::format("step      {}   ({:.0f} tokens/s)\n", secs(r.step_s), r.tokens_per_s);
  line("forward (all layers)", secs(r.forward_s));
  line("LM head fwd+bwd", secs(r.head_s));
  line("backward (all layers)", secs(r.backward_s));
  if (!r.layer_forward_s.empty()) {
    auto mm = [](const std::vector<double>& v) {
      auto [a, b] = std::minmax_element(v.begin(), v.end());
      return std::make_pair(*a, *b);
    };
    auto [f0, f1] = mm(r.layer_forward_s);
    auto [b0, b1] = mm(r.layer_backward_s);
    line("per layer forward", f0 == f1 ? secs(f0) : secs(f0) + " .. " + secs(f1));
    line("per layer backward", b0 == b1 ? secs(b0) : secs(b0) + " .. " + secs(b1));
  }
  line("attention compute (per rank)", secs(r.attention_compute_s));
  line("projections+MLP (per rank)", secs(r.projection_compute_s));
  auto hop = [&](const char* name, const HopStats& h) {
    if (h.count == 0) return;
    line(name, fmt::format("{} hops of up to {}, mean {} (min {}, max {})", h.count,
                           plan::human_bytes(h.bytes), secs(h.mean_s), secs(h.min_s), secs(h.max_s)));
  };
  hop("ring K/V hop (forward)", r.hop_forward);
  hop("ring K/V hop (backward)", r.hop_backward_kv);
  hop("ring dK/dV hop", r.hop_dkv);
  line("ring bytes sent per rank", plan::human_bytes(r.ring_bytes_per_rank));
  line("effective ring bandwidth", fmt::format("{:.2f} GB/s (mean hop; slowest hop {:.2f} GB/s)",
                                               r.effective_ring_bw / 1e9, r.bottleneck_ring_bw / 1e9));
  line("ring communication", fmt::format("{} ({} exposed, {:.1f} % hidden behind compute)",
                                         secs(r.ring_comm_s), secs(r.ring_exposed_s), 100 * r.hidden_share));
  if (r.head_ranks > 1)
    line("head all-to-all (inside the node)",
         fmt::format("{} of {} sent per rank, {} ({} exposed; ring {} exposed)", r.a2a_count,
                     plan::human_bytes(r.a2a_bytes_per_rank), secs(r.a2a_s), secs(r.a2a_exposed_s),
                     secs(r.ring_exposed_s)));
  if (r.shard_full) {
    line("shard full: block all-gathers", fmt::format("{} of {} received, {} in flight, {} exposed", r.shard_gathers,
                                                        plan::human_bytes(r.shard_gathered_bytes), secs(r.shard_gather_s),
                                                        secs(r.shard_gather_exposed_s)));
    line("shard full: reduce-scatters", fmt::format("{} of {} sent, {} in flight, {} exposed", r.shard_scatters,
                                                      plan::human_bytes(r.shard_scattered_bytes), secs(r.shard_scatter_s),
                                                      secs(r.shard_scatter_exposed_s)));
    line("shard full: hidden behind compute", fmt::format("{:.1f} %", 100 * r.shard_hidden_share));
  }
  line("gradient exchange", fmt::format("{} ({} after the backward){}", secs(r.exchange_s), secs(r.exchange_exposed_s),
                                        r.shard_full ? " (none between nodes with shard full)" : ""));
  line("optimizer (host AdamW)", fmt::format("{} ({} exposed)", secs(r.optimizer_s), secs(r.optimizer_exposed_s)));
  line("checkpoint (amortised)", fmt::format("{}{}", secs(r.checkpoint_amortised_s), r.checkpoint_hidden ? " (async: hidden)" : ""));
  o += fmt::format("accounting ({}; peak {:.1f} TFLOP/s per GPU: {})\n", r.dtype,
                   r.peak_flops_per_gpu / 1e12, r.rates.peak_source);
  line("model FLOPs per step", fmt::format("{:.4g} (6 x params x N + 6 x layers x d_model x N^2 "
                                           "per sequence)", r.model_flops_per_step));
  line("hardware FLOPs per step", fmt::format("{:.4g} (recompute included)",
                                              r.hardware_flops_per_step));
  line("compute-only step", fmt::format("{} (busiest rank's kernels, nothing waiting; predicted "
                                        "step {:.2f}x)", secs(r.compute_only_step_s),
                                        r.compute_only_step_s > 0 ? r.step_s / r.compute_only_step_s : 0.0));
  line("predicted step", secs(r.step_s));
  line("MFU", fmt::format("{:.2f} % (model FLOPs / (step x {} GPUs x peak))", 100 * r.mfu, r.ranks));
  for (const auto& p : exposed(r))
    line("exposed: " + p.name, fmt::format("{} ({:.1f} % of the step)", secs(p.seconds),
                                           r.step_s > 0 ? 100 * p.seconds / r.step_s : 0.0));
  auto eff = [&](const char* name, const Rates::Efficiency& e, double flops) {
    line(name, fmt::format("{:.1f} TFLOP/s, {:.0f} % of peak bf16: {}", flops / 1e12, 100 * e.fraction, e.source));
  };
  o += "kernel efficiencies assumed\n";
  eff("GEMM (projections, MLP, head)", r.rates.gemm_eff, r.rates.gemm_flops);
  eff("attention forward", r.rates.attention_fwd_eff, r.rates.attention_fwd_flops);
  eff("attention backward", r.rates.attention_bwd_eff, r.rates.attention_bwd_flops);
  line("optimizer (host AdamW)", fmt::format("{:.3g} parameters/s per node: {}",
                                             r.rates.adamw_params_per_s, r.rates.optimizer_source));
  o += "critical path\n";
  for (const auto& p : r.critical_path)
    line(p.name, fmt::format("{} ({:.1f} %)", secs(p.seconds), 100 * p.seconds / r.step_s));
  for (const auto& n : r.notes) o += fmt::format("note: {}\n", n);
  return o;
}

void write_trace(const SimResult& r, const std::string& path) {
  trace::ChromeTrace t;
  t.process(1, "ranks (compute)");
  t.process(3, "ring sends (by sender); shard full: gathers (by receiver), reduce-scatters (by sender)");
  t.process(2, "ringd (exchange, optimizer)");
  for (const auto& e : r.trace) {
    nlohmann::json args = nlohmann::json::object();
    if (e.layer >= 0) args["layer"] = e.layer;
    if (e.step >= 0) args["step"] = e.step;
    if (e.bytes > 0) args["bytes"] = e.bytes;
    t.complete(e.name, e.pid, e.tid, e.start * 1e6, (e.end - e.start) * 1e6, std::move(args));
  }
  try {
    t.write(path);  // a per-user file: 0600, replaced whole, never through a symbolic link
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("cannot write the trace: {}", e.what()));
  }
}

}  // namespace ring::sim
