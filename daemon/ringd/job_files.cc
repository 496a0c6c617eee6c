#include "daemon/ringd/job_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/log/log.h"

namespace ring::ringd {

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

std::vector<std::string> last_lines(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 16384);
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  std::stringstream ss(text);
  // A worker's output is external text: any bytes (a crash dump, a binary printed by mistake).
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) lines.push_back(log::valid_utf8(l));
  if (from > 0 && !lines.empty()) lines.erase(lines.begin());  // a partial first line
  if (lines.size() > count) lines.erase(lines.begin(), lines.end() - count);
  return lines;
}

}  // namespace ring::ringd
