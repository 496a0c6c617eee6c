// The reader side of ring_checkpoint: manifest parsing (strict: bad input is an error naming the
// file and key, never a crash), inspection, listing and loading with fallback.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/safetensors/safetensors.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/fsutil.h"
#include "common/checkpoint/internal.h"

namespace ring::ckpt {

using nlohmann::json;

namespace detail {

std::optional<StepName> parse_step_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  size_t i = 5, j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j - i > 18) return std::nullopt;
  StepName sn;
  sn.step = std::stoll(name.substr(i, j - i));
  if (j == name.size()) return sn;
  const std::string partial = ".partial-", superseded = ".superseded-";
  size_t k;
  if (name.compare(j, partial.size(), partial) == 0) {
    sn.partial = true;
    k = j + partial.size();
  } else if (name.compare(j, superseded.size(), superseded) == 0) {
    sn.superseded = true;
    k = j + superseded.size();
  } else {
    return std::nullopt;
  }
  sn.tag = name.substr(k);
  if (sn.tag.empty() || sn.tag.find('.') != std::string::npos) return std::nullopt;
  return sn;
}

std::string superseded_dir_name(int64_t step, const std::string& tag) {
  return step_dir_name(step) + ".superseded-" + tag;
}

json parent_json(const std::optional<CheckpointRef>& parent) {
  if (!parent) return nullptr;
  return {{"tag", parent->tag}, {"step", parent->step}};
}

json shard_manifest_json(const ShardManifest& m) {
  json j;
  j["format"] = "ringmaster-checkpoint-shard";
  j["format_version"] = m.format_version;
  j["writer_version"] = m.writer_version;
  j["step"] = m.step;
  j["spec_hash"] = m.spec_hash;
  j["node_rank"] = m.node_rank;
  j["nodes"] = m.nodes;
  j["tag"] = m.tag;
  j["data_file"] = m.data_file;
  j["data_bytes"] = m.data_bytes;
  j["time"] = m.time;
  auto ts = json::array();
  for (const auto& t : m.tensors)
    ts.push_back({{"name", t.name},
                  {"dtype", dtype_name(t.dtype)},
                  {"shape", t.shape},
                  {"offset", t.offset},
                  {"bytes", t.bytes},
                  {"xxh3", t.xxh3}});
  j["tensors"] = ts;
  j["meta"] = m.meta;
  if (m.layout) j["layout"] = layout_json(*m.layout);
  if (m.has_lineage) j["parent"] = parent_json(m.parent);
  return j;
}

}  // namespace detail

namespace {

// Typed field access that names the file and the key.
struct Fields {
  const json& j;
  const std::string& file;
  std::string where;  // "" or "tensors[3]."

  [[noreturn]] void fail(const std::string& key, const std::string& rule) const {
    throw CheckpointError(file + ": " + where + key + ": " + rule);
  }
  const json& at(const std::string& key) const {
    auto it = j.find(key);
    if (it == j.end()) fail(key, "missing");
    return *it;
  }
  int64_t i64(const std::string& key, int64_t lo, int64_t hi) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer");
    int64_t x;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) fail(key, "out of range");
      x = static_cast<int64_t>(u);
    } else {
      x = v.get<int64_t>();
    }
    if (x < lo || x > hi)
      fail(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
    return x;
  }
  uint64_t u64(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      fail(key, "must be a non-negative integer");
    return v.get<uint64_t>();
  }
  std::string str(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(key, "must be a string");
    return v.get<std::string>();
  }
  double num(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number()) fail(key, "must be a number");
    return v.get<double>();
  }
};

// `parent` (the lineage record): absent (a writer from before lineage), null (the attempt
// started from nothing) or {"tag", "step"}.
void parse_parent(const json& j, const std::string& file, bool* has, std::optional<CheckpointRef>* out) {
  auto it = j.find("parent");
  *has = it != j.end();
  out->reset();
  if (!*has || it->is_null()) return;
  if (!it->is_object()) throw CheckpointError(file + ": parent: must be null or an object");
  Fields f{*it, file, "parent."};
  CheckpointRef r;
  r.tag = f.str("tag");
  if (r.tag.empty() || r.tag.size() > 128) f.fail("tag", "must be 1 to 128 characters");
  r.step = f.i64("step", 0, INT64_MAX);
  *out = r;
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

json parse_json_text(const std::string& text, const std::string& file) {
  if (text.empty()) throw CheckpointError(file + ": empty (truncated manifest)");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw CheckpointError(file + ": not valid JSON (truncated or damaged manifest, " +
                          std::to_string(text.size()) + " bytes)");
  if (!j.is_object()) throw CheckpointError(file + ": must be a JSON object");
  return j;
}

}  // namespace

bool operator==(const Layout& a, const Layout& b) {
  return a.shard == b.shard && a.residual == b.residual && a.nodes == b.nodes &&
         a.ranges == b.ranges && a.total_floats == b.total_floats && a.model == b.model;
}

json layout_json(const Layout& l) {
  auto ranges = json::array();
  for (const LayoutRange& r : l.ranges)
    ranges.push_back({{"node", r.node},
                      {"begin", r.begin},
                      {"end", r.end},
                      {"first_bucket", r.first_bucket},
                      {"end_bucket", r.end_bucket}});
  json j = {{"shard", l.shard},
            {"nodes", l.nodes},
            {"ranges", ranges},
            {"total_floats", l.total_floats},
            {"model", l.model.is_null() ? json::object() : l.model}};
  if (!l.residual.empty()) j["residual"] = l.residual;
  return j;
}

