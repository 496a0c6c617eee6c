// The requests ringctl sends to ring-coord: submit, status, events, steps, cancel, restart,
// checkpoint, nodes, slurm_job. Each is handled inside the caller's transaction over the shared
// Engine (coordinator/engine.h); the reply and the commands it causes go to the outbox. Reads
// answer through coordinator/queries.h (what ringctl also uses on a stopped coordinator's state);
// changes are allowed to the job's owner, root and --admin-uid. Throws Refused (the error reply).
#pragma once

#include <cstdint>
#include <string>

#include "coordinator/engine.h"

namespace ring::coord {

class ClientRequests {
 public:
  explicit ClientRequests(Engine& e) : e_(e) {}

  void on(const std::string& peer, uint32_t uid, const proto::SubmitRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::StatusRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::EventsRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::StepsRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::CancelRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::RestartRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::CheckpointRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::NodesRequest& m);
  void on(const std::string& peer, uint32_t uid, const proto::SlurmJobRequest& m);

 private:
  void check_from_step(const JobRow& j, int64_t step);
  void exclude_failed_nodes(const JobRow& j, const proto::SlurmJobRequest& m);
  std::vector<std::string> excluded_in_allocation(int64_t job, const std::string& nodes);
  Engine& e_;
};

}  // namespace ring::coord
