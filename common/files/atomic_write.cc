#include "common/files/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace ring::files {
namespace {

std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

[[noreturn]] void fail(const std::string& path, const std::string& step, int err) {
  throw AtomicWriteError("cannot write " + path + ": " + step + ": " + std::strerror(err));
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view text, mode_t mode, bool fsync) {
  static std::atomic<unsigned> counter{0};
  // A name no other writer uses (pid and a counter); O_EXCL still refuses anything there.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 07777);
    if (fd < 0 && (errno != EEXIST || attempt >= 100)) fail(path, "create " + tmp, errno);
  }
  auto abandon = [&](const std::string& step, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, step, err);
  };
  // The umask may have removed bits the caller asked for (a script's x).
  if (::fchmod(fd, mode & 07777) != 0) abandon("chmod " + tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) abandon("write " + tmp, errno);
    done += static_cast<size_t>(n);
  }
  if (fsync && ::fsync(fd) != 0) abandon("fsync " + tmp, errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(path, "write " + tmp, e);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(path, "rename " + tmp, e);
  }
  if (!fsync) return;
  const std::string dir = parent_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail(path, "fsync directory " + dir, errno);
  // EINVAL: a file system that cannot sync directories (the rename is as durable as it gets).
  if (::fsync(dfd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(dfd);
    fail(path, "fsync directory " + dir, e);
  }
  ::close(dfd);
}

}  // namespace ring::files