Layout parse_layout(const json& j, const std::string& file) {
  if (!j.is_object()) throw CheckpointError(file + ": layout: must be an object");
  Fields f{j, file, "layout."};
  Layout l;
  l.shard = f.str("shard");
  if (l.shard.empty() || l.shard.size() > 64) f.fail("shard", "must be 1-64 characters");
  if (j.contains("residual")) {
    l.residual = f.str("residual");
    if (l.residual != "owner" && l.residual != "per_node")
      f.fail("residual", "'" + l.residual + "' is not one of owner | per_node");
  }
  l.nodes = static_cast<int>(f.i64("nodes", 1, 1 << 20));
  l.total_floats = f.i64("total_floats", 0, int64_t{1} << 62);
  const json& rs = f.at("ranges");
  if (!rs.is_array()) f.fail("ranges", "must be an array");
  if (rs.size() != static_cast<size_t>(l.nodes))
    f.fail("ranges", std::to_string(rs.size()) + " entries, expected one per node (" +
                         std::to_string(l.nodes) + ")");
  for (size_t i = 0; i < rs.size(); ++i) {
    std::string w = "layout.ranges[" + std::to_string(i) + "].";
    if (!rs[i].is_object()) throw CheckpointError(file + ": " + w + ": must be an object");
    Fields g{rs[i], file, w};
    LayoutRange r;
    r.node = static_cast<int>(g.i64("node", static_cast<int64_t>(i), static_cast<int64_t>(i)));
    const int64_t prev_end = i == 0 ? 0 : l.ranges.back().end;
    const int64_t prev_bucket = i == 0 ? 0 : l.ranges.back().end_bucket;
    // Contiguous in node order, no gap, no overlap: the begin is where the previous one ended.
    r.begin = g.i64("begin", prev_end, prev_end);
    r.end = g.i64("end", r.begin, l.total_floats);
    r.first_bucket = static_cast<int>(g.i64("first_bucket", prev_bucket, prev_bucket));
    r.end_bucket = static_cast<int>(g.i64("end_bucket", r.first_bucket, INT32_MAX));
    l.ranges.push_back(r);
  }
  if (l.ranges.back().end != l.total_floats)
    f.fail("ranges", "end at " + std::to_string(l.ranges.back().end) + ", not at total_floats " +
                         std::to_string(l.total_floats));
  const json& model = f.at("model");
  if (!model.is_object()) f.fail("model", "must be an object");
  l.model = model;
  return l;
}

std::string describe_layout(const Layout& l) {
  return std::to_string(l.nodes) + (l.nodes == 1 ? " node" : " nodes") + ", shard " + l.shard +
         (l.residual == "owner"      ? ", top-k residual at the owners"
          : l.residual == "per_node" ? ", top-k residual per node"
                                     : "");
}

namespace {

void check_format(const Fields& f, const char* expected) {
  std::string got = f.str("format");
  if (got != expected) {
    // Appended piecewise: GCC 12 warns falsely (-Wrestrict, PR105651) on "'" + s + ...
    std::string rule = "'";
    rule += got;
    rule += "', expected '";
    rule += expected;
    rule += "'";
    f.fail("format", rule);
  }
  int64_t v = f.i64("format_version", 1, INT32_MAX);
  if (v > kFormatVersion)
    f.fail("format_version", std::to_string(v) + " is newer than this reader (" +
                                 std::to_string(kFormatVersion) + "); use a newer ringmaster");
}

struct TopManifest {
  int format_version = 0;
  std::optional<Layout> layout;
  bool has_lineage = false;
  std::optional<CheckpointRef> parent;
  int64_t step = -1;
  int nodes = 0;
  std::string tag, spec_hash;
  double time = 0;
  struct Shard {
    int node_rank;
    std::string manifest, manifest_xxh3, data_file;
    uint64_t data_bytes;
  };
  std::vector<Shard> shards;
};

bool safe_file_name(const std::string& n) {
  return !n.empty() && n.size() < 256 && n.find('/') == std::string::npos && n != "." &&
         n != ".." && n.find('\0') == std::string::npos;
}

TopManifest parse_top_manifest(const std::string& text, const std::string& file) {
  json j = parse_json_text(text, file);
  Fields f{j, file, ""};
  check_format(f, "ringmaster-checkpoint");
  TopManifest m;
  m.format_version = static_cast<int>(f.i64("format_version", 1, INT32_MAX));
  m.step = f.i64("step", 0, INT64_MAX);
  m.nodes = static_cast<int>(f.i64("nodes", 1, 1 << 20));
  m.tag = f.str("tag");
  m.spec_hash = f.str("spec_hash");
  m.time = f.num("time");
  const json& sh = f.at("shards");
  if (!sh.is_array()) f.fail("shards", "must be an array");
  if (sh.size() != static_cast<size_t>(m.nodes))
    f.fail("shards", std::to_string(sh.size()) + " entries, expected one per node (" +
                         std::to_string(m.nodes) + ")");
  for (size_t i = 0; i < sh.size(); ++i) {
    if (!sh[i].is_object()) f.fail("shards[" + std::to_string(i) + "]", "must be an object");
    Fields g{sh[i], file, "shards[" + std::to_string(i) + "]."};
    TopManifest::Shard s;
    s.node_rank = static_cast<int>(g.i64("node_rank", i, i));
    s.manifest = g.str("manifest");
    s.manifest_xxh3 = g.str("manifest_xxh3");
    s.data_file = g.str("data_file");
    s.data_bytes = g.u64("data_bytes");
    if (!safe_file_name(s.manifest)) g.fail("manifest", "not a plain file name");
    if (!safe_file_name(s.data_file)) g.fail("data_file", "not a plain file name");
    if (!is_hex16(s.manifest_xxh3)) g.fail("manifest_xxh3", "must be 16 lower-case hex digits");
    m.shards.push_back(s);
  }
  if (auto li = j.find("layout"); li != j.end()) {
    m.layout = parse_layout(*li, file);
    if (m.layout->nodes != m.nodes)
      f.fail("layout", "records " + std::to_string(m.layout->nodes) + " nodes, the checkpoint " +
                           std::to_string(m.nodes));
  }
  parse_parent(j, file, &m.has_lineage, &m.parent);
  return m;
}

}  // namespace

