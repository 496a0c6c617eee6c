#include "daemon/placement/discovery.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "daemon/placement/errors.h"

namespace ring::placement {

CommandResult run_command(const std::vector<std::string>& argv, int timeout_ms) {
  proc::RunOptions o;
  o.timeout_ms = timeout_ms;
  o.out_cap = size_t{1} << 20;  // topo -m and --query-gpu print a few KiB even on large nodes
  o.err_cap = size_t{64} << 10;
  try {
    return proc::run_command(argv, o);
  } catch (const proc::RunError& e) {
    if (e.stage() == proc::RunError::Stage::kPipe) throw PlacementError("pipe failed");
    throw PlacementError(e.what());
  }
}

namespace {

// The few NVML types used, declared here so no NVML header is needed. Layouts follow nvml.h
// (stable since NVML 10 for these calls).
using nvmlDevice_t = void*;
using nvmlReturn_t = int;
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_sub_system_id;
  char bus_id[32];
};
struct NvmlMemory {
  unsigned long long total, free, used;
};

template <typename F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

bool discover_gpus_nvml(const std::string& library, GpuTopology& out, std::string& why) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    why = fmt::format("NVML not loaded ({}): {}", library, dlerror());
    return false;
  }
  auto init = sym<nvmlReturn_t (*)()>(lib, "nvmlInit_v2");
  auto shutdown = sym<nvmlReturn_t (*)()>(lib, "nvmlShutdown");
  auto count = sym<nvmlReturn_t (*)(unsigned*)>(lib, "nvmlDeviceGetCount_v2");
  auto by_index =
      sym<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  auto name = sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(lib, "nvmlDeviceGetName");
  auto uuid = sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(lib, "nvmlDeviceGetUUID");
  auto pci = sym<nvmlReturn_t (*)(nvmlDevice_t, NvmlPciInfo*)>(lib, "nvmlDeviceGetPciInfo_v3");
  auto mem = sym<nvmlReturn_t (*)(nvmlDevice_t, NvmlMemory*)>(lib, "nvmlDeviceGetMemoryInfo");
  auto ancestor = sym<nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t, int*)>(
      lib, "nvmlDeviceGetTopologyCommonAncestor");
  auto link_state =
      sym<nvmlReturn_t (*)(nvmlDevice_t, unsigned, int*)>(lib, "nvmlDeviceGetNvLinkState");
  auto link_remote = sym<nvmlReturn_t (*)(nvmlDevice_t, unsigned, NvmlPciInfo*)>(
      lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  if (!init || !shutdown || !count || !by_index || !name || !uuid || !pci || !mem || !ancestor) {
    why = fmt::format("NVML ({}) lacks a needed symbol", library);
    dlclose(lib);
    return false;
  }
  if (init() != 0) {
    why = "nvmlInit_v2 failed (no driver loaded?)";
    dlclose(lib);
    return false;
  }
  unsigned n = 0;
  bool ok = count(&n) == 0;
  std::vector<nvmlDevice_t> dev(n);
  GpuTopology t;
  for (unsigned i = 0; ok && i < n; ++i) {
    ok = by_index(i, &dev[i]) == 0;
    GpuInfo g;
    g.index = static_cast<int>(i);
    char buf[96] = {};
    if (ok && name(dev[i], buf, sizeof buf) == 0) g.name = buf;
    if (ok && uuid(dev[i], buf, sizeof buf) == 0) g.uuid = buf;
    NvmlPciInfo p{};
    if (ok && pci(dev[i], &p) == 0) g.pci_bus_id = p.bus_id;
    NvmlMemory m{};
    if (ok && mem(dev[i], &m) == 0) g.memory_mib = m.total >> 20;
    t.gpus.push_back(g);
  }
  if (!ok) {
    shutdown();
    dlclose(lib);
    why = "NVML failed to list the devices";
    return false;
  }
  // NVLinks: links whose remote end is another GPU count for that pair; links to an NVSwitch
  // (a remote bus id that is no GPU) connect a GPU to all GPUs on the switch fabric, so a pair
  // gets min(switch links of each), which is what nvidia-smi prints (NV18 on HGX H100).
  std::map<std::string, int> by_bus;
  for (const auto& g : t.gpus) by_bus[g.pci_bus_id] = g.index;
  std::vector<std::vector<int>> direct(n, std::vector<int>(n, 0));
  std::vector<int> switch_links(n, 0);
  if (link_state && link_remote) {
    for (unsigned i = 0; i < n; ++i)
      for (unsigned l = 0; l < 18; ++l) {
        int active = 0;
        NvmlPciInfo p{};
        if (link_state(dev[i], l, &active) != 0 || !active) continue;
        if (link_remote(dev[i], l, &p) != 0) continue;
        auto it = by_bus.find(p.bus_id);
        if (it != by_bus.end())
          ++direct[i][it->second];
        else
          ++switch_links[i];
      }
  }
  t.gpu_links.assign(n, std::vector<Link>(n));
  t.gpu_nic_links.assign(n, {});
  for (unsigned i = 0; i < n; ++i)
    for (unsigned j = 0; j < n; ++j) {
      if (i == j) {
        t.gpu_links[i][j] = Link{LinkKind::kSelf, 0};
        continue;
      }
      int nv = direct[i][j] + std::min(switch_links[i], switch_links[j]);
      if (nv > 0) {
        t.gpu_links[i][j] = Link{LinkKind::kNvLink, nv};
        continue;
      }
      int level = 50;
      ancestor(dev[i], dev[j], &level);
      // nvmlGpuTopologyLevel_t: 0 internal, 10 single switch, 20 multiple, 30 host bridge,
      // 40 NUMA node, 50 system.
      LinkKind k = level <= 10   ? LinkKind::kPix
                   : level <= 20 ? LinkKind::kPxb
                   : level <= 30 ? LinkKind::kPhb
                   : level <= 40 ? LinkKind::kNode
                                 : LinkKind::kSys;
      t.gpu_links[i][j] = Link{k, 0};
    }
  shutdown();
  dlclose(lib);
  out = std::move(t);
  return true;
}

