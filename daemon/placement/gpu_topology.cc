#include "daemon/placement/gpu_topology.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "daemon/placement/errors.h"

namespace ring::placement {

namespace {

bool parse_int(std::string_view s, int& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

std::vector<std::string_view> split_ws(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    size_t b = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > b) out.push_back(line.substr(b, i - b));
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// "GPU12" -> 12 for the given prefix; -1 otherwise.
int numbered(std::string_view token, std::string_view prefix) {
  if (token.substr(0, prefix.size()) != prefix) return -1;
  int n = -1;
  return parse_int(token.substr(prefix.size()), n) && n >= 0 ? n : -1;
}

bool is_unknown(std::string_view v) {
  return v == "N/A" || v == "n/a" || v == "-";
}

}  // namespace

std::optional<Link> parse_link(std::string_view t) {
  if (t == "X") return Link{LinkKind::kSelf, 0};
  if (t == "PIX") return Link{LinkKind::kPix, 0};
  if (t == "PXB") return Link{LinkKind::kPxb, 0};
  if (t == "PHB") return Link{LinkKind::kPhb, 0};
  if (t == "NODE") return Link{LinkKind::kNode, 0};
  if (t == "SYS" || t == "SOC") return Link{LinkKind::kSys, 0};
  if (t.size() > 2 && t.substr(0, 2) == "NV") {
    int n = 0;
    if (parse_int(t.substr(2), n) && n > 0 && n <= 1024) return Link{LinkKind::kNvLink, n};
  }
  return std::nullopt;
}

std::string to_string(const Link& link) {
  switch (link.kind) {
    case LinkKind::kSelf:
      return "X";
    case LinkKind::kNvLink:
      return fmt::format("NV{}", link.nvlinks);
    case LinkKind::kPix:
      return "PIX";
    case LinkKind::kPxb:
      return "PXB";
    case LinkKind::kPhb:
      return "PHB";
    case LinkKind::kNode:
      return "NODE";
    case LinkKind::kSys:
      return "SYS";
  }
  return "?";
}

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> out;
  std::string_view rest = trim(text);
  if (rest.empty()) throw TopologyParseError("empty CPU list");
  // Bounds the output: a corrupt "0-2000000000" must not allocate gigabytes.
  constexpr int kMaxCpu = 1 << 20;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    size_t dash = item.find('-');
    int lo = 0, hi = 0;
    bool ok = dash == std::string_view::npos
                  ? parse_int(item, lo) && (hi = lo, true)
                  : parse_int(item.substr(0, dash), lo) && parse_int(item.substr(dash + 1), hi);
    if (!ok || lo < 0 || hi < lo || hi > kMaxCpu) {
      throw TopologyParseError(
          fmt::format("bad CPU list item '{}' in '{}' (expected N or N-M, "
                      "0 <= N <= M)",
                      item, trim(text)));
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpu_list(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

GpuTopology parse_topo_matrix(std::string_view text, const std::string& source) {
  auto fail = [&](int line, const std::string& what) -> TopologyParseError {
    return TopologyParseError(fmt::format("{}:{}: nvidia-smi topo -m: {}", source, line, what));
  };

  // Split into lines once, keeping 1-based numbers for messages.
  std::vector<std::string_view> lines;
  for (size_t b = 0; b <= text.size();) {
    size_t e = text.find('\n', b);
    if (e == std::string_view::npos) e = text.size();
    lines.push_back(text.substr(b, e - b));
    b = e + 1;
  }

  // Header: the first non-empty line. Device columns (GPU#, NIC#, or NIC device names such as
  // mlx5_0 in drivers before 450) come first, then the multi-word trailing columns.
  size_t li = 0;
  while (li < lines.size() && trim(lines[li]).empty()) ++li;
  if (li == lines.size()) throw fail(1, "empty output (no header line)");
  const int header_line = static_cast<int>(li) + 1;
  std::vector<std::string_view> head = split_ws(lines[li]);
  std::vector<std::string> devices;
  enum Trailing { kCpuAffinity, kNumaAffinity, kGpuNumaId };
  std::vector<Trailing> trailing;
  for (size_t t = 0; t < head.size();) {
    auto at = [&](size_t k, std::string_view w) { return t + k < head.size() && head[t + k] == w; };
    if (at(0, "CPU") && at(1, "Affinity")) {
      trailing.push_back(kCpuAffinity);
      t += 2;
    } else if (at(0, "NUMA") && at(1, "Affinity")) {
      trailing.push_back(kNumaAffinity);
      t += 2;
    } else if (at(0, "GPU") && at(1, "NUMA") && at(2, "ID")) {
      trailing.push_back(kGpuNumaId);
      t += 3;
    } else if (!trailing.empty()) {
      throw fail(header_line,
                 fmt::format("unexpected column '{}' after the affinity columns", head[t]));
    } else {
      devices.emplace_back(head[t]);
      t += 1;
    }
  }
  GpuTopology topo;
  std::vector<int> gpu_col, nic_col;  // device column -> GPU/NIC number, or -1
  for (size_t c = 0; c < devices.size(); ++c) {
    int g = numbered(devices[c], "GPU");
    if (g >= 0) {
      if (g != static_cast<int>(topo.gpus.size())) {
        throw fail(header_line, fmt::format("column {} is out of order (expected GPU{})",
                                            devices[c], topo.gpus.size()));
      }
      GpuInfo info;
      info.index = g;
      topo.gpus.push_back(info);
      gpu_col.push_back(g);
      nic_col.push_back(-1);
    } else {
      // Anything else in the device part is a NIC column: "NIC3" (drivers >= 450) or the RDMA
      // device name itself ("mlx5_0") in older drivers.
      gpu_col.push_back(-1);
      nic_col.push_back(static_cast<int>(topo.nics.size()));
      bool generic = numbered(devices[c], "NIC") >= 0;
      topo.nics.push_back(NicInfo{devices[c], generic ? "" : devices[c]});
    }
  }
  if (topo.gpus.empty()) {
    throw fail(header_line, fmt::format("no GPU columns in header '{}'", trim(lines[li])));
  }
  const size_t n = topo.gpus.size();
  topo.gpu_links.assign(n, std::vector<Link>(n));
  topo.gpu_nic_links.assign(n, std::vector<Link>(topo.nics.size()));
  std::vector<bool> seen_gpu(n, false);
  std::vector<bool> seen_nic(topo.nics.size(), false);

  // Rows until the legend.
  for (++li; li < lines.size(); ++li) {
    const int line_no = static_cast<int>(li) + 1;
    std::string_view line = trim(lines[li]);
    if (line.empty()) continue;
    if (line.rfind("Legend", 0) == 0 || line.rfind("NIC Legend", 0) == 0) break;
    std::vector<std::string_view> tok = split_ws(line);
    std::string_view label = tok[0];
    auto col = std::find(devices.begin(), devices.end(), label);
    if (col == devices.end()) {
      throw fail(line_no, fmt::format("row '{}' names no column of the header (line {})", label,
                                      header_line));
    }
    size_t row = static_cast<size_t>(col - devices.begin());
    if (tok.size() < 1 + devices.size()) {
      throw fail(line_no, fmt::format("row {} has {} link entries, expected {}", label,
                                      tok.size() - 1, devices.size()));
    }
    size_t extra = tok.size() - 1 - devices.size();
    // NIC rows carry no affinity columns; GPU rows carry up to all of them.
    if (extra > (gpu_col[row] >= 0 ? trailing.size() : 0)) {
      throw fail(line_no,
                 fmt::format("row {} has {} entries, expected at most {}", label, tok.size() - 1,
                             devices.size() + (gpu_col[row] >= 0 ? trailing.size() : 0)));
    }
    for (size_t c = 0; c < devices.size(); ++c) {
      std::optional<Link> l = parse_link(tok[1 + c]);
      if (!l) {
        throw fail(line_no, fmt::format("row {}, column {}: unknown link '{}' (expected X, NV#, "
                                        "PIX, PXB, PHB, NODE or SYS)",
                                        label, devices[c], tok[1 + c]));
      }
      if ((c == row) != (l->kind == LinkKind::kSelf)) {
        throw fail(line_no, fmt::format("row {}, column {}: '{}' {}", label, devices[c], tok[1 + c],
                                        c == row ? "on the diagonal (expected X)"
                                                 : "off the diagonal (X means self)"));
      }
      int gr = gpu_col[row], gc = gpu_col[c];
      if (gr >= 0 && gc >= 0) topo.gpu_links[gr][gc] = *l;
      if (gr >= 0 && nic_col[c] >= 0) topo.gpu_nic_links[gr][nic_col[c]] = *l;
      // A NIC row repeats the GPU-NIC links; the GPU rows are authoritative.
    }
    if (gpu_col[row] >= 0) {
      if (seen_gpu[gpu_col[row]]) throw fail(line_no, fmt::format("duplicate row {}", label));
      seen_gpu[gpu_col[row]] = true;
      GpuInfo& g = topo.gpus[gpu_col[row]];
      for (size_t k = 0; k < extra; ++k) {
        std::string_view v = tok[1 + devices.size() + k];
        if (is_unknown(v)) continue;
        try {
          switch (trailing[k]) {
            case kCpuAffinity:
              g.cpu_affinity = parse_cpu_list(v);
              break;
            case kNumaAffinity: {
              // One node is the usual case; a list ("0-1") means no single home node.
              std::vector<int> nodes = parse_cpu_list(v);
              g.numa_node = nodes.size() == 1 ? nodes[0] : -1;
              break;
            }
            case kGpuNumaId:
              break;  // the GPU's own memory node (Grace/CDMM); not a CPU node
          }
        } catch (const TopologyParseError& e) {
          throw fail(line_no, fmt::format("row {}: {}", label, e.what()));
        }
      }
    } else {
      seen_nic[nic_col[row]] = true;
    }
  }
  for (size_t g = 0; g < n; ++g) {
    if (!seen_gpu[g]) throw fail(static_cast<int>(li), fmt::format("no row for GPU{}", g));
  }

  // Legends: "NIC Legend:" then "  NIC0: mlx5_0".
  bool nic_legend = false;
  for (; li < lines.size(); ++li) {
    std::string_view line = trim(lines[li]);
    if (line.rfind("NIC Legend", 0) == 0) {
      nic_legend = true;
      continue;
    }
    if (!nic_legend || line.empty()) continue;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view label = trim(line.substr(0, colon));
    std::string_view dev = trim(line.substr(colon + 1));
    for (auto& nic : topo.nics)
      if (nic.label == label) nic.device = std::string(dev);
  }
  return topo;
}

std::vector<GpuInfo> parse_smi_csv(std::string_view text, const std::string& source) {
  // The fields of kSmiGpuQuery, in order. name is last: everything after the fourth separator
  // is the name, so a name with ", " in it still parses.
  static constexpr std::string_view kFields[] = {"index", "uuid", "pci.bus_id", "memory.total",
                                                 "name"};
  constexpr size_t kCount = std::size(kFields);
  std::vector<GpuInfo> out;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    auto fail = [&](const std::string& what) {
      return TopologyParseError(
          fmt::format("{}:{}: nvidia-smi --query-gpu={}: {} (line '{}')", source, line_no,
                      kSmiGpuQuery, what, line));
    };
    std::vector<std::string_view> v;
    std::string_view rest = line;
    while (v.size() + 1 < kCount) {
      size_t comma = rest.find(',');
      if (comma == std::string_view::npos) break;
      v.push_back(trim(rest.substr(0, comma)));
      rest = rest.substr(comma + 1);
    }
    v.push_back(trim(rest));
    if (v.size() != kCount)
      throw fail(fmt::format("{} fields, expected {} ({})", v.size(), kCount,
                             fmt::join(kFields, ", ")));
    auto known = [](std::string_view f) {
      return !(is_unknown(f) || f == "[N/A]" || f == "[Not Supported]" || f.empty());
    };
    GpuInfo g;
    if (!parse_int(v[0], g.index) || g.index != static_cast<int>(out.size()))
      throw fail(fmt::format("field index is '{}', expected {} (GPUs in index order)", v[0],
                             out.size()));
    if (known(v[1])) g.uuid = std::string(v[1]);
    if (known(v[2])) g.pci_bus_id = std::string(v[2]);
    if (known(v[3])) {
      int mib = -1;
      if (!parse_int(v[3], mib) || mib < 0)
        throw fail(fmt::format("field memory.total is '{}', expected a whole number of MiB "
                               "(--format=csv,noheader,nounits)",
                               v[3]));
      g.memory_mib = static_cast<uint64_t>(mib);
    }
    if (known(v[4])) g.name = std::string(v[4]);
    out.push_back(std::move(g));
  }
  return out;
}

void merge_gpu_inventory(GpuTopology& topology, const std::vector<GpuInfo>& inventory) {
  if (inventory.size() != topology.gpus.size()) {
    throw TopologyParseError(fmt::format("nvidia-smi --query-gpu lists {} GPUs but topo -m lists {}",
                                         inventory.size(), topology.gpus.size()));
  }
  for (size_t i = 0; i < inventory.size(); ++i) {
    GpuInfo& g = topology.gpus[i];
    g.name = inventory[i].name;
    g.uuid = inventory[i].uuid;
    g.pci_bus_id = inventory[i].pci_bus_id;
    g.memory_mib = inventory[i].memory_mib;
    if (g.numa_node < 0) g.numa_node = inventory[i].numa_node;
    if (g.cpu_affinity.empty()) g.cpu_affinity = inventory[i].cpu_affinity;
  }
}

}  // namespace ring::placement
