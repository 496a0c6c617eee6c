// File-system rendezvous for transport plugins, and local liveness checks of peers.
//
// No coordinator exists when a transport starts, so ranks meet in a directory (local disk on one
// host, a shared file system across hosts). Each rank publishes small records "<kind>-<rank>":
// written to a temporary name and renamed, so a reader sees a whole record or none. A record
// carries the writer's identity (host, boot id, pid namespace, pid, process start time) and a
// payload (a UCX worker address, an NCCL unique id). Readers poll with a growing sleep until all
// records exist or a deadline passes. The identity lets a rank tell that a peer on the same host
// has died (its pid is gone, a zombie, or reused) without waiting for a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "plugins/transport/transport.h"

namespace ring::transport {

// A status with its message: what plugins return internally before copying into last_error.
struct Result {
  ring_transport_status_t status = RING_TRANSPORT_OK;
  std::string message;
  bool ok() const { return status == RING_TRANSPORT_OK; }
};
inline Result ok_result() { return {}; }
inline Result error(ring_transport_status_t s, std::string m) { return {s, std::move(m)}; }

using Clock = std::chrono::steady_clock;
inline Clock::time_point deadline_after_ms(int ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}

// Who wrote a record; enough to check liveness of a process on the same host.
struct PeerIdentity {
  int rank = -1;
  int world_size = 0;
  long pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks after boot)
  std::string host;
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: same kernel
  std::string pid_ns;   // /proc/self/ns/pid link: same pid namespace
};

PeerIdentity self_identity(int rank, int world_size);

// True when `peer` runs under the same kernel and pid namespace as this process, so its pid
// can be checked directly.
bool same_pid_space(const PeerIdentity& self, const PeerIdentity& peer);

// For a peer in the same pid space: false when its process no longer runs (gone, zombie, or the
// pid reused by a process started at another time). Always true for other peers.
bool local_peer_alive(const PeerIdentity& self, const PeerIdentity& peer);

class Rendezvous {
 public:
  // spec: "<path>" or "file:<path>". Creates the directory. Fails with INVALID_ARGUMENT for an
  // empty spec, UNSUPPORTED for another scheme ("tcp://..."), INTERNAL when it cannot be created.
  Result open(const char* spec, int rank, int world_size);

  // Atomically writes the record "<kind>-<rank>" with this process's identity and payload.
  Result publish(const std::string& kind, const std::string& payload);

  // Waits until the record "<kind>-<r>" exists for every r in ranks (all ranks when empty), or
  // TIMEOUT at the deadline naming the ranks still missing. Fills identities and payloads
  // (indexed by rank; entries for ranks not asked for stay empty).
  Result gather(const std::string& kind, const std::vector<int>& ranks, Clock::time_point deadline,
                std::vector<PeerIdentity>* identities, std::vector<std::string>* payloads);

  const std::string& dir() const { return dir_; }
  const PeerIdentity& self() const { return self_; }

 private:
  Result read_record(const std::string& path, PeerIdentity* id, std::string* payload) const;

  std::string dir_;
  int rank_ = 0;
  int world_size_ = 0;
  PeerIdentity self_;
};

}  // namespace ring::transport
