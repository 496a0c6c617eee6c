#include "common/topology/cluster.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

namespace ring::topology {

// ---- model ----------------------------------------------------------------------------------

ClusterTopology ClusterTopology::tree(std::vector<Switch> switches, Kind kind) {
  ClusterTopology t;
  t.kind_ = kind;
  const int n = static_cast<int>(switches.size());
  for (auto& s : switches) s.children.clear();
  for (int i = 0; i < n; ++i) {
    int p = switches[i].parent;
    if (p >= n || p < -1)
      throw TopologyError(fmt::format("switch {}: bad parent", switches[i].name));
    if (p >= 0) switches[p].children.push_back(i);
  }
  // Depths from the roots; a switch never reached sits on a cycle.
  std::vector<int> depth(n, -1);
  std::vector<int> stack;
  for (int i = 0; i < n; ++i)
    if (switches[i].parent < 0) depth[i] = 0, stack.push_back(i);
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    for (int c : switches[s].children) depth[c] = depth[s] + 1, stack.push_back(c);
  }
  for (int i = 0; i < n; ++i) {
    if (depth[i] < 0) {
      throw TopologyError(fmt::format(
          "{}switch {} is part of a cycle (it is its own ancestor)",
          switches[i].line ? fmt::format("line {}: ", switches[i].line) : "", switches[i].name));
    }
    switches[i].depth = depth[i];
  }
  auto by_name = [&](int a, int b) { return natural_less(switches[a].name, switches[b].name); };
  for (auto& s : switches) {
    std::sort(s.children.begin(), s.children.end(), by_name);
    std::sort(s.nodes.begin(), s.nodes.end(), natural_less);
  }
  for (int i = 0; i < n; ++i) {
    for (const auto& node : switches[i].nodes) {
      auto [it, fresh] = t.node_switch_.emplace(node, i);
      if (!fresh) {
        throw TopologyError(
            fmt::format("{}node {} is attached to switch {} and to switch {}",
                        switches[i].line ? fmt::format("line {}: ", switches[i].line) : "", node,
                        switches[it->second].name, switches[i].name));
      }
    }
  }
  if (kind == Kind::kDragonfly) {
    for (const auto& s : switches) {
      if (s.depth > 1) throw TopologyError(fmt::format("dragonfly: {} is nested too deep", s.name));
      if (s.depth == 0 && !s.nodes.empty()) {
        throw TopologyError(
            fmt::format("dragonfly: group {} has nodes; nodes go on routers", s.name));
      }
    }
  }
  t.switches_ = std::move(switches);
  return t;
}

ClusterTopology ClusterTopology::torus(std::vector<int> dims, std::vector<bool> wrap,
                                       std::map<std::string, std::vector<int>> coords) {
  ClusterTopology t;
  t.kind_ = Kind::kTorus;
  if (dims.empty()) throw TopologyError("torus: no dimensions");
  for (int d : dims)
    if (d < 1) throw TopologyError(fmt::format("torus: dimension {} is not positive", d));
  if (wrap.empty()) wrap.assign(dims.size(), true);
  if (wrap.size() != dims.size()) {
    throw TopologyError(
        fmt::format("torus: {} wrap flags for {} dimensions", wrap.size(), dims.size()));
  }
  std::map<std::vector<int>, std::string> taken;
  for (const auto& [name, c] : coords) {
    if (c.size() != dims.size()) {
      throw TopologyError(fmt::format("torus: node {} has {} coordinates, expected {}", name,
                                      c.size(), dims.size()));
    }
    for (size_t d = 0; d < dims.size(); ++d) {
      if (c[d] < 0 || c[d] >= dims[d]) {
        throw TopologyError(fmt::format("torus: node {} coordinate {} = {} is outside 0..{}", name,
                                        d, c[d], dims[d] - 1));
      }
    }
    auto [it, fresh] = taken.emplace(c, name);
    if (!fresh) {
      throw TopologyError(
          fmt::format("torus: nodes {} and {} have the same coordinates", it->second, name));
    }
  }
  t.dims_ = std::move(dims);
  t.wrap_ = std::move(wrap);
  t.coords_ = std::move(coords);
  return t;
}

bool ClusterTopology::contains(const std::string& node) const {
  return kind_ == Kind::kTorus ? coords_.count(node) > 0 : node_switch_.count(node) > 0;
}

size_t ClusterTopology::node_count() const {
  return kind_ == Kind::kTorus ? coords_.size() : node_switch_.size();
}

const std::vector<int>& ClusterTopology::coords(const std::string& node) const {
  auto it = coords_.find(node);
  if (it == coords_.end()) throw TopologyError(fmt::format("node {} is not in the torus", node));
  return it->second;
}

