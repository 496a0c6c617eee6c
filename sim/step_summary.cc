#include "sim/step_summary.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "sim/engine.h"

namespace ring::sim::detail {

namespace {

// (from, to) seconds: transfers, compute; Waits: where position 0 waited, for the trace.
using Intervals = std::vector<std::array<double, 2>>;
using Waits = Intervals;

// The step, its tokens per second, and the representative rank's per-layer times.
void step_times(const Engine& e, const StepRecords& rec, const Workload& w, double end,
                SimResult* res) {
  res->tasks = e.task_count();
  res->events = e.events();
  res->step_s = end;
  res->tokens_per_s = static_cast<double>(w.seq_len * w.replicas * w.micro_batches) / end;
  for (int64_t l = 0; l < w.layers; ++l) {
    res->layer_forward_s.push_back(e.task(rec.layer_fwd_end[l]).end - e.task(rec.layer_fwd_begin[l]).start);
    res->layer_backward_s.push_back(e.task(rec.layer_bwd_end[l]).end - e.task(rec.layer_bwd_begin[l]).start);
  }
  res->forward_s = e.task(rec.fwd_end0).end - e.task(rec.layer_fwd_begin[0]).start;
  res->head_s = e.task(rec.head_task0).end - e.task(rec.head_task0).start;
  res->backward_s = e.task(rec.backward_done).end - e.task(rec.head_task0).end;
}

// Position 0's hops as the worker's timeline records them: from the sender's post to delivery.
void posted_times(const Engine& e, const std::vector<std::pair<int, int>>& v, HopStats* h) {
  if (v.empty()) return;
  std::vector<double> d;
  d.reserve(v.size());
  for (const auto& [f, p] : v) d.push_back(e.task(f).end - e.task(p).end);
  double sum = 0;
  for (double x : d) sum += x;
  h->posted_mean_s = sum / static_cast<double>(d.size());
  std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
  h->posted_median_s = d[d.size() / 2];
}

// Hops (every flow of a phase), the representative rank's compute and ring bytes.
void hop_and_compute(const Engine& e, const StepRecords& rec, const Workload& w, SimResult* res) {
  struct Acc {
    int64_t n = 0;
    double sum = 0, mn = std::numeric_limits<double>::infinity(), mx = 0, bytes = 0;
  } acc[kPhaseCount];
  double attn0 = 0, proj0 = 0, ring_bytes0 = 0;
  for (int id = 0; id < e.task_count(); ++id) {
    const Task& t = e.task(id);
    const double dur = t.end - t.start;
    if (t.kind == TaskKind::kFlow) {
      Acc& a = acc[t.phase];
      ++a.n;
      a.sum += dur;
      a.mn = std::min(a.mn, dur);
      a.mx = std::max(a.mx, dur);
      a.bytes = std::max(a.bytes, t.bytes);
      if (t.track == 0 && (t.phase == kHopFwd || t.phase == kHopBwdKv || t.phase == kHopDkv || t.phase == kHopRecompute))
        ring_bytes0 += t.bytes;
      if (t.track == 0 && t.phase == kHopFwd && t.layer == 0 && rec.layer_fwd_begin[0] >= 0 &&
          t.start >= e.task(rec.layer_fwd_begin[0]).start)
        res->hop_layer0_forward_s.push_back(dur);
    } else if (t.kind == TaskKind::kCompute && t.track == 0 && t.device == 0) {
      if (t.phase == kAttnFwd || t.phase == kAttnBwd || t.phase == kAttnRecompute) attn0 += dur;
      if (t.phase == kProjFwd || t.phase == kProjBwd || t.phase == kProjRecompute || t.phase == kHead) proj0 += dur;
    }
  }
  auto hop = [&acc](int ph) {
    HopStats h;
    const Acc& a = acc[ph];
    h.count = a.n;
    h.bytes = a.bytes;
    if (a.n) h.mean_s = a.sum / a.n, h.min_s = a.mn, h.max_s = a.mx;
    return h;
  };
  res->hop_forward = hop(kHopFwd);
  res->hop_backward_kv = hop(kHopBwdKv);
  posted_times(e, rec.posted_fwd, &res->hop_forward);
  posted_times(e, rec.posted_bwd, &res->hop_backward_kv);
  res->hop_dkv = hop(kHopDkv);
  posted_times(e, rec.posted_dkv, &res->hop_dkv);
  res->attention_compute_s = attn0;
  res->projection_compute_s = proj0;
  res->ring_bytes_per_rank = ring_bytes0 / static_cast<double>(w.micro_batches);
  if (res->hop_forward.mean_s > 0) res->effective_ring_bw = w.kv_block_bytes / res->hop_forward.mean_s;
  if (res->hop_forward.max_s > 0) res->bottleneck_ring_bw = w.kv_block_bytes / res->hop_forward.max_s;
}

// Sorted, disjoint: the union of `v`.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (iv[1] <= iv[0]) continue;
    if (!out.empty() && iv[0] <= out.back()[1])
      out.back()[1] = std::max(out.back()[1], iv[1]);
    else
      out.push_back(iv);
  }
  return out;
}

