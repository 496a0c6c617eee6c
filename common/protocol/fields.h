// The protocol's field table, as data: what each message type's top-level fields are (from the
// same per-message description that drives protocol.cc's reader and writer). For tests and
// tools that enumerate the protocol (every message, every field, its kind and range).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ring::protocol {

struct FieldRule {
  std::string key;
  // integer | number | string | node | boolean | enum | strings | integers | object | objects
  std::string kind;
  bool required = false;
  std::optional<double> lo, hi;      // integer/number: the range; string: the length range
  std::vector<std::string> choices;  // enum
};

// Every message type ("register", ..., "steps_reply"), in the order of protocol::Message.
std::vector<std::string> message_types();
// The top-level fields of a message type, in the order they are checked ("v" and "type" aside).
// Empty for an unknown type.
std::vector<FieldRule> field_rules(std::string_view type);

}  // namespace ring::protocol
