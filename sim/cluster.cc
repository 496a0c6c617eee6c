#include "sim/cluster.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include "common/files/read_file.h"
#include "common/topology/hostlist.h"
#include "fmt/format.h"

namespace ring::sim {

namespace {

std::string node_name(int slot) { return fmt::format("n{:05d}", slot); }

[[noreturn]] void fail(const std::string& what) { throw topology::TopologyError(what); }

// A regular file's text; errors name the file.
std::string read_text(const std::string& path) {
  try {
    return files::read_regular_file(path, size_t{256} << 20);
  } catch (const files::ReadError& e) {
    fail(std::string("the topology file ") + e.what());
  }
}

}  // namespace

void torus_dims(int n, int out[3]) {
  int best[3] = {n, 1, 1};
  double best_spread = 1e300;
  for (int x = 1; x <= n; ++x) {
    if (n % x) continue;
    for (int y = 1; y <= x; ++y) {
      if ((n / x) % y) continue;
      const int z = n / x / y;
      if (z > y) continue;
      const double spread = static_cast<double>(x) - z;
      if (spread < best_spread) best_spread = spread, best[0] = x, best[1] = y, best[2] = z;
    }
  }
  std::copy(best, best + 3, out);
}

int Cluster::node_index(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void Cluster::add_node_gpus(int node, int attach) {
  const double nic = o_.node_bw / gpn_;
  int nvs = -1;
  if (gpn_ > 1) nvs = net_.add_vertex(fmt::format("{}/nvswitch", node_names_[node]));
  for (int k = 0; k < gpn_; ++k) {
    const int g = net_.add_vertex(fmt::format("{}/gpu{}", node_names_[node], k));
    gpu_vertex_[node * gpn_ + k] = g;
    if (nvs >= 0) {
      gpu_up_[node * gpn_ + k] = net_.add_duplex(g, nvs, o_.nvlink_bw, o_.nvlink_latency, "nvlink");
      gpu_down_[node * gpn_ + k] = gpu_up_[node * gpn_ + k] + 1;
    }
    if (attach >= 0) {
      nic_up_[node * gpn_ + k] = net_.add_duplex(g, attach, nic, o_.nic_latency, "nic");
      nic_down_[node * gpn_ + k] = nic_up_[node * gpn_ + k] + 1;
    }
  }
}

std::vector<int> Cluster::nic_links(int node) const {
  std::vector<int> out;
  for (int k = 0; k < gpn_; ++k)
    for (int id : {nic_up_[node * gpn_ + k], nic_down_[node * gpn_ + k]})
      if (id >= 0) out.push_back(id);
  return out;
}

std::vector<int> Cluster::bfs_cached(int from, int to) const {
  auto key = std::make_pair(from, to);
  auto it = bfs_cache_.find(key);
  if (it != bfs_cache_.end()) return it->second;
  auto r = net_.shortest_route(from, to);
  bfs_cache_.emplace(key, r);
  return r;
}

std::vector<int> Cluster::route(int na, int la, int nb, int lb) const {
  if (na == nb) {
    if (la == lb) return {};
    return {gpu_up_[na * gpn_ + la], gpu_down_[na * gpn_ + lb]};
  }
  return inter_node(na, la, nb, lb);
}

std::vector<int> Cluster::inter_node(int na, int la, int nb, int lb) const {
  std::vector<int> r;
  r.push_back(nic_up_[na * gpn_ + la]);
  const int sa = slot_of_[na], sb = slot_of_[nb];
  switch (o_.shape) {
    case Shape::kFatTree: {
      const int pa = sa / o_.pod_nodes, pb = sb / o_.pod_nodes;
      if (!(pa == pb && la == lb)) {
        r.push_back(leaf_up_[pa * gpn_ + la]);
        r.push_back(leaf_down_[pb * gpn_ + lb]);
      }
      break;
    }
    case Shape::kDragonflyPlus: {
      const int per_group = o_.group_routers * o_.router_nodes;
      const int ga = sa / per_group, gb = sb / per_group;
      const int ra = sa / o_.router_nodes, rb = sb / o_.router_nodes;  // global router index
      if (ra != rb) {
        r.push_back(router_up_[ra]);
        if (ga != gb) {
          if (o_.valiant && groups_ > 2) {
            // Intermediate group: a fixed pseudo-random choice per pair, never ga or gb.
            uint64_t h = (static_cast<uint64_t>(sa) * 0x9E3779B97F4A7C15ull) ^
                         (static_cast<uint64_t>(sb) + 0x632BE59BD9B4E019ull);
            h ^= h >> 29;
            int gm = static_cast<int>(h % static_cast<uint64_t>(groups_ - 2));
            for (int g : {std::min(ga, gb), std::max(ga, gb)})
              if (gm >= g) ++gm;
            r.push_back(global_[ga * groups_ + gm]);
            r.push_back(global_[gm * groups_ + gb]);
          } else {
            r.push_back(global_[ga * groups_ + gb]);
          }
        }
        r.push_back(router_down_[rb]);
      }
      break;
    }
    case Shape::kTorus3d: {
      int ca[3] = {sa % dims_[0], (sa / dims_[0]) % dims_[1], sa / (dims_[0] * dims_[1])};
      const int cb[3] = {sb % dims_[0], (sb / dims_[0]) % dims_[1], sb / (dims_[0] * dims_[1])};
      for (int d = 0; d < 3; ++d) {
        const int n = dims_[d];
        const int fwd = ((cb[d] - ca[d]) % n + n) % n;
        const bool pos = fwd <= n - fwd;
        const int steps = pos ? fwd : n - fwd;
        for (int s = 0; s < steps; ++s) {
          const int slot = ca[0] + dims_[0] * (ca[1] + dims_[1] * ca[2]);
          r.push_back(torus_link_[slot * 6 + 2 * d + (pos ? 0 : 1)]);
          ca[d] = ((ca[d] + (pos ? 1 : -1)) % n + n) % n;
        }
      }
      break;
    }
    case Shape::kGraphFile:
    case Shape::kSlurmConf: {
      auto mid = bfs_cached(node_vertex_[na], node_vertex_[nb]);
      r.insert(r.end(), mid.begin(), mid.end());
      break;
    }
  }
  r.push_back(nic_down_[nb * gpn_ + lb]);
  return r;
}

namespace {

double gb(double x) { return x * 1e9; }

// Reads the graph YAML. Keys: gpus_per_node, nic_gbytes_per_s, host_cores, nodes, switches,
// links.
struct GraphFile {
  int gpus_per_node = 0;
  double nic = 0;
  double host_cores = 0;
  std::vector<std::string> nodes, switches;
  struct L {
    std::string from, to;
    double bw = 0, lat = 0;
    bool duplex = true;
    int line = 0;
  };
  std::vector<L> links;
};

GraphFile parse_graph(const std::string& path) {
  const std::string text = read_text(path);
  YAML::Node root;
  auto where = [&](const YAML::Node& n) {
    return fmt::format("{}:{}:{}", path, n.Mark().line + 1, n.Mark().column + 1);
  };
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(fmt::format("{}:{}:{}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (!root.IsMap()) fail(fmt::format("{}: a topology graph is a mapping with nodes and links", path));
  GraphFile g;
  static const std::set<std::string> known = {"gpus_per_node", "nic_gbytes_per_s", "host_cores",
                                              "nodes", "switches", "links"};
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (!known.count(k))
      fail(fmt::format("{}: unknown key '{}' (known: gpus_per_node, nic_gbytes_per_s, "
                       "host_cores, nodes, switches, links)", where(it->first), k));
  }
  try {
    if (root["gpus_per_node"]) g.gpus_per_node = root["gpus_per_node"].as<int>();
    if (root["nic_gbytes_per_s"]) g.nic = root["nic_gbytes_per_s"].as<double>();
    if (root["host_cores"]) {
      g.host_cores = root["host_cores"].as<double>();
      if (!(g.host_cores > 0))
        fail(fmt::format("{}: host_cores must be > 0 (the cores of the one machine every node "
                         "of the graph runs on)", where(root["host_cores"])));
    }
    if (!root["nodes"] || !root["nodes"].IsSequence())
      fail(fmt::format("{}: 'nodes' (a list of node names) is required", path));
    for (const auto& n : root["nodes"]) {
      for (const auto& h : topology::expand_hostlist(n.as<std::string>())) g.nodes.push_back(h);
    }
    if (root["switches"])
      for (const auto& n : root["switches"]) g.switches.push_back(n.as<std::string>());
    if (!root["links"] || !root["links"].IsSequence())
      fail(fmt::format("{}: 'links' (a list of {{from, to, gbytes_per_s, latency_us}}) is "
                       "required", path));
    for (const auto& l : root["links"]) {
      if (!l.IsMap()) fail(fmt::format("{}: a link is a mapping {{from, to, gbytes_per_s, latency_us}}", where(l)));
      for (auto it = l.begin(); it != l.end(); ++it) {
        const std::string k = it->first.as<std::string>();
        if (k != "from" && k != "to" && k != "gbytes_per_s" && k != "latency_us" && k != "duplex")
          fail(fmt::format("{}: unknown link key '{}' (known: from, to, gbytes_per_s, "
                           "latency_us, duplex)", where(it->first), k));
      }
      GraphFile::L x;
      x.line = l.Mark().line + 1;
      if (!l["from"] || !l["to"] || !l["gbytes_per_s"])
        fail(fmt::format("{}: a link needs from, to and gbytes_per_s", where(l)));
      x.from = l["from"].as<std::string>();
      x.to = l["to"].as<std::string>();
      x.bw = l["gbytes_per_s"].as<double>();
      x.lat = l["latency_us"] ? l["latency_us"].as<double>() : 1.0;
      x.duplex = l["duplex"] ? l["duplex"].as<bool>() : true;
      if (!(x.bw > 0) || !(x.lat >= 0))
        fail(fmt::format("{}: link {} -> {}: gbytes_per_s must be > 0 and latency_us >= 0",
                         where(l), x.from, x.to));
      g.links.push_back(x);
    }
  } catch (const YAML::Exception& e) {
    fail(fmt::format("{}:{}:{}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (g.nodes.empty()) fail(fmt::format("{}: 'nodes' is empty", path));
  return g;
}

// LinkSpeed=X of each SwitchName line of a topology.conf (continuations joined).
std::map<std::string, double> slurm_link_speeds(const std::string& text) {
  std::map<std::string, double> out;
  std::string joined;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {
      ++i;
      joined += ' ';
    } else {
      joined += text[i];
    }
  }
  static const std::regex name_re(R"(SwitchName=(\S+))", std::regex::icase);
  static const std::regex speed_re(R"(LinkSpeed=([0-9.]+))", std::regex::icase);
  size_t pos = 0;
  while (pos < joined.size()) {
    size_t eol = joined.find('\n', pos);
    if (eol == std::string::npos) eol = joined.size();
    std::string line = joined.substr(pos, eol - pos);
    line = line.substr(0, line.find('#'));
    std::smatch m, s;
    if (std::regex_search(line, m, name_re) && std::regex_search(line, s, speed_re))
      out[m[1]] = std::stod(s[1]);
    pos = eol + 1;
  }
  return out;
}

}  // namespace

// One builder per topology shape (Cluster::build names the nodes, then hands over to one): the
// network of links, the topology the ring is ordered by, the description.
struct ClusterBuilder {
  Cluster& C;
  const ClusterOptions& o;
  int nodes;
  const std::vector<std::string>& slot_names;  // wiring position -> node name
  const std::vector<int>& node_at_slot;        // wiring position -> node index
  void fat_tree();
  void dragonfly_plus();
  void torus3d();
  void graph_file(const GraphFile& graph);
  void slurm_conf(const std::string& slurm_text, const std::vector<topology::Switch>& slurm_switches);
};

void ClusterBuilder::fat_tree() {
  Network& net = C.net_;
  const int gpn = C.gpn_;
  const double nic = C.o_.node_bw / gpn;
  if (o.pod_nodes < 1) fail("fat-tree: pod size must be >= 1");
  const int pods = (nodes + o.pod_nodes - 1) / o.pod_nodes;
  const int core = net.add_vertex("core");
  C.leaf_up_.assign(static_cast<size_t>(pods) * gpn, -1);
  C.leaf_down_ = C.leaf_up_;
  std::vector<int> leaf(static_cast<size_t>(pods) * gpn);
  std::vector<topology::Switch> sw;
  sw.push_back({"core", -1, {}, {}, 0, 0});
  for (int p = 0; p < pods; ++p) {
    const int in_pod = std::min(o.pod_nodes, nodes - p * o.pod_nodes);
    topology::Switch s;
    s.name = fmt::format("pod{:04d}", p);
    s.parent = 0;
    for (int k = 0; k < gpn; ++k) {
      leaf[p * gpn + k] = net.add_vertex(fmt::format("pod{}/rail{}", p, k));
      const double up = in_pod * nic / o.oversubscription;
      C.leaf_up_[p * gpn + k] = net.add_link(leaf[p * gpn + k], core, up, o.switch_latency, "uplink");
      C.leaf_down_[p * gpn + k] = net.add_link(core, leaf[p * gpn + k], up, o.switch_latency, "uplink");
    }
    for (int j = 0; j < in_pod; ++j) s.nodes.push_back(slot_names[p * o.pod_nodes + j]);
    sw.push_back(s);
  }
  for (int s = 0; s < nodes; ++s) {
    const int n = node_at_slot[s];
    const int p = s / o.pod_nodes;
    C.add_node_gpus(n, -1);
    for (int k = 0; k < gpn; ++k) {
      const int id = net.add_duplex(C.gpu_vertex_[n * gpn + k], leaf[p * gpn + k], nic, o.nic_latency, "nic");
      C.nic_up_[n * gpn + k] = id;
      C.nic_down_[n * gpn + k] = id + 1;
    }
  }
  C.topo_ = std::make_unique<topology::ClusterTopology>(topology::ClusterTopology::tree(sw));
  C.describe_ = fmt::format(
      "fat-tree: {} nodes x {} GPUs, rail-optimised, pods of {} nodes, {:g} GB/s per node, "
      "oversubscription {:g}:1, NVLink {:g} GB/s per GPU",
      nodes, gpn, o.pod_nodes, C.o_.node_bw / 1e9, o.oversubscription, o.nvlink_bw / 1e9);
}

void ClusterBuilder::dragonfly_plus() {
  Network& net = C.net_;
  const int gpn = C.gpn_;
  if (o.group_routers < 1 || o.router_nodes < 1) fail("dragonfly+: routers and nodes per router must be >= 1");
  const int per_group = o.group_routers * o.router_nodes;
  const int groups = (nodes + per_group - 1) / per_group;
  const int routers = (nodes + o.router_nodes - 1) / o.router_nodes;
  C.groups_ = groups;
  std::vector<int> spine(groups), router(routers);
  std::vector<topology::Switch> sw;
  for (int g = 0; g < groups; ++g) {
    spine[g] = net.add_vertex(fmt::format("group{}/spine", g));
    sw.push_back({fmt::format("g{:04d}", g), -1, {}, {}, 0, 0});
  }
  C.router_up_.assign(routers, -1);
  C.router_down_.assign(routers, -1);
  for (int r = 0; r < routers; ++r) {
    const int g = r / o.group_routers;
    router[r] = net.add_vertex(fmt::format("group{}/router{}", g, r % o.group_routers));
    const double bw = o.router_nodes * C.o_.node_bw;  // non-blocking inside a group
    C.router_up_[r] = net.add_link(router[r], spine[g], bw, o.switch_latency, "local");
    C.router_down_[r] = net.add_link(spine[g], router[r], bw, o.switch_latency, "local");
    topology::Switch s;
    s.name = fmt::format("g{:04d}r{:03d}", g, r % o.group_routers);
    s.parent = g;
    for (int j = 0; j < o.router_nodes && r * o.router_nodes + j < nodes; ++j)
      s.nodes.push_back(slot_names[r * o.router_nodes + j]);
    sw.push_back(s);
  }
  C.global_.assign(static_cast<size_t>(groups) * groups, -1);
  if (groups > 1) {
    const double gbw = per_group * C.o_.node_bw / (groups - 1) / o.oversubscription;
    for (int a = 0; a < groups; ++a)
      for (int b = 0; b < groups; ++b)
        if (a != b) C.global_[a * groups + b] = net.add_link(spine[a], spine[b], gbw, o.switch_latency, "global");
  }
  for (int s = 0; s < nodes; ++s) C.add_node_gpus(node_at_slot[s], router[s / o.router_nodes]);
  C.topo_ = std::make_unique<topology::ClusterTopology>(
      topology::ClusterTopology::tree(sw, topology::ClusterTopology::Kind::kDragonfly));
  C.describe_ = fmt::format(
      "dragonfly+: {} nodes x {} GPUs, {} groups of {} routers x {} nodes, {:g} GB/s per "
      "node, global links {:g} GB/s per group pair, {} routing, NVLink {:g} GB/s per GPU",
      nodes, gpn, groups, o.group_routers, o.router_nodes, C.o_.node_bw / 1e9,
      groups > 1 ? per_group * C.o_.node_bw / (groups - 1) / o.oversubscription / 1e9 : 0.0,
      o.valiant ? "Valiant" : "minimal", o.nvlink_bw / 1e9);
}

void ClusterBuilder::torus3d() {
  Network& net = C.net_;
  const int gpn = C.gpn_;
  torus_dims(nodes, C.dims_);
  const double link = o.torus_link > 0 ? o.torus_link : C.o_.node_bw / 6;
  std::vector<int> rv(nodes);
  for (int s = 0; s < nodes; ++s) rv[s] = net.add_vertex(fmt::format("router{}", s));
  C.torus_link_.assign(static_cast<size_t>(nodes) * 6, -1);
  std::map<std::string, std::vector<int>> coords;
  for (int s = 0; s < nodes; ++s) {
    const int c[3] = {s % C.dims_[0], (s / C.dims_[0]) % C.dims_[1], s / (C.dims_[0] * C.dims_[1])};
    coords[slot_names[s]] = {c[0], c[1], c[2]};
    for (int d = 0; d < 3; ++d) {
      if (C.dims_[d] == 1) continue;
      for (int dir = 0; dir < 2; ++dir) {
        int n[3] = {c[0], c[1], c[2]};
        n[d] = ((n[d] + (dir == 0 ? 1 : -1)) % C.dims_[d] + C.dims_[d]) % C.dims_[d];
        const int t = n[0] + C.dims_[0] * (n[1] + C.dims_[1] * n[2]);
        // A 2-long dimension has one neighbour both ways: share one link per direction.
        int existing = net.find_link(rv[s], rv[t]);
        C.torus_link_[s * 6 + 2 * d + dir] =
            existing >= 0 ? existing : net.add_link(rv[s], rv[t], link, o.switch_latency, "torus");
      }
    }
  }
  for (int s = 0; s < nodes; ++s) {
    C.node_vertex_[node_at_slot[s]] = rv[s];
    C.add_node_gpus(node_at_slot[s], rv[s]);
  }
  C.topo_ = std::make_unique<topology::ClusterTopology>(topology::ClusterTopology::torus(
      {C.dims_[0], C.dims_[1], C.dims_[2]}, {true, true, true}, coords));
  C.describe_ = fmt::format(
      "3D torus: {} nodes ({}x{}x{}) x {} GPUs, {:g} GB/s per node, {:g} GB/s per torus link "
      "and direction, dimension-order routing, NVLink {:g} GB/s per GPU",
      nodes, C.dims_[0], C.dims_[1], C.dims_[2], gpn, C.o_.node_bw / 1e9, link / 1e9,
      o.nvlink_bw / 1e9);
}

void ClusterBuilder::graph_file(const GraphFile& graph) {
  Network& net = C.net_;
  std::map<std::string, int> v;
  for (const auto& n : graph.nodes) {
    if (v.count(n)) fail(fmt::format("{}: node {} listed twice", o.file, n));
    v[n] = net.add_vertex(n);
  }
  for (const auto& s : graph.switches) {
    if (v.count(s)) fail(fmt::format("{}: switch {} is also a node or listed twice", o.file, s));
    v[s] = net.add_vertex(s);
  }
  for (const auto& l : graph.links) {
    auto a = v.find(l.from), b = v.find(l.to);
    if (a == v.end() || b == v.end())
      fail(fmt::format("{}:{}: link {} -> {}: '{}' is neither a node nor a switch", o.file,
                       l.line, l.from, l.to, a == v.end() ? l.from : l.to));
    if (l.duplex)
      net.add_duplex(a->second, b->second, gb(l.bw), l.lat * 1e-6, "link");
    else
      net.add_link(a->second, b->second, gb(l.bw), l.lat * 1e-6, "link");
  }
  for (int i = 0; i < nodes; ++i) {
    C.node_vertex_[i] = v[C.node_names_[i]];
    C.add_node_gpus(i, C.node_vertex_[i]);
  }
  // Check reachability once, with a message naming the file.
  for (int i = 1; i < nodes; ++i) {
    try {
      C.bfs_cached(C.node_vertex_[0], C.node_vertex_[i]);
      C.bfs_cached(C.node_vertex_[i], C.node_vertex_[0]);
    } catch (const std::runtime_error& e) {
      fail(fmt::format("{}: {}", o.file, e.what()));
    }
  }
  // Ring ordering needs a hop metric: a one-switch tree (every pair 2 hops) keeps the node
  // order; the simulator's topology order for graphs uses the graph's own hop counts.
  std::vector<topology::Switch> sw{{"graph", -1, {}, {}, 0, 0}};
  sw[0].nodes = C.node_names_;
  C.topo_ = std::make_unique<topology::ClusterTopology>(topology::ClusterTopology::tree(sw));
  C.describe_ = fmt::format("graph {}: {} nodes x {} GPUs, {} switches, {} links", o.file,
                            nodes, C.gpn_, graph.switches.size(), net.link_count());
  if (graph.host_cores > 0)
    C.describe_ += fmt::format(", all nodes on one host of {:g} cores", graph.host_cores);
}

void ClusterBuilder::slurm_conf(const std::string& slurm_text,
                                const std::vector<topology::Switch>& slurm_switches) {
  Network& net = C.net_;
  const int gpn = C.gpn_;
  const auto speeds = slurm_link_speeds(slurm_text);
  std::vector<int> swv(slurm_switches.size());
  for (size_t i = 0; i < slurm_switches.size(); ++i) swv[i] = net.add_vertex(slurm_switches[i].name);
  for (int i = 0; i < nodes; ++i) {
    C.node_vertex_[i] = net.add_vertex(C.node_names_[i] + "/host");
  }
  // Bottom-up: a switch's downward bandwidth is the sum over its children.
  std::vector<double> down(slurm_switches.size(), 0);
  std::vector<int> order(slurm_switches.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return slurm_switches[a].depth > slurm_switches[b].depth;
  });
  for (int i : order) {
    const auto& s = slurm_switches[i];
    for (const auto& n : s.nodes) {
      const int ni = C.by_name_.at(n);
      net.add_duplex(C.node_vertex_[ni], swv[i], C.o_.node_bw, o.nic_latency, "nic");
      down[i] += C.o_.node_bw;
    }
    if (s.parent >= 0) {
      auto it = speeds.find(s.name);
      const double up = it != speeds.end() ? gb(it->second) : down[i] / o.oversubscription;
      net.add_duplex(swv[i], swv[s.parent], up, o.switch_latency, "uplink");
      down[s.parent] += up;
    }
  }
  // Separate trees: join the roots (Slurm allows several) through a virtual root.
  int roots = 0;
  for (const auto& s : slurm_switches) roots += s.parent < 0;
  if (roots > 1) {
    const int top = net.add_vertex("virtual-root");
    for (size_t i = 0; i < slurm_switches.size(); ++i)
      if (slurm_switches[i].parent < 0)
        net.add_duplex(swv[i], top, down[i] / o.oversubscription, o.switch_latency, "uplink");
  }
  for (int i = 0; i < nodes; ++i) {
    // The host vertex stands for the node's NICs: GPUs reach it at node_bw / gpn each.
    C.add_node_gpus(i, C.node_vertex_[i]);
  }
  C.describe_ = fmt::format("topology.conf {}: {} nodes x {} GPUs, {} switches, {:g} GB/s per node",
                            o.file, nodes, gpn, slurm_switches.size(), C.o_.node_bw / 1e9);
}

std::unique_ptr<Cluster> Cluster::build(const ClusterOptions& o) {
  std::unique_ptr<Cluster> c(new Cluster());
  c->o_ = o;
  Cluster& C = *c;
  if (o.gpus_per_node < 1) fail("cluster: gpus_per_node must be >= 1");
  if (!(o.node_bw > 0)) fail("cluster: node bandwidth must be > 0");
  if (!(o.oversubscription >= 1)) fail("cluster: oversubscription must be >= 1");
  C.gpn_ = o.gpus_per_node;

  // Graph files and topology.conf bring their own node list.
  GraphFile graph;
  std::vector<topology::Switch> slurm_switches;
  std::string slurm_text;
  int nodes = o.nodes;
  if (o.shape == Shape::kGraphFile) {
    graph = parse_graph(o.file);
    if (graph.gpus_per_node > 0) C.gpn_ = graph.gpus_per_node;
    if (graph.nic > 0) C.o_.node_bw = gb(graph.nic) * C.gpn_;
    C.host_cores_ = graph.host_cores;
    nodes = static_cast<int>(graph.nodes.size());
  } else if (o.shape == Shape::kSlurmConf) {
    slurm_text = read_text(o.file);
    auto t = topology::parse_slurm_topology(slurm_text, o.file);
    slurm_switches = t.switches();
    nodes = static_cast<int>(t.node_count());
    C.topo_ = std::make_unique<topology::ClusterTopology>(std::move(t));
  }
  if (nodes < 1) fail("cluster: no nodes");

  // Names and wiring positions.
  std::vector<std::string> slot_names(nodes);
  if (o.shape == Shape::kGraphFile) {
    slot_names = graph.nodes;
  } else if (o.shape == Shape::kSlurmConf) {
    slot_names = C.topo_->structural_order();
  } else {
    std::vector<int> perm(nodes);
    std::iota(perm.begin(), perm.end(), 0);
    if (o.shuffled_names) {
      std::mt19937 rng(20261202);
      std::shuffle(perm.begin(), perm.end(), rng);
    }
    for (int s = 0; s < nodes; ++s) slot_names[s] = node_name(perm[s]);
  }
  // Node index = natural (sorted) name order: what a Slurm node list gives.
  C.node_names_ = slot_names;
  std::sort(C.node_names_.begin(), C.node_names_.end(), [](const std::string& a, const std::string& b) {
    return topology::natural_less(a, b);
  });
  C.slot_of_.assign(nodes, 0);
  for (int i = 0; i < nodes; ++i) {
    if (C.by_name_.count(C.node_names_[i])) fail(fmt::format("cluster: node {} appears twice", C.node_names_[i]));
    C.by_name_[C.node_names_[i]] = i;
  }
  for (int s = 0; s < nodes; ++s) C.slot_of_[C.by_name_[slot_names[s]]] = s;

  C.gpu_vertex_.assign(static_cast<size_t>(nodes) * C.gpn_, -1);
  C.gpu_up_ = C.gpu_down_ = C.nic_up_ = C.nic_down_ = std::vector<int>(C.gpu_vertex_.size(), -1);
  C.node_vertex_.assign(nodes, -1);
  std::vector<int> node_at_slot(nodes);
  for (int i = 0; i < nodes; ++i) node_at_slot[C.slot_of_[i]] = i;

  ClusterBuilder builder{C, o, nodes, slot_names, node_at_slot};
  switch (o.shape) {
    case Shape::kFatTree: builder.fat_tree(); break;
    case Shape::kDragonflyPlus: builder.dragonfly_plus(); break;
    case Shape::kTorus3d: builder.torus3d(); break;
    case Shape::kGraphFile: builder.graph_file(graph); break;
    case Shape::kSlurmConf: builder.slurm_conf(slurm_text, slurm_switches); break;
  }
  return c;
}

}  // namespace ring::sim