std::string describe_ref(const CheckpointRef& r) {
  return "step " + std::to_string(r.step) + " (tag " + r.tag + ")";
}

ShardManifest parse_shard_manifest(const std::string& text, const std::string& file) {
  json j = parse_json_text(text, file);
  Fields f{j, file, ""};
  check_format(f, "ringmaster-checkpoint-shard");
  ShardManifest m;
  m.format_version = static_cast<int>(f.i64("format_version", 1, INT32_MAX));
  m.writer_version = f.str("writer_version");
  m.step = f.i64("step", 0, INT64_MAX);
  m.spec_hash = f.str("spec_hash");
  m.nodes = static_cast<int>(f.i64("nodes", 1, 1 << 20));
  m.node_rank = static_cast<int>(f.i64("node_rank", 0, m.nodes - 1));
  m.tag = f.str("tag");
  m.data_file = f.str("data_file");
  if (!safe_file_name(m.data_file)) f.fail("data_file", "not a plain file name");
  m.data_bytes = f.u64("data_bytes");
  m.time = f.num("time");
  const json& ts = f.at("tensors");
  if (!ts.is_array()) f.fail("tensors", "must be an array");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t i = 0; i < ts.size(); ++i) {
    std::string w = "tensors[" + std::to_string(i) + "]";
    if (!ts[i].is_object()) f.fail(w, "must be an object");
    Fields g{ts[i], file, w + "."};
    TensorEntry t;
    t.name = g.str("name");
    if (t.name.empty()) g.fail("name", "empty");
    for (const auto& o : m.tensors)
      if (o.name == t.name) g.fail("name", "'" + t.name + "' appears twice");
    auto dt = parse_dtype(g.str("dtype"));
    if (!dt) g.fail("dtype", "'" + g.str("dtype") + "' is not one of f32 f16 bf16 i32 i64 u8 u64");
    t.dtype = *dt;
    const json& shp = g.at("shape");
    if (!shp.is_array() || shp.size() > 16) g.fail("shape", "must be an array of at most 16 sizes");
    unsigned __int128 n = 1;
    for (const auto& d : shp) {
      if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() &&
                                     d.get<int64_t>() < 0))
        g.fail("shape", "sizes must be non-negative integers");
      uint64_t u = d.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) g.fail("shape", "size out of range");
      t.shape.push_back(static_cast<int64_t>(u));
      n *= u;
      if (n > (static_cast<unsigned __int128>(1) << 62)) g.fail("shape", "too many elements");
    }
    t.offset = g.u64("offset");
    t.bytes = g.u64("bytes");
    t.xxh3 = g.str("xxh3");
    if (!is_hex16(t.xxh3)) g.fail("xxh3", "must be 16 lower-case hex digits");
    if (n * dtype_size(t.dtype) != t.bytes)
      g.fail("bytes", std::to_string(t.bytes) + " does not match shape and dtype (" +
                          std::to_string(static_cast<uint64_t>(n * dtype_size(t.dtype))) + ")");
    if (t.offset > m.data_bytes || t.bytes > m.data_bytes - t.offset)
      g.fail("offset", "[" + std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
                           ") lies outside data_bytes " + std::to_string(m.data_bytes));
    ranges.emplace_back(t.offset, t.offset + t.bytes);
    m.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      f.fail("tensors", "two tensors overlap at offset " + std::to_string(ranges[i].first));
  auto mi = j.find("meta");
  // Readers look keys up in meta (ringd: the loader cursor): an object, or null for none
  // (Checkpointer::start(step, {}) writes null); anything else is damage.
  if (mi != j.end() && !mi->is_object() && !mi->is_null()) f.fail("meta", "must be an object");
  m.meta = mi == j.end() || mi->is_null() ? json::object() : *mi;
  if (auto li = j.find("layout"); li != j.end()) {
    m.layout = parse_layout(*li, file);
    if (m.layout->nodes != m.nodes)
      f.fail("layout", "records " + std::to_string(m.layout->nodes) + " nodes, the shard " +
                           std::to_string(m.nodes));
  }
  parse_parent(j, file, &m.has_lineage, &m.parent);
  return m;
}

const char* status_name(Status s) {
  switch (s) {
    case Status::kComplete: return "complete";
    case Status::kIncomplete: return "incomplete";
    case Status::kCorrupt: return "corrupt";
  }
  return "?";
}

