#include "plugins/transport/loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/install/locate.h"

namespace ring::transport {
namespace {

constexpr const char* kPrefix = "libring_transport_";
constexpr const char* kSuffix = ".so";

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

int preference(const std::string& name) {
  if (name == "ucx") return 0;
  if (name == "nccl") return 1;
  return 2;
}

}  // namespace

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("RING_TRANSPORT_PATH")) {
    std::string s(env);
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) dirs.push_back(s.substr(start, end - start));
      start = end + 1;
    }
    return dirs;
  }
  return install::plugin_dirs("plugins");
}

std::vector<std::string> available_transports() {
  std::vector<std::string> names;
  for (const std::string& dir : plugin_search_path()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      std::string f = entry.path().filename().string();
      if (f.rfind(kPrefix, 0) != 0 || f.size() <= std::strlen(kPrefix) + std::strlen(kSuffix) ||
          f.compare(f.size() - std::strlen(kSuffix), std::strlen(kSuffix), kSuffix) != 0)
        continue;
      std::string name =
          f.substr(std::strlen(kPrefix), f.size() - std::strlen(kPrefix) - std::strlen(kSuffix));
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return std::make_pair(preference(a), a) < std::make_pair(preference(b), b);
  });
  return names;
}

TransportPlugin TransportPlugin::load(const std::string& name) {
  std::string path;
  if (name.find('/') != std::string::npos) {
    path = name;
  } else {
    for (const std::string& dir : plugin_search_path()) {
      std::string candidate = dir + "/" + kPrefix + name + kSuffix;
      if (std::filesystem::exists(candidate)) {
        path = candidate;
        break;
      }
    }
    if (path.empty()) {
      std::vector<std::string> avail = available_transports();
      throw TransportError(
          RING_TRANSPORT_ERR_UNSUPPORTED,
          "transport '" + name + "' is not available (not built, or not on the search path); " +
              "available: " + (avail.empty() ? "none" : join(avail, ", ")) + "; searched: " +
              join(plugin_search_path(), ":") + " (set RING_TRANSPORT_PATH to override)");
    }
  }
  // RTLD_LOCAL: two plugins may link different versions of the same library.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle)
    throw TransportError(RING_TRANSPORT_ERR_INTERNAL,
                         "transport '" + name + "': cannot load " + path + ": " + dlerror());
  auto* api = static_cast<const ring_transport_t*>(dlsym(handle, RING_TRANSPORT_V1_SYMBOL));
  if (!api)
    throw TransportError(RING_TRANSPORT_ERR_INTERNAL, "transport '" + name + "': " + path +
                                                          " does not export " +
                                                          RING_TRANSPORT_V1_SYMBOL);
  if (!api->name || !api->probe || !api->init || !api->finalize || !api->connect || !api->isend ||
      !api->irecv || !api->test || !api->wait || !api->all_reduce_sum_f32 ||
      !api->reduce_scatter_sum_f32 || !api->all_gather || !api->barrier || !api->last_error)
    throw TransportError(RING_TRANSPORT_ERR_INTERNAL,
                         "transport '" + name + "': " + path + " leaves members of " +
                             RING_TRANSPORT_V1_SYMBOL + " NULL");
  return TransportPlugin(api, path);
}

TransportComm::TransportComm(const TransportPlugin& plugin, const ring_transport_config_t& config)
    : api_(&plugin.api()) {
  ring_transport_status_t s = api_->init(&config, &comm_);
  if (s != RING_TRANSPORT_OK)
    throw TransportError(s, std::string(api_->name) + " init (rank " +
                                std::to_string(config.rank) + "): " + api_->last_error(nullptr));
}

TransportComm::~TransportComm() { api_->finalize(comm_); }

void TransportComm::check(ring_transport_status_t status, const char* what) const {
  if (status == RING_TRANSPORT_OK) return;
  throw TransportError(status, std::string(what) + ": " + ring_transport_status_name(status) +
                                   ": " + api_->last_error(comm_));
}

}  // namespace ring::transport
