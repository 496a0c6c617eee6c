// Appending to a private file, the one way: ringd's log, steps.jsonl and its workers' logs, and
// every log file written through common/log (log/file_sink.h). The reading side is read_file.h,
// whole-file replacement atomic_write.h.
//
//   ring::files::AppendFile f;
//   if (!f.open(dir + "/steps.jsonl", &why)) fail(why);   // "... is a symbolic link; refusing ..."
//   if (!f.write_line(record, &why)) say_once(why);        // "cannot write ...: No space left"
#pragma once

#include <string>

namespace ring::files {

// Opens `path` for appending: never through a symbolic link (O_NOFOLLOW), only a regular file (a
// FIFO would block the open, so O_NONBLOCK until checked), created 0600 and made 0600 when an
// earlier version left it readable by others. Returns the descriptor, or -1 with the reason in
// `why`.
int open_private_append(const std::string& path, std::string* why);

// A line-oriented append-only file. A write error (a full disk) is kept, not thrown: the caller
// says it once. Each line is one write(2) (O_APPEND): lines of several writers do not interleave.
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

}  // namespace ring::files