double length(const Intervals& v) {
  double s = 0;
  for (const auto& iv : v) s += iv[1] - iv[0];
  return s;
}

// The length of the intersection of two unions (each sorted and disjoint).
double overlap(const Intervals& a, const Intervals& b) {
  double s = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    s += std::max(0.0, std::min(a[i][1], b[j][1]) - std::max(a[i][0], b[j][0]));
    if (a[i][1] < b[j][1])
      ++i;
    else
      ++j;
  }
  return s;
}

// Ring communication of the representative rank (position 0): the time some ring transfer it
// sends or receives is in flight, each from its post (as the worker's timeline records a send or
// receive: waiting for the other side included) to its completion; the union of those
// intervals, so a transfer that outlasts its ring step counts once and the last accumulator's
// trip home counts. Hidden: the part of that time the rank computes (any compute task on its
// device), never more than either; exposed: the rest. Per micro-batch.
void ring_hidden(const Engine& e, const StepRecords& rec, const Workload& w, SimResult* res) {
  Intervals transfers, compute;
  transfers.reserve(rec.ring_ops0.size());
  for (const auto& [posted, f] : rec.ring_ops0)
    transfers.push_back({std::min(e.task(posted).end, e.task(f).start), e.task(f).end});
  for (int id = 0; id < e.task_count(); ++id) {
    const Task& t = e.task(id);
    if (t.kind == TaskKind::kCompute && t.device == 0) compute.push_back({t.start, t.end});
  }
  const Intervals comm = merged(std::move(transfers));
  const double M = static_cast<double>(w.micro_batches);
  res->ring_comm_s = length(comm) / M;
  const double hidden = overlap(comm, merged(std::move(compute))) / M;
  res->ring_exposed_s = std::max(0.0, res->ring_comm_s - hidden);
  res->hidden_share = res->ring_comm_s > 0 ? std::clamp(hidden / res->ring_comm_s, 0.0, 1.0) : 1.0;
  // head_ranks > 1: the all-to-alls inside the group, the same way (the rank waits for them, so
  // nothing of them is behind its own compute unless its compute is late).
  if (rec.a2a_ops0.empty()) return;
  Intervals a2a, comp;
  for (const auto& [posted, done] : rec.a2a_ops0) a2a.push_back({e.task(posted).end, e.task(done).end});
  for (int id = 0; id < e.task_count(); ++id) {
    const Task& t = e.task(id);
    if (t.kind == TaskKind::kCompute && t.device == 0) comp.push_back({t.start, t.end});
  }
  const Intervals a2a_u = merged(std::move(a2a));
  res->a2a_count = static_cast<int64_t>(rec.a2a_ops0.size()) / w.micro_batches;
  res->a2a_bytes_per_rank = rec.a2a_bytes0 / M;
  res->a2a_s = length(a2a_u) / M;
  res->a2a_exposed_s = std::max(0.0, res->a2a_s - overlap(a2a_u, merged(std::move(comp))) / M);
}

