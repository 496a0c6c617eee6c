// The files ringd writes into the job directory (its log, steps.jsonl, the workers' logs) and
// reads back (the last lines of a worker's log when it dies).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ring::ringd {

// Opens a file ringd writes into the job directory (its log, steps.jsonl, a worker's log) for
// appending: never through a symbolic link (O_NOFOLLOW), only a regular file (a FIFO would block
// the open, so O_NONBLOCK until checked), created 0600 and made 0600 when an earlier version left
// it readable by others. Returns the descriptor, or -1 with the reason in `why`.
int open_private_append(const std::string& path, std::string* why);

// A line-oriented append-only file (ringd's log, steps.jsonl). A write error (a full disk) is
// kept, not thrown: the caller says it once.
class AppendFile {
 public:
  AppendFile() = default;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();
  bool open(const std::string& path, std::string* why);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Appends `line` and a newline; false (errno text in *why) when the write failed.
  bool write_line(const std::string& line, std::string* why);

 private:
  int fd_ = -1;
  std::string path_;
};

// The last `count` non-empty lines of the file's last 16 KiB (a partial first line dropped).
std::vector<std::string> last_lines(const std::string& path, size_t count);

}  // namespace ring::ringd