namespace {

// Reads [offset, offset+bytes) of fd into dst (or a scratch buffer when dst is null) and
// returns its xxh3 as hex.
std::string hash_range(int fd, uint64_t offset, uint64_t bytes, char* dst,
                       const std::string& path) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::unique_ptr<char[]> scratch;
  constexpr size_t kChunk = 8u << 20;
  if (!dst) scratch = std::make_unique<char[]>(std::min<uint64_t>(kChunk, bytes ? bytes : 1));
  try {
    for (uint64_t done = 0; done < bytes;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, bytes - done));
      char* p = dst ? dst + done : scratch.get();
      fs::pread_all(fd, p, n, offset + done, path);
      XXH3_64bits_update(st, p, n);
      done += n;
    }
  } catch (...) {
    XXH3_freeState(st);
    throw;
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

struct Fd {
  int fd = -1;
  explicit Fd(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) throw CheckpointError(path + ": missing");
      throw CheckpointError(path + ": cannot open: " + fs::errno_text(errno));
    }
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Checks one committed step directory: the top manifest, every shard manifest (against its
// recorded hash) and data file size; with verify every tensor checksum. Throws on the first
// problem. Returns the top manifest and the parsed shard manifests.
std::pair<TopManifest, std::vector<ShardManifest>> check_step_dir(const std::string& dir,
                                                                  int64_t name_step,
                                                                  bool verify) {
  std::string top_path = fs::join(dir, detail::kTopManifest);
  TopManifest top = parse_top_manifest(fs::read_file(top_path, detail::kManifestLimit), top_path);
  if (top.step != name_step)
    throw CheckpointError(top_path + ": step " + std::to_string(top.step) +
                          " does not match the directory name");
  std::vector<ShardManifest> shards;
  for (const auto& s : top.shards) {
    std::string mpath = fs::join(dir, s.manifest);
    std::string text = fs::read_file(mpath, detail::kManifestLimit);
    std::string h = xxh3_hex(text.data(), text.size());
    if (h != s.manifest_xxh3)
      throw CheckpointError(mpath + ": checksum " + h + " differs from " + s.manifest_xxh3 +
                            " recorded in checkpoint.json (changed or damaged)");
    ShardManifest sm = parse_shard_manifest(text, mpath);
    if (sm.step != top.step || sm.node_rank != s.node_rank || sm.nodes != top.nodes)
      throw CheckpointError(mpath + ": step/node_rank/nodes (" + std::to_string(sm.step) + "/" +
                            std::to_string(sm.node_rank) + "/" + std::to_string(sm.nodes) +
                            ") disagree with checkpoint.json");
    if (sm.data_file != s.data_file || sm.data_bytes != s.data_bytes)
      throw CheckpointError(mpath + ": data_file/data_bytes disagree with checkpoint.json");
    if (sm.layout.has_value() != top.layout.has_value() ||
        (sm.layout && !(*sm.layout == *top.layout)))
      throw CheckpointError(mpath + ": layout disagrees with checkpoint.json");
    if (sm.has_lineage != top.has_lineage || sm.parent != top.parent || sm.tag != top.tag)
      throw CheckpointError(mpath + ": tag or parent disagrees with checkpoint.json");
    std::string dpath = fs::join(dir, sm.data_file);
    uint64_t size = fs::file_size(dpath);
    if (size != sm.data_bytes)
      throw CheckpointError(dpath + ": " + std::to_string(size) + " bytes, the manifest says " +
                            std::to_string(sm.data_bytes) + " (truncated or damaged)");
    if (verify) {
      Fd fd(dpath);
      for (const auto& t : sm.tensors) {
        std::string got = hash_range(fd.fd, t.offset, t.bytes, nullptr, dpath);
        if (got != t.xxh3)
          throw CheckpointError(dpath + ": tensor '" + t.name + "' checksum mismatch (manifest " +
                                t.xxh3 + ", data " + got + ")");
      }
    }
    shards.push_back(std::move(sm));
  }
  return {std::move(top), std::move(shards)};
}

}  // namespace

std::string read_latest(const std::string& dir) {
  try {
    std::string s = fs::read_file(fs::join(dir, detail::kLatest), 4096);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  } catch (const CheckpointError&) {
    return "";
  }
}

void set_latest(const std::string& dir, const std::string& name, bool fsync) {
  fs::write_atomic(dir, detail::kLatest, name + "\n", fsync);
}

CheckpointInfo inspect_checkpoint(const std::string& step_dir, bool verify) {
  CheckpointInfo info;
  info.path = step_dir;
  info.name = fs::basename(step_dir);
  auto sn = detail::parse_step_name(info.name);
  if (!sn) {
    info.problems.push_back(step_dir + ": not a checkpoint directory name (step-NNNNNNNN)");
    return info;
  }
  info.step = sn->step;
  if (sn->partial) {
    info.status = Status::kIncomplete;
    info.problems.push_back(info.name + ": not committed (being written, or left by a crash)");
    try {
      for (const auto& n : fs::list_dir(step_dir)) {
        if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0 && n.rfind("node-", 0) == 0) {
          ++info.nodes;
          try {
            auto sm = parse_shard_manifest(
                fs::read_file(fs::join(step_dir, n), detail::kManifestLimit), n);
            info.bytes += sm.data_bytes;
            info.time = std::max(info.time, sm.time);
            if (sm.layout) info.layout = sm.layout;
          } catch (const CheckpointError&) {
          }
        }
      }
    } catch (const CheckpointError&) {
    }
    return info;
  }
  info.superseded = sn->superseded;
  try {
    auto [top, shards] = check_step_dir(step_dir, sn->step, verify);
    info.status = Status::kComplete;
    info.nodes = top.nodes;
    info.time = top.time;
    info.format_version = top.format_version;
    info.layout = top.layout;
    info.tag = top.tag;
    info.has_lineage = top.has_lineage;
    info.parent = top.parent;
    for (const auto& s : shards) info.bytes += s.data_bytes;
  } catch (const CheckpointError& e) {
    info.status = Status::kCorrupt;
    info.problems.push_back(e.what());
    // Its place in the lineage from whatever still reads: the commit record, else a shard
    // manifest (the chain goes on past a damaged checkpoint to its parent).
    try {
      const std::string top_path = fs::join(step_dir, detail::kTopManifest);
      TopManifest top =
          parse_top_manifest(fs::read_file(top_path, detail::kManifestLimit), top_path);
      info.tag = top.tag;
      info.has_lineage = top.has_lineage;
      info.parent = top.parent;
    } catch (const CheckpointError&) {
      try {
        for (const auto& n : fs::list_dir(step_dir)) {
          if (n.rfind("node-", 0) != 0 || n.size() < 6 || n.compare(n.size() - 5, 5, ".json") != 0)
            continue;
          try {
            ShardManifest sm = parse_shard_manifest(
                fs::read_file(fs::join(step_dir, n), detail::kManifestLimit), n);
            info.tag = sm.tag;
            info.has_lineage = sm.has_lineage;
            info.parent = sm.parent;
            break;
          } catch (const CheckpointError&) {
          }
        }
      } catch (const CheckpointError&) {
      }
    }
  }
  return info;
}

