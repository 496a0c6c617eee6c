// Checkpoint manifests and their validation against the data files (common/checkpoint/reader.cc)
// and the loader cursor a resumed job takes from the manifest's meta (worker/data/cursor.h).
//
// Input: one flags byte, then up to three sections separated by "\n--8<--\n": the text of
// checkpoint.json, of node-00000.json and the bytes of node-00000.bin (a missing section is a
// missing file). They are written to <tmp>/ckpt/step-00000005/ and the directory is parsed,
// inspected with verify, listed and loaded. The fuzzer cannot compute checksums, so flags ask
// the harness to fix them up after mutation (the rest of the JSON stays as the fuzzer made it):
//   bit 0  set shards[0].manifest_xxh3 in checkpoint.json to the shard manifest's real xxh3
//   bit 1  set each tensor's xxh3 in the shard manifest to that of its bytes in the data file
//   bit 2  load with the shard manifest's own tensors as targets (else a fixed f32 [4] "w")
//   bit 3  write `latest` naming the step
// (A seed whose manifests should parse needs bits 0 and 1; its own xxh3 values can be zeros.)
// Properties: errors are CheckpointError (CheckpointMismatch only from loading), never another
// exception or a crash; what parse_shard_manifest accepts lies inside data_bytes without
// overlaps; a verified complete checkpoint and a load hold exactly the file's bytes.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"
#include "tests/fuzz/targets.h"
#include "worker/data/cursor.h"
#include "worker/data/errors.h"

namespace ring::fuzz {
namespace {

namespace ck = ring::ckpt;
using nlohmann::json;

constexpr std::string_view kSep = "\n--8<--\n";
constexpr size_t kMaxTargetBytes = 4u << 20;

char g_root_at_exit[4096];

const std::string& root() {
  static const std::string r = [] {
    const char* t = getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/ring-ckpt-fuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) fail("checkpoint", "mkdtemp " + tmpl + " failed");
    // libFuzzer and the replay test end through exit(): remove the directory then (from a
    // copy: the handler runs after this string is destroyed).
    std::snprintf(g_root_at_exit, sizeof g_root_at_exit, "%s", tmpl.c_str());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(g_root_at_exit, ec);
    });
    return tmpl;
  }();
  return r;
}

void write_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail("checkpoint", "cannot write " + path);
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w <= 0) fail("checkpoint", "cannot write " + path);
    off += static_cast<size_t>(w);
  }
  ::close(fd);
}

json parse_quiet(const std::string& text) {
  try {
    return json::parse(text, nullptr, false);
  } catch (const json::exception&) {
    return json(json::value_t::discarded);
  }
}

bool fits(const json& t, size_t size, uint64_t& off, uint64_t& len) {
  if (!t.is_object()) return false;
  auto o = t.find("offset"), b = t.find("bytes");
  if (o == t.end() || b == t.end() || !o->is_number_unsigned() || !b->is_number_unsigned())
    return false;
  off = o->get<uint64_t>();
  len = b->get<uint64_t>();
  return off <= size && len <= size - off;
}

}  // namespace

