// Errors of the data pipeline (worker/data/).
//
// Every problem with the data (a path that cannot be read, a source with no documents, a cursor
// that does not match the data, a passkey sequence too short) is a DataError whose message names
// the path or key and the rule broken. Nothing in worker/data aborts on bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace ring::data {

class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ring::data
