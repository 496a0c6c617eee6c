#include "daemon/ringd/checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "daemon/ringd/step_driver.h"

namespace ring::ringd {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void Checkpoints::open(int attempt, const std::vector<optim::StateTensor>& tensors) {
  if (base_.dir.empty()) return;
  ckpt::Options co = base_;
  co.tag = std::to_string(attempt);
  ck_ = std::make_unique<ckpt::Checkpointer>(co);
  for (const optim::StateTensor& t : tensors)
    ck_->add_tensor(t.name, ckpt::DType::kF32, t.shape, t.data);
}

ckpt::LoadResult Checkpoints::resume(const std::vector<optim::StateTensor>& tensors,
                                     int64_t max_step, optim::Exchange& ex,
                                     const std::function<void(const ckpt::LoadResult&)>& restore) {
  if (base_.dir.empty()) {
    hooks_.log("checkpoints are off (checkpoint.dir is empty): starting from step 0");
    return {};
  }
  std::vector<ckpt::LoadTarget> targets;
  for (const optim::StateTensor& t : tensors)
    targets.push_back({t.name, ckpt::DType::kF32, t.shape, t.data});
  const ckpt::LoadResult r =
      load_agreed_checkpoint(base_.dir, base_.node_rank, base_.nodes, targets, max_step, ex);
  for (const std::string& sk : r.skipped) hooks_.log("checkpoint skipped: " + sk);
  if (r.loaded) {
    if (!r.spec_hash.empty() && r.spec_hash != base_.spec_hash)
      hooks_.log("note: checkpoint " + r.path + " was written with another spec (hash " +
                 r.spec_hash + ", now " + base_.spec_hash + ")");
    restore(r);
    hooks_.log(fmt::format("resuming from {} (step {})", r.path, r.step));
    hooks_.event("resumed", {{"step", r.step}, {"path", r.path}});
  } else {
    hooks_.log("no complete checkpoint in " + base_.dir + ": starting from step 0" +
               (r.message.empty() ? "" : " (" + r.message + ")"));
  }
  return r;
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
    hooks_.log(fmt::format("checkpoint step {} saved: {} ({:.1f} MB in {:.2f} s)", r.step, r.path,
                           r.bytes / 1e6, r.total_s));
    hooks_.event("checkpoint_saved", {{"step", r.step}, {"path", r.path}, {"bytes", r.bytes}});
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
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (it->status == ckpt::Status::kComplete)
        return fmt::format("{} (step {})", it->path, it->step);
    return "none (in " + base_.dir + ")";
  } catch (const std::exception& e) {
    return std::string("unknown (") + e.what() + ")";
  }
}

}  // namespace ring::ringd
