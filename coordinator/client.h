// The client API of ring-coord, used by ringctl (status, events, cancel, restart, ...).
//
//   ring::coord::Client c({.endpoint = ring::coord::default_endpoint()});
//   auto sub = c.submit(yaml_text);                // SubmitReply: job id, name, spec hash
//   for (const auto& j : c.status()) ...           // every job
//   c.cancel(sub.job);                             // throws RemoteError(permission_denied) ...
//
// Every call sends one request and waits for its reply up to `timeout`. Errors are typed:
// ConnectError (no coordinator at the endpoint / socket not accessible), TimeoutError (no reply
// in time), RemoteError (the coordinator refused: code() is one of protocol::code, e.g.
// "not_found", "permission_denied", "invalid_state", "invalid_spec"). One Client is one DEALER
// socket; use it from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/protocol/protocol.h"

namespace ring::coord {

class ClientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ConnectError : public ClientError {
 public:
  using ClientError::ClientError;
};
class TimeoutError : public ClientError {
 public:
  using ClientError::ClientError;
};
class RemoteError : public ClientError {
 public:
  RemoteError(std::string code, std::string field, const std::string& message)
      : ClientError(message), code_(std::move(code)), field_(std::move(field)) {}
  const std::string& code() const { return code_; }
  const std::string& field() const { return field_; }

 private:
  std::string code_;
  std::string field_;
};

struct ClientOptions {
  std::string endpoint;  // empty: default_endpoint()
  std::chrono::milliseconds timeout{5000};
  // tcp:// only: the server's public key (<state_dir>/curve/server.pub) and this client's pair
  // (its public key must be listed in <state_dir>/curve/clients).
  std::string server_public_key;
  std::string client_public_key;
  std::string client_secret_key;
  // When no coordinator answers (nothing listens at the endpoint, or no reply in time), the reply
  // to use instead: ringctl's read-only commands answer from the state a stopped coordinator left
  // (cli/local_state.h). nullopt (or unset): the ConnectError/TimeoutError as usual. An
  // ErrorReply becomes a RemoteError as from a coordinator.
  std::function<std::optional<protocol::Message>(const protocol::Message&)> when_unreachable =
      nullptr;
};

class Client {
 public:
  explicit Client(ClientOptions opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // job_dir: absolute path of the job's directory (empty: the coordinator's default,
  // /tmp/ringmaster-<uid>/jobs/<job name>); steps: overrides train.steps as the job's total.
  protocol::SubmitReply submit(const std::string& spec_yaml, const std::string& name = "",
                               const std::string& job_dir = "",
                               std::optional<int64_t> steps = std::nullopt);
  std::vector<protocol::JobInfo> status();
  protocol::JobInfo status(int64_t job);
  std::vector<protocol::EventRecord> events(int64_t job, int64_t after = 0, int64_t limit = 100);
  protocol::OkReply cancel(int64_t job);
  protocol::OkReply restart(int64_t job, std::optional<int64_t> from_step = std::nullopt);
  // A Slurm job its owner is about to requeue: ring-coord ends the attempt and waits for Slurm's
  // next start (protocol::RestartRequest::requeue).
  protocol::OkReply requeue(int64_t job);
  protocol::OkReply checkpoint(int64_t job);
  std::vector<protocol::NodeInfo> nodes();
  // What Slurm did with the job (protocol::SlurmJobRequest: submitted, submit_failed, started).
  protocol::OkReply slurm_job(const protocol::SlurmJobRequest& request);

  std::vector<protocol::StepRecord> steps(int64_t job, int64_t after = 0, int64_t limit = 1000);
  // The per-rank rows (rank_steps) of steps > after, at most `limit`, by step, attempt, rank.
  std::vector<protocol::RankStepRecord> rank_steps(int64_t job, int64_t after = 0,
                                                   int64_t limit = 1000);

  // Sends any request and returns the reply (RemoteError for an error reply).
  protocol::Message call(protocol::Message request);

 private:
  protocol::Message call_coordinator(const protocol::Message& request, int64_t id);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ring::coord
