#include "worker/data/cursor.h"

#include <string>

#include <nlohmann/json.hpp>

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {
namespace {

const nlohmann::json& field(const nlohmann::json& j, const char* key, const char* where) {
  if (!j.is_object()) throw DataError(fmt::format("loader cursor: {} is not a JSON object", where));
  auto it = j.find(key);
  if (it == j.end()) throw DataError(fmt::format("loader cursor: missing field {}.{}", where, key));
  return *it;
}

int64_t get_int(const nlohmann::json& j, const char* key, const char* where) {
  const auto& v = field(j, key, where);
  if (!v.is_number_integer())
    throw DataError(
        fmt::format("loader cursor: {}.{} must be an integer, got {}", where, key, v.dump()));
  return v.get<int64_t>();
}

}  // namespace

void to_json(nlohmann::json& j, const Cursor& c) {
  const DataIdentity& d = c.identity;
  j = nlohmann::json{
      {"version", kCursorVersion},
      {"epoch", c.epoch},
      {"index", c.index},
      {"offset", c.offset},
      {"data",
       {{"source", d.source},
        {"seed", d.seed},
        {"seq_len", d.seq_len},
        {"pack", d.pack},
        {"num_docs", d.num_docs},
        {"total_tokens", d.total_tokens},
        {"content_hash", fmt::format("{:016x}", d.content_hash)}}},
  };
}

void from_json(const nlohmann::json& j, Cursor& c) {
  int64_t version = get_int(j, "version", "cursor");
  if (version != kCursorVersion)
    throw DataError(fmt::format("loader cursor: version {} is not supported (this build reads {})",
                                version, kCursorVersion));
  Cursor out;
  out.epoch = get_int(j, "epoch", "cursor");
  out.index = get_int(j, "index", "cursor");
  out.offset = get_int(j, "offset", "cursor");
  if (out.epoch < 0 || out.index < 0 || out.offset < 0)
    throw DataError(
        fmt::format("loader cursor: epoch ({}), index ({}) and offset ({}) must not "
                    "be negative",
                    out.epoch, out.index, out.offset));
  const auto& d = field(j, "data", "cursor");
  const auto& source = field(d, "source", "cursor.data");
  if (!source.is_string()) throw DataError("loader cursor: cursor.data.source must be a string");
  out.identity.source = source.get<std::string>();
  out.identity.seed = get_int(d, "seed", "cursor.data");
  out.identity.seq_len = get_int(d, "seq_len", "cursor.data");
  const auto& pack = field(d, "pack", "cursor.data");
  if (!pack.is_boolean()) throw DataError("loader cursor: cursor.data.pack must be a boolean");
  out.identity.pack = pack.get<bool>();
  out.identity.num_docs = get_int(d, "num_docs", "cursor.data");
  out.identity.total_tokens = get_int(d, "total_tokens", "cursor.data");
  const auto& hash = field(d, "content_hash", "cursor.data");
  std::string h = hash.is_string() ? hash.get<std::string>() : "";
  if (h.size() != 16 || h.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw DataError(fmt::format(
        "loader cursor: cursor.data.content_hash must be 16 lowercase hex digits, got {}",
        hash.dump()));
  out.identity.content_hash = std::stoull(h, nullptr, 16);
  c = std::move(out);
}

void check_identity(const DataIdentity& saved, const DataIdentity& expected) {
  std::string diff;
  auto note = [&](const char* key, const std::string& was, const std::string& now) {
    if (was == now) return;
    diff += fmt::format("{}{}: the cursor was saved with {}, this loader has {}",
                        diff.empty() ? "" : "; ", key, was, now);
  };
  note("data.source", saved.source, expected.source);
  note("data.seed", std::to_string(saved.seed), std::to_string(expected.seed));
  note("data.seq_len", std::to_string(saved.seq_len), std::to_string(expected.seq_len));
  note("data.pack", saved.pack ? "true" : "false", expected.pack ? "true" : "false");
  note("documents", std::to_string(saved.num_docs), std::to_string(expected.num_docs));
  note("corpus tokens", std::to_string(saved.total_tokens), std::to_string(expected.total_tokens));
  note("content hash", fmt::format("{:016x}", saved.content_hash),
       fmt::format("{:016x}", expected.content_hash));
  if (!diff.empty())
    throw DataError(
        "loader cursor does not match the data (resuming would not reproduce the "
        "same sequences): " +
        diff);
}

}  // namespace ring::data
