// What every transport plugin shares beyond the rendezvous: the part of a communicator all of
// them have (rank, world size, timeouts, peers, the last error), reading the caller's config
// under transport.h's struct_size rule, the thread's last error for probe and init, the checks
// of connect's peer list, and the exception guard around each entry point.
//
// A plugin's `struct ring_transport_comm` derives from CommBase; its exported struct then reads
//   {RING_TRANSPORT_HEADER, .name = "x", ..., .init = guarded<x_init>, ...,
//    .last_error = last_error_of<ring_transport_comm>}.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "plugins/transport/common/no_throw.h"
#include "plugins/transport/common/rendezvous.h"
#include "plugins/transport/transport.h"

namespace ring::transport {

constexpr int kDefaultTimeoutMs = 60000;
// How often a waiting call checks that peers on this host still run.
constexpr auto kLivenessPeriod = std::chrono::milliseconds(50);

// The calling thread's last failure in probe or init of this plugin: last_error(NULL). Each
// plugin links its own copy (plugin.lds keeps everything but the ABI symbol local).
std::string& thread_error();
void set_thread_error(std::string message);

// Reads the caller's config into *out: the members inside in->struct_size (0: the first layout,
// RING_TRANSPORT_CONFIG_MIN_SIZE), later members left zero. INVALID_ARGUMENT, with a message
// naming the plugin and the field, for a NULL config, a struct_size below the first layout, a
// world_size outside [1, max_world] or a rank outside [0, world_size).
Result read_config(const char* plugin, const ring_transport_config_t* in, int max_world,
                   ring_transport_config_t* out);

struct CommBase {
  const char* plugin = "";  // the plugin's name, for messages
  int rank = 0;
  int world = 1;
  int bootstrap_timeout_ms = kDefaultTimeoutMs;
  int op_timeout_ms = kDefaultTimeoutMs;
  Rendezvous rdv;
  std::vector<PeerIdentity> peers;  // identities from the rendezvous, by rank
  Clock::time_point next_liveness = Clock::now();
  std::string last_error;

  // Takes rank, world size and timeouts (0: the default) from a config read by read_config.
  void configure(const char* plugin_name, const ring_transport_config_t& config);

  ring_transport_status_t fail(const Result& r) {
    last_error = r.message;
    return r.status;
  }
  ring_transport_status_t fail(ring_transport_status_t s, std::string m) {
    last_error = std::move(m);
    return s;
  }
  std::string who() const { return std::string(plugin) + " rank " + std::to_string(rank); }
  // A member's timeout argument: 0 (or negative) means the comm's op_timeout_ms.
  int timeout(int ms) const { return ms > 0 ? ms : op_timeout_ms; }
  bool bad_peer(int peer) const { return peer < 0 || peer >= world; }

  // The peers connect() must reach: every rank when n_peers == 0, else the list sorted without
  // duplicates. INVALID_ARGUMENT naming a rank out of range.
  Result connect_list(const int* peer_list, int n_peers, std::vector<int>* out) const;
};

// The start of every plugin's init: checks `out` and the config (read_config), then makes the
// comm and configures it. On failure the thread's last error says why and *out is NULL.
template <typename Comm>
ring_transport_status_t start_init(const char* plugin, const ring_transport_config_t* config,
                                   int max_world, ring_transport_comm_t** out,
                                   ring_transport_config_t* cfg, std::unique_ptr<Comm>* comm) {
  if (!out) {
    set_thread_error(std::string(plugin) + " init: comm is NULL");
    return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  }
  *out = nullptr;
  if (Result r = read_config(plugin, config, max_world, cfg); !r.ok()) {
    set_thread_error(r.message);
    return r.status;
  }
  *comm = std::make_unique<Comm>();
  (*comm)->configure(plugin, *cfg);
  return RING_TRANSPORT_OK;
}

// init's way out after start_init: records why, releases what was built with the plugin's
// finalize, returns the status.
template <auto Finalize, typename Comm>
ring_transport_status_t abandon_init(std::unique_ptr<Comm>& comm, const Result& r) {
  set_thread_error(r.message);
  Finalize(comm.release());
  return r.status;
}

// The ABI's last_error for a plugin whose comm derives from CommBase.
template <typename Comm>
const char* last_error_of(const Comm* c) {
  return c ? c->last_error.c_str() : thread_error().c_str();
}

// An entry point that lets no exception out (no_throw.h). Every member but last_error, which
// cannot throw, goes through it.
template <auto F>
constexpr auto guarded = &NoThrow<set_thread_error, F>::call;

}  // namespace ring::transport
