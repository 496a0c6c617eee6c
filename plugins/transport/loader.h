// Loads transport plugins (libring_transport_<name>.so) by name at run time, and owns a
// communicator for the length of a scope.
//
// Search path, first match wins: the directories in $RING_TRANSPORT_PATH (colon-separated) when
// it is set - an override, nothing else is searched then - otherwise the install folder relative
// to the executable (<bin>/../lib/ringmaster), the configured install folder, and the build tree's
// plugins/ folder only when running from the build tree (common/install/locate.h). A name
// containing '/' is a path to a plugin file.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "plugins/transport/transport.h"

namespace ring::transport {

// A transport failure at the C++ edge: the status category and the plugin's message.
class TransportError : public std::runtime_error {
 public:
  TransportError(ring_transport_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  ring_transport_status_t status() const { return status_; }

 private:
  ring_transport_status_t status_;
};

std::vector<std::string> plugin_search_path();

// Transports found on the search path, in preference order: ucx, nccl, then others by name.
// The first is the default.
std::vector<std::string> available_transports();

// Checks a plugin's exported struct against transport.h's versioning rule and returns the
// loader's copy of it: the plugin's struct_size bytes, later members zero (absent). The copy
// lives until exit. Throws TransportError(INTERNAL) naming `path` and the rule broken.
const ring_transport_t* adopt_plugin_struct(const void* exported, const std::string& path);

// A loaded plugin. Move-only; the library stays mapped for the life of the process (RTLD_NODELETE:
// UCX and CUDA install hooks and threads that must not be unmapped under them).
class TransportPlugin {
 public:
  // Throws TransportError(UNSUPPORTED) when no plugin of that name is on the search path (the
  // message lists the available ones and the path), INTERNAL when it fails to load or breaks
  // the ABI rule of transport.h (no ring_transport_plugin symbol, another abi_version, a
  // struct_size short of the required members, a required member NULL), naming the file.
  static TransportPlugin load(const std::string& name);

  const ring_transport_t& api() const { return *api_; }
  const ring_transport_t* operator->() const { return api_; }
  const std::string& path() const { return path_; }
  std::string name() const { return api_->name; }

 private:
  TransportPlugin(const ring_transport_t* api, std::string path) : api_(api), path_(std::move(path)) {}
  const ring_transport_t* api_;
  std::string path_;
};

// A communicator: init in the constructor, finalize in the destructor.
class TransportComm {
 public:
  // Throws TransportError with the plugin's message when init fails.
  TransportComm(const TransportPlugin& plugin, const ring_transport_config_t& config);
  ~TransportComm();
  TransportComm(const TransportComm&) = delete;
  TransportComm& operator=(const TransportComm&) = delete;

  ring_transport_comm_t* get() const { return comm_; }
  const ring_transport_t& api() const { return *api_; }

  // Throws TransportError carrying last_error when status is not OK; `what` prefixes the message.
  void check(ring_transport_status_t status, const char* what) const;

 private:
  const ring_transport_t* api_;
  ring_transport_comm_t* comm_ = nullptr;
};

}  // namespace ring::transport
