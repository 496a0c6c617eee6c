#include "common/files/append_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ring::files {

int open_private_append(const std::string& path, std::string* why) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK,
             0600);
  if (fd < 0) {
    const int e = errno;
    *why = e == ELOOP ? path + " is a symbolic link; refusing to write through it"
                      : "cannot open " + path + ": " + std::strerror(e);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    *why = path + " is not a regular file; refusing to write into it";
    return -1;
  }
  if (st.st_uid == ::geteuid() && (st.st_mode & 077)) ::fchmod(fd, 0600);
  ::fcntl(fd, F_SETFL, O_WRONLY | O_APPEND);  // clears O_NONBLOCK
  return fd;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool AppendFile::open(const std::string& path, std::string* why) {
  path_ = path;
  fd_ = open_private_append(path, why);
  return fd_ >= 0;
}

bool AppendFile::write_line(const std::string& line, std::string* why) {
  if (fd_ < 0) return false;
  const std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd_, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = "cannot write " + path_ + ": " + std::strerror(n < 0 ? errno : EIO);
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace ring::files