// ringd: the exchange (its time, and what of it outlasts the backward), optimizer, checkpoint.
void ringd_times(const Engine& e, const StepRecords& rec, const Workload& w, SimResult* res) {
  const std::vector<int>& x_tasks = rec.x_tasks;
  const std::vector<int>& bucket_ready = rec.bucket_ready;
  double x_last = 0;
  for (size_t b = 0; b < x_tasks.size(); ++b) x_last = std::max(x_last, e.task(x_tasks[b]).end);
  const double bwd_end = e.task(rec.backward_done).end;
  double x_total = 0;
  for (size_t b = 0; b < x_tasks.size(); ++b) x_total += e.task(x_tasks[b]).end - std::max(e.task(bucket_ready[b]).end, b ? e.task(x_tasks[b - 1]).end : 0.0);
  res->exchange_s = x_total;
  res->exchange_exposed_s = std::max(0.0, x_last - bwd_end);
  res->optimizer_s = rec.opt_total;
  res->optimizer_exposed_s = std::max(0.0, e.task(rec.last_opt).end - std::max(x_last, bwd_end));
  res->checkpoint_amortised_s = rec.ckpt;
  res->checkpoint_hidden = w.checkpoint_async;
}

// Shard full at position 0, the whole step; where it waited for a gather or blocked finishing a
// reduce-scatter goes to *gather_waits / *scatter_waits.
void shard_times(const Engine& e, const StepRecords& rec, const Workload& w, bool full,
                 SimResult* res, Waits* gather_waits, Waits* scatter_waits) {
  const plan::FullShardLayout& fs = w.full_shard;
  const double M = static_cast<double>(w.micro_batches);
  res->shard_full = true;
  res->shard_gathers = static_cast<int64_t>(rec.gather_rec.size());
  res->shard_scatters = static_cast<int64_t>(rec.scatter_rec.size());
  // Position 0's world rank (reduced, the flows place every bucket on its node instead).
  const double g0 = fs.gathered_bytes(rec.world_rank0), s0 = fs.scattered_bytes(rec.world_rank0);
  res->shard_gathered_bytes = full ? rec.shard_gathered0 : g0 * M;
  res->shard_scattered_bytes = full ? rec.shard_scattered0 : s0 * M;
  for (const auto& [post, done, arrived] : rec.gather_rec) {
    const double t_done = e.task(done).end, t_in = arrived >= 0 ? e.task(arrived).end : 0.0;
    res->shard_gather_s += t_done - e.task(post).end;
    if (t_done > t_in) res->shard_gather_exposed_s += t_done - t_in, gather_waits->push_back({t_in, t_done});
  }
  for (const auto& [start, xfer, enter] : rec.scatter_rec) {
    const double t_done = e.task(xfer).end, t_in = e.task(enter).end;
    res->shard_scatter_s += t_done - e.task(start).end;
    if (t_done > t_in) res->shard_scatter_exposed_s += t_done - t_in, scatter_waits->push_back({t_in, t_done});
  }
  const double total = res->shard_gather_s + res->shard_scatter_s;
  res->shard_hidden_share =
      total > 0 ? std::clamp(1.0 - (res->shard_gather_exposed_s + res->shard_scatter_exposed_s) / total, 0.0, 1.0) : 1.0;
}

// The compute-only step: each simulated rank's kernels (its compute tasks, whole step) back to
// back, nothing waiting; the busiest rank's sum.
void compute_only(const StepGraph& g, SimResult* res) {
  const Engine& e = g.engine();
  std::vector<double> busy;
  for (int id = 0; id < e.task_count(); ++id) {
    const Task& t = e.task(id);
    if (t.kind != TaskKind::kCompute || t.track >= g.track_ringd() || t.device < 0) continue;
    if (static_cast<size_t>(t.device) >= busy.size()) busy.resize(t.device + 1, 0.0);
    busy[t.device] += t.duration;  // its own time: on a shared host, without the sharing
  }
  res->compute_only_step_s = busy.empty() ? 0.0 : *std::max_element(busy.begin(), busy.end());
}

