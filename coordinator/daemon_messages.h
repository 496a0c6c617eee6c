// The messages ringd sends to ring-coord: register, heartbeat, step, event, command_ack. Each is
// handled inside the caller's transaction over the shared Engine (coordinator/engine.h); its
// reply (registered) and the commands it causes go to the outbox. A node is (uid, name): a daemon
// speaks only for its own uid's node, and only a member node of the job's owner (or root) may
// report for a job. Throws Refused (the error reply) for a message it refuses.
#pragma once

#include <cstdint>
#include <string>

#include "coordinator/engine.h"

namespace ring::coord {

class DaemonMessages {
 public:
  explicit DaemonMessages(Engine& e) : e_(e) {}

  void on(const std::string& peer, uint32_t uid, const proto::Register& m);
  void on(const std::string& peer, uint32_t uid, const proto::Heartbeat& m);
  void on(const std::string& peer, uint32_t uid, const proto::StepReport& m);
  void on(const std::string& peer, uint32_t uid, const proto::Event& m);
  void on(const std::string& peer, uint32_t uid, const proto::CommandAck& m);

 private:
  JobRow member_job(const NodeId& node, int64_t job_id);
  Engine& e_;
};

}  // namespace ring::coord