int ClusterTopology::hops(const std::string& a, const std::string& b) const {
  if (a == b) return 0;
  if (kind_ == Kind::kTorus) {
    const auto& ca = coords(a);
    const auto& cb = coords(b);
    int h = 0;
    for (size_t d = 0; d < dims_.size(); ++d) {
      int diff = std::abs(ca[d] - cb[d]);
      h += wrap_[d] ? std::min(diff, dims_[d] - diff) : diff;
    }
    return h;
  }
  auto ia = node_switch_.find(a), ib = node_switch_.find(b);
  if (ia == node_switch_.end() || ib == node_switch_.end()) {
    throw TopologyError(
        fmt::format("node {} is not in the topology", ia == node_switch_.end() ? a : b));
  }
  int sa = ia->second, sb = ib->second;
  if (kind_ == Kind::kDragonfly) {
    if (sa == sb) return dragonfly_hops.router;
    return switches_[sa].parent == switches_[sb].parent ? dragonfly_hops.group
                                                        : dragonfly_hops.global;
  }
  // Links up from each leaf to the lowest common switch, plus the two node-switch links.
  int up = 0;
  while (sa != sb) {
    const Switch& x = switches_[sa];
    const Switch& y = switches_[sb];
    if (x.depth > y.depth) {
      sa = x.parent, ++up;
    } else if (y.depth > x.depth) {
      sb = y.parent, ++up;
    } else if (x.parent < 0) {
      return up + 4;  // two different roots: one more link each up to a virtual root
    } else {
      sa = x.parent, sb = y.parent, up += 2;
    }
  }
  return up + 2;
}

int ClusterTopology::max_hops() const {
  if (kind_ == Kind::kTorus) {
    int h = 0;
    for (size_t d = 0; d < dims_.size(); ++d) h += wrap_[d] ? dims_[d] / 2 : dims_[d] - 1;
    return h;
  }
  if (kind_ == Kind::kDragonfly) return dragonfly_hops.global;
  int depth = 0;
  for (const auto& s : switches_) depth = std::max(depth, s.depth);
  return 2 * (depth + 2);
}

std::vector<std::string> ClusterTopology::structural_order() const {
  std::vector<std::string> out;
  if (kind_ == Kind::kTorus) {
    // Boustrophedon: the slowest dimension counts up; each faster dimension runs forwards or
    // backwards by the parity of the (already folded) slower coordinates, so consecutive
    // positions differ by one step in one dimension.
    std::vector<std::pair<std::vector<int>, std::string>> keyed;
    for (const auto& [name, c] : coords_) {
      // A digit runs backwards when the number formed by the slower digits is odd (the
      // reflected mixed-radix Gray code); the parity of the digit sum would be wrong for even
      // sizes.
      std::vector<int> key(c.size());
      int64_t prefix = 0;
      for (size_t k = c.size(); k-- > 0;) {
        int digit = prefix % 2 == 0 ? c[k] : dims_[k] - 1 - c[k];
        key[c.size() - 1 - k] = digit;
        prefix = (prefix * dims_[k] + digit) % 2;
      }
      keyed.emplace_back(std::move(key), name);
    }
    std::sort(keyed.begin(), keyed.end());
    for (auto& [k, name] : keyed) out.push_back(name);
    return out;
  }
  std::vector<int> roots;
  for (size_t i = 0; i < switches_.size(); ++i)
    if (switches_[i].parent < 0) roots.push_back(static_cast<int>(i));
  std::sort(roots.begin(), roots.end(),
            [&](int a, int b) { return natural_less(switches_[a].name, switches_[b].name); });
  std::vector<int> stack(roots.rbegin(), roots.rend());
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    for (const auto& n : switches_[s].nodes) out.push_back(n);
    const auto& ch = switches_[s].children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
  }
  return out;
}

// ---- topology.conf --------------------------------------------------------------------------

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