// Critical path: from the last task back through what let each task start.
void critical_path(const Engine& e, SimResult* res) {
  int last_task = 0;
  for (int id = 0; id < e.task_count(); ++id)
    if (e.task(id).end > e.task(last_task).end) last_task = id;
  std::vector<double> cp(kPhaseCount, 0);
  for (int t : e.critical_path(last_task)) {
    const int c = e.cause(t);
    cp[e.task(t).phase] += e.task(t).end - (c >= 0 ? e.task(c).end : 0.0);
  }
  for (int p = 0; p < kPhaseCount; ++p)
    if (cp[p] > 0) res->critical_path.push_back({phase_name(p), cp[p]});
  std::sort(res->critical_path.begin(), res->critical_path.end(),
            [](const PhaseTime& a, const PhaseTime& b) { return a.seconds > b.seconds; });
}

// Every task but the joins; shard full: where position 0 waited for a gather or blocked
// finishing a reduce-scatter.
void trace(const StepGraph& g, const Simulated& sim, const Waits& gather_waits,
           const Waits& scatter_waits, SimResult* res) {
  const Engine& e = g.engine();
  const int track_ringd = g.track_ringd();
  for (int id = 0; id < e.task_count(); ++id) {
    const Task& t = e.task(id);
    if (t.kind == TaskKind::kJoin) continue;
    SimResult::TraceEvent ev;
    ev.name = phase_name(t.phase);
    const bool ringd = t.track >= track_ringd;
    ev.pid = ringd ? 2 : 1;
    ev.tid = ringd ? t.track - track_ringd : static_cast<int>(sim.grank[t.track]);
    if (t.kind == TaskKind::kFlow && !ringd) ev.pid = 3;  // network lane per sending rank
    ev.start = t.start;
    ev.end = t.end;
    ev.bytes = t.bytes;
    ev.layer = t.layer;
    ev.step = t.step;
    res->trace.push_back(ev);
  }
  for (const auto& [list, name] : {std::pair{&gather_waits, "shard full: waiting for a block gather"},
                                   std::pair{&scatter_waits, "shard full: finishing a reduce-scatter"}})
    for (const auto& [a, b] : *list) {
      SimResult::TraceEvent ev;
      ev.name = name;
      ev.pid = 1;
      ev.tid = static_cast<int>(sim.grank[0]);
      ev.start = a;
      ev.end = b;
      res->trace.push_back(ev);
    }
}

}  // namespace

void summarize(const StepGraph& g, const Workload& w, const Simulated& sim, bool keep_trace,
               double end, SimResult* res) {
  const Engine& e = g.engine();
  const StepRecords& rec = g.records();
  step_times(e, rec, w, end, res);
  hop_and_compute(e, rec, w, res);
  ring_hidden(e, rec, w, res);
  ringd_times(e, rec, w, res);
  Waits gather_waits, scatter_waits;
  if (w.shard == spec::ShardMode::kFull)
    shard_times(e, rec, w, sim.full, res, &gather_waits, &scatter_waits);
  critical_path(e, res);
  compute_only(g, res);
  res->micro_batches = w.micro_batches;
  if (w.compression == spec::Compression::kTopk && w.warmup_steps > 0)
    res->notes.push_back(fmt::format("top-k step (after optimizer.warmup_steps {} dense steps)", w.warmup_steps));
  if (w.doc_len < w.seq_len)
    res->notes.push_back(fmt::format("packed documents taken as {} tokens each (data.max_doc_len)", w.doc_len));
  if (keep_trace) trace(g, sim, gather_waits, scatter_waits, res);
}

}  // namespace ring::sim::detail
