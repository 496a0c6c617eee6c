// The daemon side of the control protocol, for ringd (and the simulated daemons of the tests and
// benchmark): one DEALER socket to ring-coord that registers, sends heartbeats, step reports,
// events and command acks, and receives `registered` and commands.
//
// The socket queues while the coordinator is away (restart, kill -9) and reconnects by itself;
// when the coordinator answers `not_registered` (it restarted and does not know this
// connection), recv() re-sends the registration automatically and reports the error too.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/protocol/protocol.h"

namespace ring::coord {

struct DaemonLinkOptions {
  std::string endpoint;           // empty: default_endpoint()
  std::string server_public_key;  // tcp:// only
  std::string client_public_key;
  std::string client_secret_key;
};

class DaemonLink {
 public:
  DaemonLink(DaemonLinkOptions opts, protocol::Register registration);
  ~DaemonLink();
  DaemonLink(const DaemonLink&) = delete;
  DaemonLink& operator=(const DaemonLink&) = delete;

  // Sends the registration (with the current jobs).
  void register_now();
  // Sends any daemon message (never blocks; dropped only if 100000 are queued).
  void send(const protocol::Message& m);
  void heartbeat(const std::vector<protocol::JobProgress>& jobs);

  // The next message from the coordinator, or nullopt after `timeout`. A reply that does not
  // parse is returned as an ErrorReply with code bad_json.
  std::optional<protocol::Message> recv(std::chrono::milliseconds timeout);

  protocol::Register& registration() { return reg_; }
  int64_t registrations() const { return registrations_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  protocol::Register reg_;
  int64_t seq_ = 0;
  int64_t registrations_ = 0;
};

}  // namespace ring::coord