std::vector<size_t> current_lineage(const std::vector<CheckpointInfo>& all,
                                    const std::string& latest) {
  std::vector<size_t> chain;
  if (latest == "none") return chain;
  // Committed directories under their step name (not partial, not set aside), newest first.
  std::vector<size_t> steps;
  for (size_t i = 0; i < all.size(); ++i) {
    auto sn = detail::parse_step_name(all[i].name);
    if (sn && !sn->partial && !sn->superseded && all[i].status != Status::kIncomplete)
      steps.push_back(i);
  }
  std::sort(steps.begin(), steps.end(), [&](size_t a, size_t b) { return all[a].step > all[b].step; });
  if (steps.empty()) return chain;
  // The head: what `latest` names; when it is missing (a directory from before lineage, or one
  // whose `latest` was removed), or names a directory that is gone, the newest one.
  size_t head = steps.front();
  for (size_t i : steps)
    if (all[i].name == latest) head = i;
  std::vector<bool> taken(all.size(), false);
  const CheckpointInfo* cur = &all[head];
  int64_t upto = cur->step;
  for (int guard = 0; guard < 1 << 20; ++guard) {
    if (!cur->has_lineage || cur->tag.empty()) {
      // No lineage recorded: everything committed at or below, by step order.
      for (size_t i : steps)
        if (!taken[i] && all[i].step <= upto) chain.push_back(i), taken[i] = true;
      break;
    }
    for (size_t i : steps)
      if (!taken[i] && all[i].step <= upto && all[i].tag == cur->tag)
        chain.push_back(i), taken[i] = true;
    if (!cur->parent) break;
    // The parent's attempt: any of its checkpoints records that attempt's own parent.
    const CheckpointRef p = *cur->parent;
    if (p.step >= upto) break;  // a cycle: damage
    const CheckpointInfo* next = nullptr;
    for (size_t i : steps)
      if (all[i].tag == p.tag && all[i].has_lineage) {
        next = &all[i];
        break;
      }
    if (!next) {
      // Gone (retention) or written before lineage: older ones of no recorded lineage go on.
      bool legacy = false;
      for (size_t i : steps)
        if (all[i].step <= p.step && !all[i].has_lineage) legacy = true;
      if (!legacy) break;
      static const CheckpointInfo kLegacy;
      next = &kLegacy;
    }
    cur = next;
    upto = p.step;
  }
  return chain;
}

std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, bool verify) {
  if (!fs::is_dir(dir)) {
    if (!fs::exists(dir)) throw CheckpointError(dir + ": no such directory");
    throw CheckpointError(dir + ": not a directory");
  }
  std::string latest = read_latest(dir);
  std::vector<CheckpointInfo> out;
  for (const auto& name : fs::list_dir(dir)) {
    if (!detail::parse_step_name(name)) continue;
    std::string p = fs::join(dir, name);
    if (!fs::is_dir(p)) continue;
    CheckpointInfo info = inspect_checkpoint(p, verify);
    info.latest = !latest.empty() && name == latest;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.step != b.step ? a.step < b.step : a.name < b.name;
  });
  for (size_t i : current_lineage(out, latest)) out[i].in_lineage = true;
  for (CheckpointInfo& c : out)
    if (!c.in_lineage && c.status == Status::kComplete) c.superseded = true;
  return out;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

uint64_t elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Where a target's bytes come from: bytes [src, src + bytes) of one tensor of a shard, copied
// to dst or (add, f32) added to the floats at dst.
struct Sink {
  char* dst;
  uint64_t src;    // [src, src + bytes) of the tensor's bytes in the data file
  uint64_t bytes;
  bool add;
  DType widen = DType::kF32;  // kBF16 / kF16: the bytes are 16-bit, dst takes them as f32
};

bool widens_exactly(DType from, DType to) {
  return to == DType::kF32 && (from == DType::kBF16 || from == DType::kF16);
}

float half_to_f32(DType t, uint16_t h) {
  return t == DType::kBF16 ? st::bf16_to_f32(h) : st::f16_to_f32(h);
}

// One tensor of one shard this node reads (each read once, however many targets take from it).
struct Read {
  size_t entry;
  std::vector<Sink> sinks;
};

