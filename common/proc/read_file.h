// Reading a small file (most often under /proc) with read(2), never throwing; a process's state.
//
// Not an ifstream: reading /proc/<pid>/... of a process that is reaped between the open and the
// read fails with ESRCH, and libstdc++'s filebuf throws on a read error. Header-only, so the
// transport plugins (shared objects with few dependencies) can use it too.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace ring::proc {

// The whole file; "" when it cannot be opened or a read fails (for /proc: the process is gone).
inline std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      s.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) s.clear();
    break;
  }
  ::close(fd);
  return s;
}

// The state letter of a process from /proc/<pid>/stat ('R', 'S', 'Z', ...); 0 when there is no
// such process. The command name before it is in parentheses and may hold spaces and ')'.
inline char process_state(long pid) {
  const std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() ? s[close + 2] : 0;
}

}  // namespace ring::proc
