#include "coordinator/slurm_actions.h"

#include <algorithm>
#include <exception>

#include "common/slurm/slurm_cli.h"

namespace ring::coord {

SlurmActions::SlurmActions(Runner run) : run_(std::move(run)) {
  if (!run_)
    run_ = [](const Action& a) { return slurm::requeue_excluding(a.slurm_job_id, a.exclude); };
}

SlurmActions::~SlurmActions() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void SlurmActions::requeue_excluding(int64_t job, const std::string& slurm_job_id,
                                     const std::vector<std::string>& exclude) {
  std::lock_guard lk(mu_);
  if (std::find(busy_.begin(), busy_.end(), job) != busy_.end()) return;
  busy_.push_back(job);
  queue_.push_back({job, slurm_job_id, exclude});
  if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  cv_.notify_one();
}

std::vector<SlurmActions::Result> SlurmActions::take_finished() {
  std::lock_guard lk(mu_);
  return std::exchange(done_, {});
}

bool SlurmActions::pending(int64_t job) {
  std::lock_guard lk(mu_);
  return std::find(busy_.begin(), busy_.end(), job) != busy_.end();
}

void SlurmActions::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // a queued requeue is not started during shutdown
    Action a = queue_.front();
    queue_.pop_front();
    lk.unlock();
    Result r{a, false, ""};
    try {
      r.message = run_(a);
      r.ok = true;
    } catch (const std::exception& e) {
      r.message = e.what();
    }
    lk.lock();
    busy_.erase(std::remove(busy_.begin(), busy_.end(), a.job), busy_.end());
    done_.push_back(std::move(r));
  }
}

}  // namespace ring::coord