ClusterTopology parse_slurm_topology(std::string_view text, const std::string& source) {
  struct Def {
    std::string name;
    std::vector<std::string> switches, nodes;
    int line;
  };
  std::vector<Def> defs;
  std::map<std::string, size_t> index;
  int line_no = 0;
  std::string logical;
  int logical_line = 0;
  auto fail = [&](int line, const std::string& what) {
    return TopologyError(fmt::format("{}:{}: {}", source, line, what));
  };
  auto handle = [&](const std::string& raw, int at) {
    std::istringstream in(raw);
    std::string tok;
    Def d{.name = "", .switches = {}, .nodes = {}, .line = at};
    bool any = false;
    while (in >> tok) {
      any = true;
      size_t eq = tok.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == tok.size()) {
        throw fail(at, fmt::format("'{}' is not Key=Value", tok));
      }
      std::string key = lower(tok.substr(0, eq));
      std::string value = tok.substr(eq + 1);
      try {
        if (key == "switchname") {
          if (!d.name.empty()) throw fail(at, "SwitchName given twice on one line");
          std::vector<std::string> names = expand_hostlist(value);
          if (names.size() != 1)
            throw fail(at, fmt::format("SwitchName={} names {} switches, "
                                       "expected one",
                                       value, names.size()));
          d.name = names[0];
        } else if (key == "switches") {
          auto v = expand_hostlist(value);
          d.switches.insert(d.switches.end(), v.begin(), v.end());
        } else if (key == "nodes") {
          auto v = expand_hostlist(value);
          d.nodes.insert(d.nodes.end(), v.begin(), v.end());
        } else if (key == "linkspeed") {
          // Informational in Slurm too.
        } else if (key == "blockname" || key == "blocksizes") {
          throw fail(at,
                     "topology/block (BlockName=) is not supported; give the switch tree "
                     "(topology/tree) or a cluster YAML");
        } else {
          throw fail(at, fmt::format("unknown key '{}' (expected SwitchName, Switches, Nodes, "
                                     "LinkSpeed)",
                                     tok.substr(0, eq)));
        }
      } catch (const TopologyError& e) {
        std::string m = e.what();
        if (m.rfind(source + ":", 0) == 0) throw;
        throw fail(at, m);
      }
    }
    if (!any) return;
    if (d.name.empty()) throw fail(at, "line has no SwitchName=");
    if (d.switches.empty() && d.nodes.empty()) {
      throw fail(at, fmt::format("switch {} has neither Switches= nor Nodes=", d.name));
    }
    auto [it, fresh] = index.emplace(d.name, defs.size());
    if (!fresh) {
      throw fail(at, fmt::format("switch {} is already defined on line {}", d.name,
                                 defs[it->second].line));
    }
    defs.push_back(std::move(d));
  };
  for (size_t b = 0; b <= text.size();) {
    size_t e = text.find('\n', b);
    if (e == std::string_view::npos) e = text.size();
    std::string line(text.substr(b, e - b));
    b = e + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (logical.empty()) logical_line = line_no;
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      logical += line + " ";
      continue;
    }
    logical += line;
    handle(logical, logical_line);
    logical.clear();
    if (e == text.size()) break;
  }
  if (!logical.empty()) handle(logical, logical_line);
  if (defs.empty()) throw TopologyError(fmt::format("{}: no SwitchName= lines", source));

  std::vector<Switch> switches(defs.size());
  for (size_t i = 0; i < defs.size(); ++i) {
    switches[i].name = defs[i].name;
    switches[i].nodes = defs[i].nodes;
    switches[i].line = defs[i].line;
  }
  for (size_t i = 0; i < defs.size(); ++i) {
    for (const auto& child : defs[i].switches) {
      auto it = index.find(child);
      if (it == index.end()) {
        throw fail(defs[i].line, fmt::format("switch {} lists switch {}, which is not defined",
                                             defs[i].name, child));
      }
      if (it->second == i) throw fail(defs[i].line, fmt::format("switch {} lists itself", child));
      Switch& c = switches[it->second];
      if (c.parent >= 0) {
        throw fail(defs[i].line, fmt::format("switch {} already has parent {} (line {})", child,
                                             switches[c.parent].name, switches[c.parent].line));
      }
      c.parent = static_cast<int>(i);
    }
  }
  try {
    return ClusterTopology::tree(std::move(switches));
  } catch (const TopologyError& e) {
    throw TopologyError(fmt::format("{}:{}", source, e.what()));
  }
}

// ---- YAML -----------------------------------------------------------------------------------

