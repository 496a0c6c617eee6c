// Shared between the writer (checkpoint.cc) and the reader (reader.cc) of ring_checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"

namespace ring::ckpt::detail {

inline constexpr size_t kManifestLimit = 64u << 20;  // bytes; a manifest larger is refused
inline constexpr const char* kTopManifest = "checkpoint.json";
inline constexpr const char* kLatest = "latest";

std::string shard_manifest_name(int node_rank);  // "node-00000.json"
std::string shard_data_name(int node_rank);      // "node-00000.bin"
std::string shard_failed_name(int node_rank);    // "node-00000.failed"
std::string partial_dir_name(int64_t step, const std::string& tag);

// "step-00000050" -> 50 (kind final); "step-00000050.partial-<tag>" -> 50 (partial, tag);
// "step-00000050.superseded-<tag>" -> 50 (superseded: set aside when <tag> wrote step 50 again).
struct StepName {
  int64_t step = -1;
  bool partial = false;
  bool superseded = false;
  std::string tag;
};
std::string superseded_dir_name(int64_t step, const std::string& tag);
// The lineage record (`parent`) of a manifest: null or {"tag", "step"}.
nlohmann::json parent_json(const std::optional<CheckpointRef>& parent);
std::optional<StepName> parse_step_name(const std::string& name);

nlohmann::json shard_manifest_json(const ShardManifest& m);
double now_unix();

}  // namespace ring::ckpt::detail