GpuDiscovery discover_gpus(const DiscoveryOptions& options) {
  GpuDiscovery d;
  std::string smi = find_executable(options.nvidia_smi);
  if (!smi.empty()) {
    auto run = [&](std::vector<std::string> argv, const std::string& what) {
      argv.insert(argv.begin(), smi);
      CommandResult r = run_command(argv, options.timeout_ms);
      if (r.timed_out) {
        throw PlacementError(
            fmt::format("{} {} did not finish within {} ms", smi, what, options.timeout_ms));
      }
      if (r.exit_code != 0) {
        std::string err = r.err.substr(0, 500);
        while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
        throw PlacementError(fmt::format("{} {} failed (exit {}): {}", smi, what, r.exit_code,
                                         err.empty() ? r.out.substr(0, 500) : err));
      }
      return r.out;
    };
    std::string topo_text = run({"topo", "-m"}, "topo -m");
    std::string csv = run({std::string("--query-gpu=") + kSmiGpuQuery,
                           "--format=csv,noheader,nounits"},
                          "--query-gpu");
    d.topology = parse_topo_matrix(topo_text, smi + " topo -m");
    merge_gpu_inventory(d.topology, parse_smi_csv(csv, smi + " --query-gpu"));
    d.source = "nvidia-smi";
    return d;
  }
  d.notes.push_back(fmt::format("{} not found on PATH", options.nvidia_smi));
  if (options.use_nvml) {
    std::string why;
    if (discover_gpus_nvml(options.nvml_library, d.topology, why)) {
      d.source = "nvml";
      return d;
    }
    d.notes.push_back(why);
  }
  d.source = "none";
  return d;
}

}  // namespace ring::placement