namespace {

class YamlReader {
 public:
  explicit YamlReader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& what) const {
    YAML::Mark m = at.Mark();
    throw TopologyError(fmt::format("{}:{}:{}: {}{}", source_, m.line + 1, m.column + 1,
                                    key.empty() ? "" : key + ": ", what));
  }
  // Rejects keys not in `allowed`.
  void keys(const YAML::Node& map, const std::string& path,
            std::initializer_list<const char*> allowed) const {
    if (!map.IsMap()) fail(map, path, "expected a mapping");
    for (auto it = map.begin(); it != map.end(); ++it) {
      YAML::Node k = it->first;
      std::string name = k.as<std::string>();
      bool ok = false;
      for (const char* a : allowed) ok = ok || name == a;
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        fail(k, path.empty() ? name : path + "." + name,
             fmt::format("unknown key (expected one of: {})", list));
      }
    }
  }
  std::string str(const YAML::Node& n, const std::string& path) const {
    if (!n.IsScalar()) fail(n, path, "expected a string");
    return n.Scalar();
  }
  int integer(const YAML::Node& n, const std::string& path, int lo, int hi) const {
    if (!n.IsScalar()) fail(n, path, "expected an integer");
    const std::string& s = n.Scalar();
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used != s.size() || s.empty()) fail(n, path, fmt::format("'{}' is not an integer", s));
    if (v < lo || v > hi) fail(n, path, fmt::format("{} is outside {}..{}", v, lo, hi));
    return static_cast<int>(v);
  }
  std::vector<std::string> hosts(const YAML::Node& n, const std::string& path) const {
    std::vector<std::string> out;
    auto add = [&](const YAML::Node& item) {
      try {
        auto v = expand_hostlist(str(item, path));
        out.insert(out.end(), v.begin(), v.end());
      } catch (const TopologyError& e) {
        std::string m = e.what();
        if (m.rfind(source_ + ":", 0) == 0) throw;
        fail(item, path, m);
      }
    };
    if (n.IsSequence()) {
      for (const auto& item : n) add(item);
    } else {
      add(n);
    }
    return out;
  }

 private:
  const std::string& source_;
};

void read_switch(const YamlReader& r, const YAML::Node& n, const std::string& path, int parent,
                 const char* child_key, std::vector<Switch>& out, int depth) {
  if (depth > 16) r.fail(n, path, "switch tree deeper than 16 levels");
  r.keys(n, path, {"name", child_key, "nodes"});
  if (!n["name"]) r.fail(n, path, "missing 'name'");
  Switch s;
  s.name = r.str(n["name"], path + ".name");
  s.parent = parent;
  s.line = static_cast<int>(n.Mark().line) + 1;
  if (n["nodes"]) s.nodes = r.hosts(n["nodes"], path + ".nodes");
  const int self = static_cast<int>(out.size());
  out.push_back(s);
  if (YAML::Node ch = n[child_key]) {
    if (!ch.IsSequence()) r.fail(ch, path + "." + child_key, "expected a list");
    for (size_t i = 0; i < ch.size(); ++i) {
      read_switch(r, ch[i], fmt::format("{}.{}[{}]", path, child_key, i), self, child_key, out,
                  depth + 1);
    }
  }
  if (!n["nodes"] && !n[child_key]) {
    r.fail(n, path, fmt::format("switch {} has neither '{}' nor 'nodes'", s.name, child_key));
  }
}

}  // namespace

