#include "plugins/transport/common/plugin_base.h"

#include <algorithm>
#include <cstring>

namespace ring::transport {

std::string& thread_error() {
  thread_local std::string message;
  return message;
}

void set_thread_error(std::string message) {
  thread_error() = std::move(message);
}

Result read_config(const char* plugin, const ring_transport_config_t* in, int max_world,
                   ring_transport_config_t* out) {
  *out = ring_transport_config_t{};
  if (!in)
    return error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                 std::string(plugin) + " init: config is NULL");
  size_t size = in->struct_size == 0 ? RING_TRANSPORT_CONFIG_MIN_SIZE : in->struct_size;
  if (size < RING_TRANSPORT_CONFIG_MIN_SIZE)
    return error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                 std::string(plugin) + " init: config struct_size " + std::to_string(size) +
                     " is smaller than the first layout (" +
                     std::to_string(RING_TRANSPORT_CONFIG_MIN_SIZE) +
                     " bytes); use 0 or sizeof(ring_transport_config_t)");
  // Members the caller has and this plugin knows; a newer caller's extra members are ignored.
  std::memcpy(out, in, std::min(size, sizeof(ring_transport_config_t)));
  out->struct_size = sizeof(ring_transport_config_t);
  if (out->world_size < 1 || out->world_size > max_world || out->rank < 0 ||
      out->rank >= out->world_size)
    return error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                 std::string(plugin) + " init: rank " + std::to_string(out->rank) +
                     " of world size " + std::to_string(out->world_size) +
                     " is out of range (world size 1.." + std::to_string(max_world) + ")");
  return ok_result();
}

void CommBase::configure(const char* plugin_name, const ring_transport_config_t& config) {
  plugin = plugin_name;
  rank = config.rank;
  world = config.world_size;
  if (config.bootstrap_timeout_ms > 0) bootstrap_timeout_ms = config.bootstrap_timeout_ms;
  if (config.op_timeout_ms > 0) op_timeout_ms = config.op_timeout_ms;
}

Result CommBase::connect_list(const int* peer_list, int n_peers, std::vector<int>* out) const {
  out->clear();
  if (n_peers < 0 || (n_peers > 0 && !peer_list))
    return error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                 who() + ": connect: " + std::to_string(n_peers) + " peers at " +
                     (peer_list ? "a list" : "NULL"));
  if (n_peers == 0) {
    for (int p = 0; p < world; ++p) out->push_back(p);
    return ok_result();
  }
  out->assign(peer_list, peer_list + n_peers);
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  for (int p : *out)
    if (bad_peer(p))
      return error(
          RING_TRANSPORT_ERR_INVALID_ARGUMENT,
          who() + ": connect to rank " + std::to_string(p) + " of " + std::to_string(world));
  return ok_result();
}

}  // namespace ring::transport