void checkpoint_input(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::string_view> parts;
  for (;;) {
    const size_t at = parts.size() < 2 ? rest.find(kSep) : std::string_view::npos;
    parts.push_back(rest.substr(0, at));
    if (at == std::string_view::npos) break;
    rest.remove_prefix(at + kSep.size());
  }
  std::string top(parts[0]);
  std::string shard = parts.size() > 1 ? std::string(parts[1]) : std::string();
  const std::string_view bin = parts.size() > 2 ? parts[2] : std::string_view();

  if ((flags & 2) && parts.size() > 1) {
    json m = parse_quiet(shard);
    if (m.is_object() && m.contains("tensors") && m["tensors"].is_array()) {
      for (auto& t : m["tensors"]) {
        uint64_t off, len;
        if (fits(t, bin.size(), off, len)) t["xxh3"] = ck::xxh3_hex(bin.data() + off, len);
      }
      shard = m.dump();
    }
  }
  if ((flags & 1) && parts.size() > 1) {
    json t = parse_quiet(top);
    if (t.is_object() && t.contains("shards") && t["shards"].is_array() && !t["shards"].empty() &&
        t["shards"][0].is_object()) {
      t["shards"][0]["manifest_xxh3"] = ck::xxh3_hex(shard.data(), shard.size());
      top = t.dump();
    }
  }

  const std::string dir = root() + "/ckpt";
  const std::string step_dir = dir + "/step-00000005";
  ::mkdir(dir.c_str(), 0700);
  ::mkdir(step_dir.c_str(), 0700);
  const std::string files[] = {"checkpoint.json", "node-00000.json", "node-00000.bin"};
  for (const auto& f : files) ::unlink((step_dir + "/" + f).c_str());
  ::unlink((dir + "/latest").c_str());
  write_file(step_dir + "/checkpoint.json", top);
  if (parts.size() > 1) write_file(step_dir + "/node-00000.json", shard);
  if (parts.size() > 2) write_file(step_dir + "/node-00000.bin", bin);
  if (flags & 8) write_file(dir + "/latest", "step-00000005\n");

  // The shard manifest alone.
  std::optional<ck::ShardManifest> sm;
  try {
    sm = ck::parse_shard_manifest(shard, "node-00000.json");
  } catch (const ck::CheckpointError&) {
  }
  if (sm) {
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& t : sm->tensors) {
      if (t.offset > sm->data_bytes || t.bytes > sm->data_bytes - t.offset)
        fail("checkpoint", "accepted tensor '" + t.name + "' outside data_bytes");
      ranges.emplace_back(t.offset, t.offset + t.bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second)
        fail("checkpoint", "accepted overlapping tensors");
  }

  // Inspection with verify, then listing: problems are reported, never thrown.
  const ck::CheckpointInfo info = ck::inspect_checkpoint(step_dir, /*verify=*/true);
  if (info.status == ck::Status::kComplete) {
    if (!info.problems.empty()) fail("checkpoint", "complete with problems: " + info.problems[0]);
    if (!sm) fail("checkpoint", "complete although node-00000.json does not parse");
    if (sm->data_bytes != bin.size())
      fail("checkpoint", "complete with a data file of another size");
    for (const auto& t : sm->tensors)
      if (ck::xxh3_hex(bin.data() + t.offset, t.bytes) != t.xxh3)
        fail("checkpoint", "verified complete with a checksum mismatch in '" + t.name + "'");
  } else if (info.problems.empty()) {
    fail("checkpoint", "not complete and no problem named");
  }
  try {
    (void)ck::list_checkpoints(dir, /*verify=*/false);
  } catch (const ck::CheckpointError&) {
    fail("checkpoint", "list_checkpoints threw on a readable directory");
  }

  // Loading into targets.
  std::vector<ck::LoadTarget> targets;
  std::vector<std::vector<char>> buffers;
  if ((flags & 4) && sm) {
    size_t total = 0;
    for (const auto& t : sm->tensors) total += t.bytes;
    if (total <= kMaxTargetBytes)
      for (const auto& t : sm->tensors) {
        buffers.emplace_back(std::max<size_t>(t.bytes, 1));
        targets.push_back({t.name, t.dtype, t.shape, buffers.back().data()});
      }
  } else {
    buffers.emplace_back(16);
    targets.push_back({"w", ck::DType::kF32, {4}, buffers.back().data()});
  }
  ck::LoadResult r;
  try {
    r = ck::load_latest(dir, 0, 1, targets);
  } catch (const ck::CheckpointMismatch&) {
    return;
  } catch (const ck::CheckpointError& e) {
    fail("checkpoint",
         std::string("load_latest threw a CheckpointError that is not a mismatch: ") + e.what());
  }
  if (!r.loaded) {
    if (r.message.empty()) fail("checkpoint", "not loaded and no message");
    return;
  }
  if (r.step != 5 || !sm) fail("checkpoint", "loaded a step that is not there");
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto it =
        std::find_if(sm->tensors.begin(), sm->tensors.end(),
                     [&](const ck::TensorEntry& e) { return e.name == targets[i].name; });
    if (it == sm->tensors.end()) fail("checkpoint", "loaded a tensor the manifest does not have");
    if (it->bytes && std::memcmp(buffers[i].data(), bin.data() + it->offset, it->bytes) != 0)
      fail("checkpoint", "loaded bytes differ from the data file for '" + it->name + "'");
  }
  // ringd reads meta.value("cursor", ...), which throws for anything but an object.
  if (!r.meta.is_object())
    fail("checkpoint", "loaded meta that is not an object: " + r.meta.dump());
  // A resumed job hands meta.cursor to its workers, which decode it.
  if (r.meta.contains("cursor")) {
    try {
      (void)r.meta["cursor"].get<data::Cursor>();
    } catch (const data::DataError&) {
    }
  }
}

}  // namespace ring::fuzz
