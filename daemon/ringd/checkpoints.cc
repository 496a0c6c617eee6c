#include "daemon/ringd/checkpoints.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/checkpoint/model.h"
#include "common/contract/model_config.h"
#include "common/contract/shard.h"
#include "daemon/ringd/step_driver.h"

namespace ring::ringd {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

ckpt::Layout checkpoint_layout(const spec::JobSpec& spec, int nodes) {
  return checkpoint_layout(spec, contract::ParamLayout(contract::ModelConfig::from_spec(spec)),
                           nodes);
}

ckpt::Layout checkpoint_layout(const spec::JobSpec& spec, const contract::ParamLayout& layout,
                               int nodes) {
  contract::ModelConfig mc = contract::ModelConfig::from_spec(spec);
  // A fine-tune keeps the context its model had (max_position_embeddings of an import, say
  // 131072) when it trains on shorter sequences: the record says the longer of the two, so an
  // export after the fine-tune does not shrink it to data.seq_len. The record's max_positions is
  // informative (a resume does not compare it); an init_from that cannot be read here is
  // reported when ringd loads it.
  if (!spec.model.init_from.empty()) {
    try {
      mc.max_positions = std::max(
          mc.max_positions, ckpt::read_checkpoint_model(spec.model.init_from).config.max_positions);
    } catch (const std::exception&) {
    }
  }
  ckpt::Layout l;
  l.shard = spec::to_string(spec.parallel.shard);
  // The top-k residual: at the owners of the ranges (compress_at owner; shard full always), or
  // every node's own (compress_at sender).
  const spec::OptimizerSection& o = spec.optimizer;
  if (o.compression == spec::Compression::kTopk && o.error_feedback)
    l.residual =
        o.compress_at == spec::CompressAt::kSender && spec.parallel.shard != spec::ShardMode::kFull
            ? "per_node"
            : "owner";
  l.nodes = nodes;
  l.total_floats = layout.total();
  for (const contract::NodeRange& r : contract::shard_ranges(layout, nodes))
    l.ranges.push_back({r.node, r.begin, r.end, r.first_bucket, r.end_bucket});
  l.model = contract::model_record(mc);
  return l;
}

ckpt::LoadResult load_init_from(const std::string& path,
                                const std::vector<optim::StateTensor>& tensors, int node_rank,
                                int nodes, const ckpt::Layout* job) {
  std::vector<ckpt::LoadTarget> targets;
  for (const optim::StateTensor& t : tensors) {
    if (t.kind != "master") continue;
    ckpt::LoadTarget lt{t.name, ckpt::DType::kF32, t.shape, t.data};
    lt.flat_name = t.kind;  // format 1: sliced out of the flat "master" tensor
    lt.flat_offset = t.offset;
    targets.push_back(std::move(lt));
  }
  return ckpt::load_from_path(path, node_rank, nodes, targets, job);
}

void Checkpoints::agree_run(optim::Exchange& ex) {
  if (!run_.empty()) return;
  std::random_device rd;
  const uint32_t mine = rd();
  // Node 0's: every node's tags must match at the commit.
  const auto all = ex.allgather(&mine, sizeof(mine));
  uint32_t id = mine;
  if (!all.empty() && all[0].size() == sizeof(id)) std::memcpy(&id, all[0].data(), sizeof(id));
  run_ = fmt::format("r{:08x}", id);
}

bool Checkpoints::lineage_has_checkpoint(optim::Exchange& ex) {
  uint8_t mine = 0;
  if (!base_.dir.empty()) {
    try {
      const std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(base_.dir, false);
      mine = ckpt::current_lineage(all, ckpt::read_latest(base_.dir)).empty() ? 0 : 1;
    } catch (const ckpt::CheckpointError& e) {
      hooks_.log(std::string("cannot list the checkpoints: ") + e.what());
      mine = 1;
    }
  }
  uint8_t any = mine;
  for (const auto& b : ex.allgather(&mine, sizeof(mine)))
    if (!b.empty() && b[0] != 0) any = 1;
  return any != 0;
}

void Checkpoints::open(int attempt, const std::vector<optim::StateTensor>& tensors) {
  if (base_.dir.empty()) return;
  ckpt::Options co = base_;
  co.tag = (run_.empty() ? std::string("r0") : run_) + "-" + std::to_string(attempt);
  co.parent = parent_;
  ck_ = std::make_unique<ckpt::Checkpointer>(co);
  // Only this node's range and its per-node tensors: every other tensor has one owner that
  // saves it (with shard none a node holds them all, but writes only its own part).
  for (const optim::StateTensor& t : tensors)
    if (t.saved) ck_->add_tensor(t.name, ckpt::DType::kF32, t.shape, t.data);
}

void Checkpoints::start_fresh() {
  parent_.reset();
  if (base_.dir.empty() || base_.node_rank != 0) return;
  const std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(base_.dir, false);
  const std::string latest = ckpt::read_latest(base_.dir);
  int64_t n = 0, newest = -1;
  for (size_t i : ckpt::current_lineage(all, latest))
    if (all[i].status == ckpt::Status::kComplete) ++n, newest = std::max(newest, all[i].step);
  if (latest == "none" && n == 0) return;
  if (n == 0 && latest.empty()) return;
  ckpt::set_latest(base_.dir, "none", base_.fsync);
  if (n == 0) return;
  hooks_.log(fmt::format(
      "starting afresh: the {} checkpoint(s) of an earlier run in {} (up to step {}) are "
      "superseded; they are never resumed and retention removes them once this run's kept "
      "checkpoints are newer (to continue that run, use --resume instead)",
      n, base_.dir, newest));
  hooks_.event("lineage_superseded", {{"checkpoints", n}, {"newest_step", newest}});
}

ckpt::LoadResult Checkpoints::resume(const std::vector<optim::StateTensor>& tensors,
                                     int64_t max_step, bool exact, optim::Exchange& ex,
                                     const std::function<void(const ckpt::LoadResult&)>& restore) {
  if (base_.dir.empty())
    throw ResumeFailure(
        "a resume was asked for, but checkpoints are off (checkpoint.dir is empty)", false);
  std::vector<ckpt::LoadTarget> targets;
  for (const optim::StateTensor& t : tensors) {
    ckpt::LoadTarget lt{t.name, ckpt::DType::kF32, t.shape, t.data};
    lt.per_node = t.per_node;
    // Format 1 wrote each kind as one flat tensor of the layout ("master", ...).
    lt.flat_name = t.kind;
    lt.flat_offset = t.offset;
    targets.push_back(std::move(lt));
  }
  const ckpt::LoadResult r =
      load_agreed_checkpoint(base_.dir, base_.node_rank, base_.nodes, targets, max_step, ex,
                             base_.layout ? &*base_.layout : nullptr);
  for (const std::string& sk : r.skipped) hooks_.log("checkpoint skipped: " + sk);
  const std::string asked =
      max_step == INT64_MAX ? "the newest checkpoint" : fmt::format("step {}", max_step);
  if (!r.loaded)
    throw ResumeFailure(fmt::format("cannot resume from {}: {}", asked, r.message),
                        !r.skipped.empty());
  if (exact && r.step != max_step && r.skipped.empty())
    throw ResumeFailure(
        fmt::format("cannot resume from step {}: the current lineage in {} has no complete "
                    "checkpoint of that step (the newest at or below it is step {})",
                    max_step, base_.dir, r.step),
        false);
  if (!r.spec_hash.empty() && r.spec_hash != base_.spec_hash)
    hooks_.log("note: checkpoint " + r.path + " was written with another spec (hash " +
               r.spec_hash + ", now " + base_.spec_hash + ")");
  const bool other_shard = r.layout && base_.layout && r.layout->shard != base_.layout->shard;
  const bool per_node = std::any_of(tensors.begin(), tensors.end(),
                                    [](const optim::StateTensor& t) { return t.per_node; });
  const bool owner = std::any_of(tensors.begin(), tensors.end(), [](const optim::StateTensor& t) {
    return t.kind == "residual" && !t.per_node;
  });
  // The writer's residual: recorded, else per node when it had several nodes and wrote no
  // layout with an owner's residual (format 1, or a record from before the field).
  const bool was_owner = r.layout && r.layout->residual == "owner";
  const bool was_per_node = r.layout
                                ? r.layout->residual == "per_node" ||
                                      (r.layout->residual.empty() && r.layout->shard != "full")
                                : true;
  std::string residuals;
  if (per_node && (r.nodes != base_.nodes || was_owner))
    residuals = was_owner ? ", the owners' residuals summed onto node 0, zero elsewhere"
                          : ", per-node residuals summed onto node 0, zero elsewhere";
  else if (owner && was_per_node && r.nodes > 1)
    residuals = ", per-node residuals summed in node order into the owners' ranges";
  if (r.nodes != base_.nodes || other_shard || !residuals.empty()) {
    const std::string was = r.layout
                                ? ckpt::describe_layout(*r.layout)
                                : fmt::format("{} nodes (format {})", r.nodes, r.format_version);
    const std::string now = base_.layout ? ckpt::describe_layout(*base_.layout)
                                         : fmt::format("{} nodes", base_.nodes);
    hooks_.log(fmt::format(
        "checkpoint {} was written by {}; this job is {}: state resharded{} (read {})", r.path,
        was, now, residuals, fmt::join(r.shards_read, ", ")));
  }
  restore(r);
  parent_ = ckpt::CheckpointRef{r.tag, r.step};
  if (base_.node_rank == 0) branch_at(r);
  hooks_.log(fmt::format("resuming from {} (step {})", r.path, r.step));
  hooks_.event("resumed", {{"step", r.step}, {"path", r.path}});
  return r;
}

// Node 0, once every node has loaded `r`: when the lineage's head is newer, the resume branches
// there. `latest` moves back to `r` at once (a crash before this attempt's first checkpoint must
// resume `r` again, not the abandoned head), and the newer checkpoints are superseded.
void Checkpoints::branch_at(const ckpt::LoadResult& r) {
  const std::string latest = ckpt::read_latest(base_.dir);
  const std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(base_.dir, false);
  std::vector<int64_t> newer;
  for (size_t i : ckpt::current_lineage(all, latest))
    if (all[i].step > r.step && all[i].status == ckpt::Status::kComplete)
      newer.push_back(all[i].step);
  if (latest != r.name) ckpt::set_latest(base_.dir, r.name, base_.fsync);
  if (newer.empty()) return;
  std::sort(newer.begin(), newer.end());
  hooks_.log(fmt::format(
      "resuming from step {} branches the lineage: its checkpoints of steps {} are superseded "
      "(never resumed; retention removes them once this branch's kept checkpoints are newer)",
      r.step, fmt::join(newer, ", ")));
  hooks_.event("lineage_branched", {{"step", r.step}, {"superseded", newer}});
}

void Checkpoints::start(int64_t step, nlohmann::json meta) {
  if (!ck_) return;
  ck_->start(step, std::move(meta));
  last_started_ = step;
}

void Checkpoints::wait(int64_t step) {
  if (!ck_) return;
  for (const ckpt::SaveResult& r : ck_->drain())
    if (report(r) && r.step == step) stop_saved_ = r.step;
}

void Checkpoints::poll() {
  if (!ck_) return;
  while (auto r = ck_->poll()) report(*r);
}

std::optional<Clock::duration> Checkpoints::drain_before_update() {
  if (!ck_ || !ck_->busy()) return std::nullopt;
  const auto t0 = Clock::now();
  const std::vector<ckpt::SaveResult> done = ck_->drain();
  const Clock::duration stalled = Clock::now() - t0;
  for (const ckpt::SaveResult& r : done) report(r);
  return stalled;
}

void Checkpoints::close(bool stop_requested, int64_t done_step) {
  if (!ck_) return;
  int64_t saved = stop_saved_;  // the newest checkpoint this node wrote its shard of
  // Every checkpoint of the attempt, the one in flight included (node 0 may still be
  // committing it): ring-coord resumes from the newest one reported saved.
  for (const ckpt::SaveResult& r : ck_->drain())
    if (report(r)) saved = std::max(saved, r.step);
  if (stop_requested && base_.node_rank > 0 && saved == done_step && saved > 0)
    await_commit(saved);
  ck_.reset();
}

bool Checkpoints::report(const ckpt::SaveResult& r) {
  hooks_.record(r);
  if (r.ok) {
    saved_any_ = true;
    if (!r.superseded.empty())
      hooks_.log(fmt::format("checkpoint step {}: the earlier copy of that step (off this lineage) "
                             "is kept as {}", r.step, r.superseded));
    hooks_.log(fmt::format("checkpoint step {} saved: {} ({:.1f} MB in {:.2f} s)", r.step, r.path,
                           r.bytes / 1e6, r.total_s));
    nlohmann::json ev = {
        {"step", r.step}, {"path", r.path}, {"bytes", r.bytes}, {"seconds", r.write_s}};
    // ring-coord forgets what retention removed (so `restart --from` refuses those steps).
    if (!r.deleted_steps.empty()) ev["deleted"] = r.deleted_steps;
    hooks_.event("checkpoint_saved", std::move(ev));
  } else {
    hooks_.log(fmt::format("checkpoint step {} failed: {}", r.step, r.error));
    hooks_.event("checkpoint_failed", {{"step", r.step}, {"error", r.error}});
  }
  return r.ok;
}

// A node other than 0 has written its shard of the checkpoint taken on a stop signal; node 0
// commits it once every shard is there. Exiting before that commit would let srun
// (--kill-on-bad-exit: exit 75 counts as bad) kill node 0 mid-commit, so wait for the step's
// final directory, bounded: Slurm's SIGKILL follows KillWait seconds after the SIGTERM anyway.
void Checkpoints::await_commit(int64_t step, std::chrono::milliseconds bound) {
  const fs::path final_dir = fs::path(base_.dir) / ckpt::step_dir_name(step);
  const auto end = Clock::now() + bound;
  std::error_code ec;
  while (!fs::exists(final_dir, ec) && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (fs::exists(final_dir, ec))
    hooks_.log(fmt::format("checkpoint step {} committed by node 0", step));
  else
    hooks_.log(fmt::format(
        "checkpoint step {}: node 0 has not committed it within {} s; exiting anyway", step,
        std::chrono::duration_cast<std::chrono::seconds>(bound).count()));
}

// The run ends (every step done, or a resumable stop) and its last checkpoint, of the step it
// ends at, failed (a full disk): the exit status must not say "completed" or "resumable from
// here" when the newest weights on disk are older. Exit 1 naming the failed checkpoint, the
// reason and the newest complete checkpoint; ring-coord hears it as checkpoint_failed.
std::string Checkpoints::final_error(const std::string* error, bool stop, int64_t done_step) const {
  if (!error) return "";
  return fmt::format("the {} checkpoint (step {}) failed: {}; the newest complete checkpoint is {}",
                     stop ? "stop" : "final", done_step, *error, newest_complete());
}

std::string Checkpoints::newest_complete() const {
  try {
    const std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(base_.dir, false);
    for (size_t i : ckpt::current_lineage(all, ckpt::read_latest(base_.dir)))
      if (all[i].status == ckpt::Status::kComplete)
        return fmt::format("{} (step {})", all[i].path, all[i].step);
    return "none (in " + base_.dir + ")";
  } catch (const std::exception& e) {
    return std::string("unknown (") + e.what() + ")";
  }
}

}  // namespace ring::ringd
