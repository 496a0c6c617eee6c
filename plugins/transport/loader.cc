#include "plugins/transport/loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

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

// A plugin that breaks the ABI rule: the file, what is wrong, and the rule.
std::string abi_problem(const std::string& path, const std::string& what) {
  return "transport plugin " + path + " " + what + "; rule: a plugin exports " +
         RING_TRANSPORT_SYMBOL +
         ", a ring_transport_t with this loader's abi_version, a struct_size covering at least "
         "the required members (through last_error) and none of them NULL "
         "(plugins/transport/transport.h); rebuild it against this transport.h";
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
  const void* exported = dlsym(handle, RING_TRANSPORT_SYMBOL);
  if (!exported) {
    std::string why = std::string("does not export ") + RING_TRANSPORT_SYMBOL;
    // The layout before struct_size existed; reading it as a ring_transport_t would misread it.
    if (dlsym(handle, "ring_transport_v1"))
      why += " (it exports ring_transport_v1, the layout without a struct size)";
    throw TransportError(RING_TRANSPORT_ERR_INTERNAL, abi_problem(path, why));
  }
  return TransportPlugin(adopt_plugin_struct(exported, path), path);
}

const ring_transport_t* adopt_plugin_struct(const void* exported, const std::string& path) {
  // Read the two header fields first: they are at the same place in every layout.
  uint32_t header[2];
  std::memcpy(header, exported, sizeof(header));
  const uint32_t version = header[0], size = header[1];
  if (version != RING_TRANSPORT_ABI_VERSION)
    throw TransportError(RING_TRANSPORT_ERR_INTERNAL,
                         abi_problem(path, "was built for transport ABI version " +
                                               std::to_string(version) +
                                               ", this program speaks version " +
                                               std::to_string(RING_TRANSPORT_ABI_VERSION)));
  if (size < RING_TRANSPORT_MIN_SIZE)
    throw TransportError(
        RING_TRANSPORT_ERR_INTERNAL,
        abi_problem(path, "declares struct_size " + std::to_string(size) +
                              " bytes, less than the " + std::to_string(RING_TRANSPORT_MIN_SIZE) +
                              " bytes of the members every plugin must have (through last_error)"));
  // Only the plugin's bytes are read; members it does not have stay NULL (absent). A newer
  // plugin's extra members are not read.
  auto api = std::make_unique<ring_transport_t>();
  std::memset(api.get(), 0, sizeof(ring_transport_t));
  std::memcpy(api.get(), exported, std::min<size_t>(size, sizeof(ring_transport_t)));
  if (!api->name || !api->probe || !api->init || !api->finalize || !api->connect || !api->isend ||
      !api->irecv || !api->test || !api->wait || !api->all_reduce_sum_f32 ||
      !api->reduce_scatter_sum_f32 || !api->all_gather || !api->barrier || !api->last_error)
    throw TransportError(RING_TRANSPORT_ERR_INTERNAL,
                         abi_problem(path, std::string("leaves required members of ") +
                                               RING_TRANSPORT_SYMBOL + " NULL"));
  // Kept for the life of the process, like the library itself (RTLD_NODELETE).
  static std::mutex mu;
  static std::vector<std::unique_ptr<ring_transport_t>> adopted;
  std::lock_guard<std::mutex> lock(mu);
  adopted.push_back(std::move(api));
  return adopted.back().get();
}

TransportComm::TransportComm(const TransportPlugin& plugin, const ring_transport_config_t& config)
    : api_(&plugin.api()) {
  ring_transport_config_t sized = config;
  if (sized.struct_size == 0) sized.struct_size = sizeof(ring_transport_config_t);
  ring_transport_status_t s = api_->init(&sized, &comm_);
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