// Streams tensor e of the data file through XXH3 and hands each chunk's part to the sinks; a
// single whole-tensor copy goes straight into its destination. Throws CheckpointError on a
// checksum mismatch (damage: the caller falls back).
void read_entry(int fd, const TensorEntry& e, const std::vector<Sink>& sinks,
                const std::string& dpath) {
  std::string got;
  if (sinks.size() == 1 && !sinks[0].add && sinks[0].src == 0 && sinks[0].bytes == e.bytes &&
      sinks[0].widen == DType::kF32) {
    got = hash_range(fd, e.offset, e.bytes, sinks[0].dst, dpath);
  } else {
    constexpr uint64_t kChunk = 8u << 20;  // a multiple of 4: f32 sinks split on floats
    auto buf = std::make_unique<char[]>(std::min<uint64_t>(kChunk, e.bytes ? e.bytes : 1));
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    try {
      for (uint64_t pos = 0; pos < e.bytes;) {
        const uint64_t n = std::min<uint64_t>(kChunk, e.bytes - pos);
        fs::pread_all(fd, buf.get(), n, e.offset + pos, dpath);
        XXH3_64bits_update(st, buf.get(), n);
        for (const Sink& k : sinks) {
          const uint64_t a = std::max(pos, k.src), b = std::min(pos + n, k.src + k.bytes);
          if (a >= b) continue;
          const char* src = buf.get() + (a - pos);
          if (k.widen != DType::kF32) {  // 16-bit elements into f32 (chunks split on 2 bytes)
            float* wide = reinterpret_cast<float*>(k.dst) + (a - k.src) / 2;
            for (uint64_t i = 0; i < (b - a) / 2; ++i) {
              uint16_t h;
              std::memcpy(&h, src + 2 * i, 2);
              wide[i] = half_to_f32(k.widen, h);
            }
            continue;
          }
          char* dst = k.dst + (a - k.src);
          if (!k.add) {
            std::memcpy(dst, src, b - a);
            continue;
          }
          for (uint64_t i = 0; i < b - a; i += 4) {
            float x, y;
            std::memcpy(&x, dst + i, 4);
            std::memcpy(&y, src + i, 4);
            x += y;
            std::memcpy(dst + i, &x, 4);
          }
        }
        pos += n;
      }
    } catch (...) {
      XXH3_freeState(st);
      throw;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, XXH3_64bits_digest(st));
    XXH3_freeState(st);
    got = hex;
  }
  if (got != e.xxh3)
    throw CheckpointError(dpath + ": tensor '" + e.name + "' checksum mismatch (manifest " +
                          e.xxh3 + ", data " + got + ")");
}

std::string json_value_text(const json* v) {
  return v ? v->dump() : std::string("unset");
}

// The checkpoint's model record against the job's: "" when equal, else what differs. Compared:
// every key of a record 2 but max_positions (informative), and dtype only on a resume (init_from
// converts: the weights are widened exactly into the fp32 master, and a bf16 job rounds its
// copy each pass with the one rounding); of a record 1 (shape only) the keys it holds.
std::string model_difference(const json& ckpt_model, const json& job_model, bool init_from) {
  std::string out;
  const bool settings = ckpt_model.contains("record");
  std::vector<std::string> keys;
  for (auto it = ckpt_model.begin(); it != ckpt_model.end(); ++it) keys.push_back(it.key());
  if (settings)
    for (auto it = job_model.begin(); it != job_model.end(); ++it)
      if (!ckpt_model.contains(it.key())) keys.push_back(it.key());
  for (const std::string& k : keys) {
    if (k == "max_positions" || (k == "dtype" && init_from)) continue;
    const json* a = ckpt_model.contains(k) ? &ckpt_model.at(k) : nullptr;
    const json* b = job_model.contains(k) ? &job_model.at(k) : nullptr;
    if (a && b && *a == *b) continue;
    if (!b && !settings) continue;
    if (!out.empty()) out += ", ";
    out += k + " " + json_value_text(a) + " (this job: " + json_value_text(b) + ")";
    if (k == "dtype" && a && a->is_string())
      out += ": a resume continues in the checkpoint's model.dtype (set model.dtype: " +
             a->get<std::string>() + ", or start a new run from it with model.init_from, which "
             "converts)";
  }
  return out;
}

// Where each target comes from in one checkpoint: per shard, the tensors to read; the targets
// this node fills with zeros. Throws CheckpointMismatch when a target has no source that fits.
struct Plan {
  std::vector<std::vector<Read>> reads;  // per shard of the checkpoint
  std::vector<size_t> zero;              // target indices
};

