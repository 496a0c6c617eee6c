// What a node's GPUs are and how they are connected, as nvidia-smi reports it.
//
//   GpuTopology t = parse_topo_matrix(read("nvidia-smi topo -m"), "topo.txt");
//   merge_gpu_inventory(t, parse_smi_csv(read("nvidia-smi --query-gpu=" kSmiGpuQuery
//                                             " --format=csv,noheader,nounits"), "gpus.csv"));
//
// Parsing is pure (text in, structs out) so every machine type can be tested from recorded
// output; daemon/placement/discovery.h runs nvidia-smi. Errors are TopologyParseError with the
// source name, the line and what could not be read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ring::placement {

// How two devices are connected, best first (the order of `nvidia-smi topo -m`'s legend).
enum class LinkKind {
  kSelf,    // X
  kNvLink,  // NV# : a bonded set of # NVLinks (through NVSwitch or direct)
  kPix,     // at most one PCIe bridge (same PCIe switch)
  kPxb,     // several PCIe bridges, no host bridge (switches under one switch)
  kPhb,     // through a PCIe host bridge (the CPU)
  kNode,    // between host bridges within one NUMA node
  kSys,     // across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)
};

struct Link {
  LinkKind kind = LinkKind::kSys;
  int nvlinks = 0;  // number of links for kNvLink, else 0
  bool operator==(const Link&) const = default;
};

// "NV12", "PIX", "SYS", "X" (also "PHB", "PXB", "NODE"; "SOC" is the pre-2017 name of SYS).
std::optional<Link> parse_link(std::string_view token);
std::string to_string(const Link& link);

struct GpuInfo {
  int index = -1;                 // nvidia-smi index (PCI bus order), the GPU# of topo -m
  std::string name;               // "NVIDIA H100 80GB HBM3"; empty when unknown
  std::string uuid;               // "GPU-..."; empty when unknown
  std::string pci_bus_id;         // "00000000:18:00.0"; empty when unknown
  uint64_t memory_mib = 0;        // total framebuffer memory, MiB; 0 when unknown
  int numa_node = -1;             // NUMA node of the GPU's host bridge; -1 when unknown
  std::vector<int> cpu_affinity;  // CPUs (OS indices) near the GPU; empty when unknown
};

struct NicInfo {
  std::string label;   // "NIC0"
  std::string device;  // "mlx5_0" from the NIC legend; empty when absent
};

struct GpuTopology {
  std::vector<GpuInfo> gpus;  // gpus[i].index == i
  std::vector<NicInfo> nics;
  // gpu_links[i][j]: connection between GPU i and GPU j; [i][i] is kSelf. Square, size gpus.
  std::vector<std::vector<Link>> gpu_links;
  // gpu_nic_links[i][k]: connection between GPU i and NIC k. Empty rows when there are no NICs.
  std::vector<std::vector<Link>> gpu_nic_links;
};

// Parses `nvidia-smi topo -m` text: header of GPU#/NIC#/"CPU Affinity"/"NUMA Affinity"/"GPU NUMA
// ID" columns (tabs or spaces), one row per device, the legend and the optional "NIC Legend".
// Throws TopologyParseError("<source>:<line>: ...") on anything it cannot read.
GpuTopology parse_topo_matrix(std::string_view text, const std::string& source);

// The fields asked of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` (name last, so
// that a comma in a name cannot shift the others).
inline constexpr const char* kSmiGpuQuery = "index,uuid,pci.bus_id,memory.total,name";

// Parses that CSV: one line per GPU, "<index>, <uuid>, <bus id>, <MiB>, <name>", in index order
// (nvidia-smi's index is PCI bus order, the GPU# of topo -m). "[N/A]", "[Not Supported]" and
// "N/A" leave a field unknown; blank lines are skipped. Throws TopologyParseError
// ("<source>:<line>: ...") naming the field for a wrong field count, an index out of order or a
// memory size that is not a whole number.
std::vector<GpuInfo> parse_smi_csv(std::string_view text, const std::string& source);

// Adds name, UUID, bus id and memory from the --query-gpu inventory to a topology parsed from topo -m
// (matched by index). Throws when the two disagree on the number of GPUs.
void merge_gpu_inventory(GpuTopology& topology, const std::vector<GpuInfo>& inventory);

// "0-47,96-143" -> {0..47, 96..143}. Throws TopologyParseError on bad syntax.
std::vector<int> parse_cpu_list(std::string_view text);
// {0,1,2,5} -> "0-2,5" (sorted, duplicates removed).
std::string format_cpu_list(std::vector<int> cpus);

}  // namespace ring::placement
