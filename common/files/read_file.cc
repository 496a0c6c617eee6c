#include "common/files/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ring::files {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "not a plain file";
}

}  // namespace

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer would wait; it is refused below instead.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) throw ReadError(path + ": missing", true);
    throw ReadError(path + ": cannot open: " + std::strerror(e), false);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw ReadError(path + ": cannot stat: " + std::strerror(errno), false);
  if (!S_ISREG(st.st_mode))
    throw ReadError(path + ": not a regular file (" + kind_of(st.st_mode) + ")", false);
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw ReadError(path + ": " + std::to_string(st.st_size) + " bytes, over the limit of " +
                        std::to_string(max_bytes),
                    false);
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = ::pread(fd, s.data() + got, s.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ReadError(path + ": cannot read: " + std::strerror(errno), false);
    if (n == 0) break;  // shrunk while read: what is there
    got += static_cast<size_t>(n);
  }
  s.resize(got);
  return s;
}

}  // namespace ring::files
