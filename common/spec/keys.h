// The declarative key table of the job spec.
//
// One row per key: path, type, default, allowed range or choices, description, and how to store
// the value in JobSpec. The parser (parse.cc), the validator, `ringctl validate` and the generated
// docs/spec-reference.md all read this table; nothing else lists keys.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/spec/spec.h"

namespace ring::spec {

enum class KeyType { kInt, kFloat, kBool, kString, kEnum, kStringList, kIntList };

const char* to_string(KeyType t);

// A parsed value. Enums are stored as their index in KeyDef::choices.
using Value = std::variant<int64_t, double, bool, std::string, std::vector<std::string>,
                           std::vector<int64_t>>;

struct KeyDef {
  std::string path;  // "model.d_model"
  KeyType type = KeyType::kInt;
  // Default applied before parsing; nullopt with required=false means "derived" (see derived).
  std::optional<Value> default_value;
  bool required = false;
  bool train_only = false;  // required of job.kind train only
  std::string derived;  // how an unset optional key is derived, for the docs
  // Allowed range for numbers (inclusive unless *_exclusive). Lists: min/max bound each element.
  std::optional<double> min;
  std::optional<double> max;
  bool min_exclusive = false;
  std::vector<std::string> choices;  // kEnum only
  std::string description;
  std::function<void(JobSpec&, const Value&)> set;
  std::function<std::optional<Value>(const JobSpec&)> get;

  std::string section() const { return path.substr(0, path.find('.')); }
  std::string name() const { return path.substr(path.find('.') + 1); }
};

// All keys, grouped by section in document order.
const std::vector<KeyDef>& spec_keys();
// Section names in document order, with a one-line description each.
const std::vector<std::pair<std::string, std::string>>& spec_sections();

const KeyDef* find_key(std::string_view path);

// Human-readable default ("512", "[]", "derived: d_model / heads", "required").
std::string default_text(const KeyDef& k);
// Human-readable range ("1 .. 1048576", "(0, 1]", "swiglu | gelu").
std::string range_text(const KeyDef& k);
std::string value_text(const Value& v, const KeyDef& k);

// A spec with every table default applied (required keys left zero/empty).
JobSpec default_spec();

// Markdown reference generated from the table (docs/spec-reference.md).
std::string spec_reference_markdown();

}  // namespace ring::spec
