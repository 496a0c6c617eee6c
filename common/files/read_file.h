// Reading a whole file given by a user or written by another program, the one way: a regular file
// only (a FIFO or a device never blocks the caller or streams forever), at most max_bytes, read
// whole. The writing side is atomic_write.h.
//
//   std::string text = ring::files::read_regular_file("model.yaml", 1 << 20);
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace ring::files {

// "PATH: missing", "PATH: cannot open: Permission denied", "PATH: not a regular file (a FIFO)",
// "PATH: 3000000 bytes, over the limit of 1048576", "PATH: cannot read: ...".
class ReadError : public std::runtime_error {
 public:
  ReadError(const std::string& message, bool missing)
      : std::runtime_error(message), missing_(missing) {}
  bool missing() const { return missing_; }  // the path does not exist

 private:
  bool missing_;
};

inline constexpr size_t kDefaultMaxRead = size_t{1} << 30;

// The file's bytes (a symbolic link to a regular file is followed). Throws ReadError.
std::string read_regular_file(const std::string& path, size_t max_bytes = kDefaultMaxRead);

}  // namespace ring::files