Plan plan_load(const std::string& path, const std::vector<ShardManifest>& shards, int node_rank,
               int nodes, const std::vector<LoadTarget>& targets, const Layout* job) {
  const int writers = static_cast<int>(shards.size());
  const bool same_count = writers == nodes;
  Plan plan;
  plan.reads.resize(shards.size());
  std::vector<std::map<size_t, size_t>> read_of(shards.size());  // entry -> index in reads[s]
  auto add_sink = [&](int s, size_t entry, Sink k) {
    auto [it, fresh] = read_of[s].try_emplace(entry, plan.reads[s].size());
    if (fresh) plan.reads[s].push_back({entry, {}});
    plan.reads[s][it->second].sinks.push_back(k);
  };
  auto manifest = [&](int s) { return path + "/" + detail::shard_manifest_name(s); };
  auto find = [&](int s, const std::string& name) -> const TensorEntry* {
    for (const TensorEntry& e : shards[s].tensors)
      if (e.name == name) return &e;
    return nullptr;
  };
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    const LoadTarget& t = targets[ti];
    const uint64_t n = elements(t.shape);
    const uint64_t tbytes = n * dtype_size(t.dtype);
    // Shard s's copy of t: by name, else (format 1) a slice of the flat tensor. nullopt: none.
    // A bf16 / f16 copy (ringctl import keeps a 16-bit source's precision) loads into an f32
    // target, widened exactly; `widen` says so.
    DType widen = DType::kF32;
    auto source = [&](int s) -> std::optional<std::pair<size_t, uint64_t>> {
      if (const TensorEntry* e = find(s, t.name)) {
        widen = DType::kF32;
        if (e->shape == t.shape && !t.per_node && widens_exactly(e->dtype, t.dtype)) {
          widen = e->dtype;
        } else if (e->dtype != t.dtype || e->shape != t.shape)
          throw CheckpointMismatch(manifest(s) + ": tensor '" + t.name + "' is " +
                                   dtype_name(e->dtype) + " " + shape_str(e->shape) +
                                   ", this job expects " + dtype_name(t.dtype) + " " +
                                   shape_str(t.shape));
        return std::pair{static_cast<size_t>(e - shards[s].tensors.data()), uint64_t{0}};
      }
      if (t.flat_name.empty()) return std::nullopt;
      const TensorEntry* f = find(s, t.flat_name);
      if (!f) return std::nullopt;
      const uint64_t fn = elements(f->shape);
      if (f->dtype != t.dtype || f->shape.size() != 1)
        throw CheckpointMismatch(manifest(s) + ": flat tensor '" + t.flat_name + "' is " +
                                 dtype_name(f->dtype) + " " + shape_str(f->shape) +
                                 ", this job expects a flat " + dtype_name(t.dtype) + " one");
      if (job && job->total_floats > 0 && fn != static_cast<uint64_t>(job->total_floats))
        throw CheckpointMismatch(manifest(s) + ": flat tensor '" + t.flat_name + "' holds " +
                                 std::to_string(fn) + " elements, this job's layout " +
                                 std::to_string(job->total_floats) + " (another model)");
      if (t.flat_offset < 0 || static_cast<uint64_t>(t.flat_offset) > fn ||
          n > fn - static_cast<uint64_t>(t.flat_offset))
        throw CheckpointMismatch(manifest(s) + ": flat tensor '" + t.flat_name + "' holds " +
                                 std::to_string(fn) + " elements, too few for '" + t.name +
                                 "' at " + std::to_string(t.flat_offset) + " (another model)");
      return std::pair{static_cast<size_t>(f - shards[s].tensors.data()),
                       static_cast<uint64_t>(t.flat_offset) * dtype_size(t.dtype)};
    };
    char* dst = static_cast<char*>(t.data);
    // The writers holding t's name: every one for a per-node tensor; with parallel.shard full
    // the residual is the owner's (one copy), which as a per-node tensor is the sum over the
    // writers that have it.
    int holders = 0;
    for (int s = 0; s < writers; ++s) holders += find(s, t.name) != nullptr;
    const bool owner_only = holders > 0 && holders < writers;
    if (t.per_node) {
      if (same_count && !owner_only) {
        auto src = source(node_rank);
        if (!src)
          throw CheckpointMismatch(manifest(node_rank) + ": has no tensor '" + t.name +
                                   "' (the model or optimizer changed)");
        add_sink(node_rank, src->first, {dst, src->second, tbytes, false});
        continue;
      }
      // Another node count (or an owner's copy): node 0 takes the sum over the writer's nodes,
      // the others zeros. Every node checks every shard, so all of them refuse the same
      // checkpoint.
      bool first = true;
      for (int s = 0; s < writers; ++s) {
        auto src = source(s);
        if (!src && owner_only) continue;
        if (!src)
          throw CheckpointMismatch(manifest(s) + ": has no tensor '" + t.name +
                                   "' (the model or optimizer changed)");
        if (t.dtype != DType::kF32 && writers > 1)
          throw CheckpointMismatch(manifest(s) + ": per-node tensor '" + t.name + "' is " +
                                   dtype_name(t.dtype) +
                                   "; only f32 ones can be summed onto another node count");
        if (node_rank == 0) add_sink(s, src->first, {dst, src->second, tbytes, !first});
        first = false;
      }
      if (node_rank != 0) plan.zero.push_back(ti);
      continue;
    }
    // The top-k residual of a shard full job (one copy, the owner's) from a checkpoint whose
    // nodes each saved their own (shard none or optimizer): the sum over the writers, which is
    // what error feedback owes the model.
    if (holders > 1 && t.name.rfind("residual/", 0) == 0 && t.dtype == DType::kF32) {
      bool first = true;
      for (int s = 0; s < writers; ++s) {
        auto src = source(s);
        if (!src) continue;
        add_sink(s, src->first, {dst, src->second, tbytes, !first});
        first = false;
      }
      continue;
    }
    // One copy: this node's own shard first (same node count), else the lowest node with it.
    std::vector<int> order;
    if (same_count) order.push_back(node_rank);
    for (int s = 0; s < writers; ++s)
      if (!same_count || s != node_rank) order.push_back(s);
    int chosen = -1;
    for (int s : order)
      if (find(s, t.name)) {
        chosen = s;
        break;
      }
    if (chosen < 0 && !t.flat_name.empty())
      for (int s : order)
        if (find(s, t.flat_name)) {
          chosen = s;
          break;
        }
    if (chosen < 0)
      throw CheckpointMismatch(path + ": no shard has tensor '" + t.name +
                               "' (the model or optimizer changed)");
    auto src = source(chosen);
    add_sink(chosen, src->first,
             {dst, src->second, widen == DType::kF32 ? tbytes : n * 2, false, widen});
  }
  return plan;
}

}  // namespace

