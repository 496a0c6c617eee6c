// What ring-coord asks of Slurm itself, off the loop's thread: requeue a job without the nodes
// it must not run on again (a start that landed on an excluded node; docs/slurm.md, "Failed
// nodes"). scontrol can take tens of seconds (requeuehold, then ExcNodeList once Slurm holds the
// job pending, then release), so one worker thread runs the actions in order and the timers
// record each outcome as the job's event (Timers::record_slurm_actions).
//
//   SlurmActions a;                                  // runs slurm::requeue_excluding
//   a.requeue_excluding(7, "1234", {"node2"});
//   for (auto& r : a.take_finished()) ...            // later, on the loop's thread
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ring::coord {

class SlurmActions {
 public:
  struct Action {
    int64_t job = 0;
    std::string slurm_job_id;
    std::vector<std::string> exclude;  // host names
  };
  struct Result {
    Action action;
    bool ok = false;
    std::string message;  // the ExcNodeList set, or what failed
  };
  // Runs one action; returns the ExcNodeList it set, throws with what failed. Default:
  // slurm::requeue_excluding (scontrol). Tests pass their own.
  using Runner = std::function<std::string(const Action&)>;

  explicit SlurmActions(Runner run = {});
  ~SlurmActions();
  SlurmActions(const SlurmActions&) = delete;
  SlurmActions& operator=(const SlurmActions&) = delete;

  // Queues the action (the worker starts on first use); a job already queued or running is not
  // queued twice.
  void requeue_excluding(int64_t job, const std::string& slurm_job_id,
                         const std::vector<std::string>& exclude);
  // Outcomes since the last call, in the order they finished.
  std::vector<Result> take_finished();
  // Whether an action of the job is queued or running.
  bool pending(int64_t job);

 private:
  void loop();

  Runner run_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Action> queue_;
  std::vector<int64_t> busy_;  // jobs queued or running
  std::vector<Result> done_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace ring::coord