ClusterTopology parse_cluster_yaml(std::string_view text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw TopologyError(fmt::format("{}:{}:{}: invalid YAML: {}", source, e.mark.line + 1,
                                    e.mark.column + 1, e.msg));
  }
  YamlReader r(source);
  if (!root.IsMap()) {
    throw TopologyError(fmt::format("{}: expected a mapping with 'kind' at the top", source));
  }
  if (!root["kind"]) r.fail(root, "kind", "missing (tree, dragonfly or torus)");
  std::string kind = r.str(root["kind"], "kind");
  std::vector<Switch> switches;
  auto wrap_errors = [&](const YAML::Node& at, const std::string& key, auto&& make) {
    try {
      return make();
    } catch (const TopologyError& e) {
      std::string m = e.what();
      if (m.rfind(source + ":", 0) == 0) throw;
      r.fail(at, key, m);
    }
  };
  if (kind == "tree") {
    r.keys(root, "", {"kind", "tiers", "switches"});
    YAML::Node sw = root["switches"];
    if (!sw || !sw.IsSequence() || sw.size() == 0) r.fail(root, "switches", "expected a list");
    for (size_t i = 0; i < sw.size(); ++i)
      read_switch(r, sw[i], fmt::format("switches[{}]", i), -1, "children", switches, 0);
    std::set<std::string> names;
    for (const auto& s : switches)
      if (!names.insert(s.name).second) {
        throw TopologyError(
            fmt::format("{}:{}: switch {} is defined twice", source, s.line, s.name));
      }
    return wrap_errors(root, "switches", [&] { return ClusterTopology::tree(switches); });
  }
  if (kind == "dragonfly") {
    r.keys(root, "", {"kind", "groups", "hops"});
    YAML::Node groups = root["groups"];
    if (!groups || !groups.IsSequence() || groups.size() == 0) {
      r.fail(root, "groups", "expected a list");
    }
    for (size_t i = 0; i < groups.size(); ++i)
      read_switch(r, groups[i], fmt::format("groups[{}]", i), -1, "routers", switches, 0);
    ClusterTopology t = wrap_errors(root, "groups", [&] {
      return ClusterTopology::tree(switches, ClusterTopology::Kind::kDragonfly);
    });
    if (YAML::Node h = root["hops"]) {
      r.keys(h, "hops", {"router", "group", "global"});
      if (h["router"]) t.dragonfly_hops.router = r.integer(h["router"], "hops.router", 0, 1000);
      if (h["group"]) t.dragonfly_hops.group = r.integer(h["group"], "hops.group", 0, 1000);
      if (h["global"]) t.dragonfly_hops.global = r.integer(h["global"], "hops.global", 0, 1000);
      const auto& d = t.dragonfly_hops;
      if (!(d.router <= d.group && d.group <= d.global)) {
        r.fail(h, "hops", "expected router <= group <= global");
      }
    }
    return t;
  }
  if (kind == "torus") {
    r.keys(root, "", {"kind", "dims", "wrap", "nodes", "hostlist"});
    YAML::Node dn = root["dims"];
    if (!dn || !dn.IsSequence() || dn.size() == 0 || dn.size() > 6) {
      r.fail(dn ? dn : root, "dims", "expected a list of 1 to 6 sizes");
    }
    std::vector<int> dims;
    for (size_t i = 0; i < dn.size(); ++i)
      dims.push_back(r.integer(dn[i], fmt::format("dims[{}]", i), 1, 1 << 16));
    std::vector<bool> wrap;
    if (YAML::Node w = root["wrap"]) {
      if (!w.IsSequence() || w.size() != dims.size()) {
        r.fail(w, "wrap", fmt::format("expected {} booleans", dims.size()));
      }
      for (size_t i = 0; i < w.size(); ++i) {
        bool b = false;
        if (!w[i].IsScalar() || !YAML::convert<bool>::decode(w[i], b)) {
          r.fail(w[i], fmt::format("wrap[{}]", i), "expected true or false");
        }
        wrap.push_back(b);
      }
    }
    std::map<std::string, std::vector<int>> coords;
    if (root["nodes"] && root["hostlist"]) r.fail(root, "nodes", "give 'nodes' or 'hostlist'");
    if (YAML::Node nodes = root["nodes"]) {
      if (!nodes.IsMap()) r.fail(nodes, "nodes", "expected a mapping name: [coordinates]");
      for (auto it = nodes.begin(); it != nodes.end(); ++it) {
        YAML::Node k = it->first, v = it->second;
        std::string name = r.str(k, "nodes");
        std::string path = "nodes." + name;
        if (!v.IsSequence()) r.fail(v, path, "expected a list of coordinates");
        std::vector<int> c;
        for (size_t i = 0; i < v.size(); ++i) {
          c.push_back(r.integer(v[i], path, 0, 1 << 16));
        }
        if (!coords.emplace(name, c).second) r.fail(k, path, "node listed twice");
      }
    } else if (YAML::Node hl = root["hostlist"]) {
      // Node i of the list sits at the coordinates of i with the first dimension fastest.
      std::vector<std::string> names = r.hosts(hl, "hostlist");
      long cells = 1;
      for (int d : dims) cells *= d;
      if (static_cast<long>(names.size()) > cells) {
        r.fail(hl, "hostlist",
               fmt::format("{} names for a torus of {} positions", names.size(), cells));
      }
      for (size_t i = 0; i < names.size(); ++i) {
        std::vector<int> c;
        long rest = static_cast<long>(i);
        for (int d : dims) c.push_back(static_cast<int>(rest % d)), rest /= d;
        if (!coords.emplace(names[i], c).second) r.fail(hl, "hostlist", names[i] + " twice");
      }
    } else {
      r.fail(root, "nodes", "missing: give 'nodes' (name: [x, y, z]) or 'hostlist'");
    }
    return wrap_errors(root, "", [&] { return ClusterTopology::torus(dims, wrap, coords); });
  }
  r.fail(root["kind"], "kind", fmt::format("'{}' is not tree, dragonfly or torus", kind));
}

ClusterTopology load_cluster_topology(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw TopologyError(fmt::format("{}: cannot open", path));
  std::stringstream s;
  s << in.rdbuf();
  bool yaml = path.size() > 5 && (path.ends_with(".yaml") || path.ends_with(".yml"));
  return yaml ? parse_cluster_yaml(s.str(), path) : parse_slurm_topology(s.str(), path);
}

}  // namespace ring::topology