namespace {

// Loads `info` (a committed checkpoint) into the targets. Returns false, with the reason added to
// res.skipped, when it is damaged; throws CheckpointMismatch when it does not fit the job.
bool try_load(const CheckpointInfo& info, int node_rank, int nodes,
              const std::vector<LoadTarget>& targets, const Layout* job, LoadResult& res,
              bool init_from) {
  if (info.status == Status::kCorrupt) {
    res.skipped.push_back(info.name + ": " +
                          (info.problems.empty() ? "corrupt" : info.problems.front()));
    return false;
  }
  try {
    auto [top, shards] = check_step_dir(info.path, info.step, false);
    // Structure first: a checkpoint of another model is a hard error, not damage.
    if (job && top.layout && !job->model.empty() && !top.layout->model.empty()) {
      std::string diff = model_difference(top.layout->model, job->model, init_from);
      if (!diff.empty())
        throw CheckpointMismatch(info.path + "/" + detail::kTopManifest +
                                 ": written for another model: " + diff);
    }
    Plan plan = plan_load(info.path, shards, node_rank, nodes, targets, job);
    // Then data, checksum by checksum, only from the shards that hold a needed tensor, in
    // node order (a per-node sum adds node 1 onto node 0's copy, then node 2, ...).
    std::vector<std::string> read;
    try {
      for (size_t s = 0; s < shards.size(); ++s) {
        if (plan.reads[s].empty()) continue;
        const std::string dpath = fs::join(info.path, shards[s].data_file);
        Fd fd(dpath);
        read.push_back(shards[s].data_file);
        for (const Read& r : plan.reads[s])
          read_entry(fd.fd, shards[s].tensors[r.entry], r.sinks, dpath);
      }
    } catch (const CheckpointError& e) {
      res.skipped.push_back(info.name + ": " + e.what());
      return false;
    }
    for (size_t ti : plan.zero)
      std::memset(targets[ti].data, 0,
                  elements(targets[ti].shape) * dtype_size(targets[ti].dtype));
    const ShardManifest& sm = shards[node_rank < top.nodes ? node_rank : 0];
    res.loaded = true;
    res.step = info.step;
    res.path = info.path;
    res.name = info.name;
    res.tag = top.tag;
    res.spec_hash = sm.spec_hash;
    res.meta = sm.meta;
    res.nodes = top.nodes;
    res.format_version = top.format_version;
    res.layout = top.layout;
    res.shards_read = std::move(read);
    return true;
  } catch (const CheckpointMismatch&) {
    throw;
  } catch (const CheckpointError& e) {
    res.skipped.push_back(info.name + ": " + e.what());
    return false;
  }
}

void describe_load(const std::string& dir, int nodes, LoadResult& res) {
  if (res.loaded) {
    res.message = "loaded " + res.name + " from " + dir;
    if (res.nodes != nodes)
      res.message +=
          " (written by " +
          (res.layout ? describe_layout(*res.layout) : std::to_string(res.nodes) + " nodes") +
          "; resharded onto " + std::to_string(nodes) + " nodes)";
    if (!res.skipped.empty()) {
      res.message += "; fell back past " + std::to_string(res.skipped.size()) + " damaged: ";
      for (size_t i = 0; i < res.skipped.size(); ++i)
        res.message += (i ? "; " : "") + res.skipped[i];
    }
  } else {
    res.message = "no usable checkpoint in " + dir;
    if (!res.skipped.empty()) {
      res.message += " (" + std::to_string(res.skipped.size()) + " damaged: ";
      for (size_t i = 0; i < res.skipped.size(); ++i)
        res.message += (i ? "; " : "") + res.skipped[i];
      res.message += ")";
    }
    if (res.superseded > 0)
      res.message += "; " + std::to_string(res.superseded) +
                     " complete checkpoint(s) there are superseded (of an earlier run or an "
                     "abandoned branch; `ringctl checkpoints " + dir + "` lists them)";
  }
}

}  // namespace

namespace {

LoadResult load_newest(const std::string& dir, int node_rank, int nodes,
                       const std::vector<LoadTarget>& targets, int64_t max_step,
                       const Layout* job, bool init_from) {
  LoadResult res;
  if (nodes < 1 || node_rank < 0 || node_rank >= nodes)
    throw CheckpointError("load: node_rank " + std::to_string(node_rank) + " of " +
                          std::to_string(nodes) + " nodes is out of range");
  if (!fs::exists(dir)) {
    res.message = "no checkpoint in " + dir + " (the directory does not exist)";
    return res;
  }
  const std::vector<CheckpointInfo> all = list_checkpoints(dir, /*verify=*/false);
  for (const CheckpointInfo& c : all) res.superseded += c.superseded ? 1 : 0;
  // The current lineage only, newest first: never a checkpoint of an abandoned branch.
  for (size_t i : current_lineage(all, read_latest(dir))) {
    const CheckpointInfo& info = all[i];
    if (info.step > max_step) continue;
    if (try_load(info, node_rank, nodes, targets, job, res, init_from)) break;
  }
  describe_load(dir, nodes, res);
  return res;
}

}  // namespace

LoadResult load_latest(const std::string& dir, int node_rank, int nodes,
                       const std::vector<LoadTarget>& targets, int64_t max_step,
                       const Layout* job) {
  return load_newest(dir, node_rank, nodes, targets, max_step, job, false);
}

LoadResult load_from_path(const std::string& path, int node_rank, int nodes,
                          const std::vector<LoadTarget>& targets, const Layout* job) {
  if (!fs::is_dir(path)) throw CheckpointError(path + " is not a directory");
  // A step directory (it has the commit record) loads that checkpoint and nothing else;
  // otherwise the directory is a checkpoint root: its current lineage's newest complete step.
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (fs::exists(fs::join(p, "checkpoint.json"))) {
    const std::optional<detail::StepName> name = detail::parse_step_name(fs::basename(p));
    if (!name || name->partial)
      throw CheckpointError(p + " has a checkpoint.json but is not named step-<N>");
    LoadResult r;
    const CheckpointInfo info = inspect_checkpoint(p, false);
    if (!try_load(info, node_rank, nodes, targets, job, r, true)) {
      std::string why;
      for (const std::string& sk : r.skipped) why += (why.empty() ? "" : "; ") + sk;
      throw CheckpointError("no complete checkpoint of step " + std::to_string(name->step) + " in " +
                            fs::dirname(p) + " (" + p + (why.empty() ? "" : ": " + why) + ")");
    }
    describe_load(fs::dirname(p), nodes, r);
    return r;
  }
  LoadResult r = load_newest(p, node_rank, nodes, targets, INT64_MAX, job, true);
  if (!r.loaded) throw CheckpointError("no complete checkpoint in " + p + " (" + r.message + ")");
  return r;
}

}  // namespace ring::ckpt
