#include "common/files/dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "common/files/users.h"

namespace ring::files {

namespace {

std::string err(int e) { return std::strerror(e); }

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "?";
  return h;
}

struct flock whole_file(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;
  return fl;
}

// The holder's record: at most 64 KiB of JSON; anything else reads as unknown.
nlohmann::json read_record(int fd) {
  std::string text(65536, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  if (n <= 0) return nlohmann::json::object();
  text.resize(static_cast<size_t>(n));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace

std::string DirLock::describe(const nlohmann::json& r) {
  const auto str = [&](const char* k) -> std::string {
    auto it = r.find(k);
    if (it == r.end()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    return "";
  };
  std::string s;
  if (!str("job").empty()) s += "job " + str("job");
  if (!str("name").empty()) s += (s.empty() ? "job " : " ") + std::string("'") + str("name") + "'";
  if (!str("run").empty()) s += " (run " + str("run") + ")";
  const std::string prog = str("program").empty() ? "process" : str("program");
  if (!str("pid").empty())
    s += (s.empty() ? "" : ", ") + prog + " pid " + str("pid") +
         (str("host").empty() ? "" : " on host " + str("host"));
  if (!str("user").empty()) s += ", user " + str("user");
  if (auto it = r.find("since"); it != r.end() && it->is_number()) {
    const std::time_t t = static_cast<std::time_t>(it->get<double>());
    std::tm tm {};
    char buf[64];
    if (::gmtime_r(&t, &tm) && std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm))
      s += std::string(", since ") + buf;
  }
  return s.empty() ? "another process (its record is unreadable)" : s;
}

DirLock DirLock::acquire(const std::string& dir, const nlohmann::json& record) {
  const std::string path = dir + "/" + kFileName;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    throw DirLockError("cannot open the lock file " + path + ": " + err(errno) +
                       (errno == ELOOP ? " (a symbolic link: refusing to follow it)" : ""));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    ::close(fd);
    throw DirLockError("lock file " + path + " is not a regular file of yours (uid " +
                       std::to_string(st.st_uid) + "); remove it if no job uses " + dir);
  }
  struct flock fl = whole_file(F_WRLCK);
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    const int e = errno;
    if (e == EAGAIN || e == EACCES) {
      nlohmann::json holder = read_record(fd);
      ::close(fd);
      throw DirBusy(dir + " is in use by " + describe(holder), holder);
    }
    ::close(fd);
    throw DirLockError("cannot lock " + path + ": " + err(e));
  }
  nlohmann::json r = nlohmann::json::object();
  r["host"] = host_name();
  r["pid"] = static_cast<int64_t>(::getpid());
  r["user"] = user_name(::geteuid());
  r["since"] = static_cast<double>(std::time(nullptr));
  if (record.is_object())
    for (auto it = record.begin(); it != record.end(); ++it) r[it.key()] = it.value();
  const std::string text = r.dump() + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int e = errno;
    ::close(fd);
    throw DirLockError("cannot write the holder record to " + path + ": " + err(e));
  }
  return DirLock(fd, path);
}

std::optional<nlohmann::json> DirLock::holder(const std::string& dir) {
  const std::string path = dir + "/" + kFileName;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct flock fl = whole_file(F_WRLCK);
  std::optional<nlohmann::json> out;
  if (::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) out = read_record(fd);
  ::close(fd);
  return out;
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ring::files
