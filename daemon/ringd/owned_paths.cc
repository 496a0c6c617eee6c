#include "daemon/ringd/owned_paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/proc/read_file.h"

namespace ring::ringd {
namespace {

std::string octal(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof(b), "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

std::string err(int e) { return std::strerror(e); }

// Our pid namespace ("pid:[4026531836]"): a pid means something only inside its namespace, and
// containers of one user may share /tmp.
std::string pid_namespace() {
  char buf[64] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("unknown");
}

}  // namespace

void ensure_own_dir(const std::string& dir, mode_t forbidden) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    if (::chmod(dir.c_str(), 0700) != 0)  // the umask may have cleared owner bits
      throw PathError("cannot chmod " + dir + ": " + err(errno));
  } else if (errno != EEXIST) {
    throw PathError("cannot create " + dir + ": " + err(errno));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) throw PathError("cannot stat " + dir + ": " + err(errno));
  if (S_ISLNK(st.st_mode)) throw PathError(dir + " is a symbolic link; refusing to use it");
  if (!S_ISDIR(st.st_mode)) throw PathError(dir + " exists and is not a directory");
  if (st.st_uid != ::geteuid())
    throw PathError(dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by us (uid " +
                    std::to_string(::geteuid()) + "); refusing to use it");
  if (st.st_mode & forbidden)
    throw PathError(dir + " has mode " + octal(st.st_mode) +
                    ((forbidden & 0055) ? "; it must not be accessible to group or others (chmod "
                                          "0700 "
                                        : "; it must not be writable by group or others (chmod "
                                          "0700 ") +
                    dir + ")");
}

void mark_own_dir(const std::string& dir, const std::string& text) {
  ensure_own_dir(dir, 0022);
  const std::string path = dir + "/" + kMarkerName;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw PathError("cannot create " + path + ": " + err(errno));
  const std::string t = text + "\n";
  const bool ok = ::write(fd, t.data(), t.size()) == static_cast<ssize_t>(t.size());
  const int e = errno;
  ::close(fd);
  if (!ok) throw PathError("cannot write " + path + ": " + err(e));
}

bool is_own_marked_dir(const std::string& dir, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = dir + ": " + w;
    return false;
  };
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return no(err(errno));
  if (S_ISLNK(st.st_mode)) return no("a symbolic link");
  if (!S_ISDIR(st.st_mode)) return no("not a directory");
  if (st.st_uid != ::geteuid()) return no("owned by uid " + std::to_string(st.st_uid));
  const std::string marker = dir + "/" + kMarkerName;
  struct stat ms;
  if (::lstat(marker.c_str(), &ms) != 0) return no("no marker " + std::string(kMarkerName));
  if (!S_ISREG(ms.st_mode) || ms.st_uid != ::geteuid())
    return no(std::string(kMarkerName) + " is not a regular file of ours");
  return true;
}

bool remove_own_dir(const std::string& dir, std::string* why) {
  if (!is_own_marked_dir(dir, why)) return false;
  // Everything but the marker first, the marker last: a ringd killed midway leaves a directory
  // that still says it is ringd's, which the next one removes (removed marker first, it was a
  // stranger's directory for good). std::filesystem::remove_all removes symbolic links
  // themselves and never descends into them.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename() == kMarkerName) continue;
    std::error_code rec;
    std::filesystem::remove_all(e.path(), rec);
    if (rec && !ec) ec = rec;
  }
  if (!ec) std::filesystem::remove(std::filesystem::path(dir) / kMarkerName, ec);
  if (!ec) std::filesystem::remove(dir, ec);
  if (ec) {
    if (why) *why = dir + ": " + ec.message();
    return false;
  }
  return true;
}

long long process_start_time(pid_t pid) {
  const std::string s = proc::read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t p = s.rfind(')');
  if (p == std::string::npos) return -1;
  // Fields after the command: 3 (state) ... 22 (starttime).
  int field = 2;
  const char* c = s.c_str() + p + 1;
  while (*c) {
    while (*c == ' ') ++c;
    if (!*c) break;
    ++field;
    if (field == 22) return std::strtoll(c, nullptr, 10);
    while (*c && *c != ' ') ++c;
  }
  return -1;
}

std::string runtime_base_dir() {
  // Room for "/ringd/ringd-<pid>/ctl.sock" under the 108-byte limit of a unix socket path.
  constexpr size_t kRoom = sizeof(sockaddr_un::sun_path) - 1 - 32;
  std::string base;
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (xdg && *xdg && xdg[0] == '/' && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) &&
      st.st_uid == ::geteuid() && std::strlen(xdg) + 11 < kRoom)
    base = std::string(xdg) + "/ringmaster";
  else
    base = "/tmp/ringmaster-" + std::to_string(::geteuid());
  // Not writable by others; ring-coord may have made it 0711 for a shared socket.
  ensure_own_dir(base, 0022);
  return base;
}

std::string make_control_dir(const std::function<void(const std::string&)>& note) {
  const std::string parent = runtime_base_dir() + "/ringd";
  ensure_own_dir(parent, 0077);
  // Directories of ringd processes that are gone (killed, a node reboot of a shared /tmp).
  if (DIR* d = ::opendir(parent.c_str())) {
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("ringd-", 0) == 0) names.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : names) {
      const std::string dir = parent + "/" + n;
      if (!is_own_marked_dir(dir)) continue;
      const std::string text = proc::read_file(dir + "/" + kMarkerName);
      long long pid = -1, start = -1;
      char ns[64] = {0};
      if (std::sscanf(text.c_str(), "ringd %lld %lld %63s", &pid, &start, ns) != 3 || pid <= 0)
        continue;
      if (pid == ::getpid() || ns != pid_namespace()) continue;  // not ours to judge
      const long long now = process_start_time(static_cast<pid_t>(pid));
      if (now >= 0 && now == start) continue;  // that ringd still runs
      std::string why;
      if (remove_own_dir(dir, &why))
        note("removed the control directory of ringd pid " + std::to_string(pid) +
             ", which is gone: " + dir);
      else
        note("could not remove a stale control directory: " + why);
    }
  }
  const std::string dir = parent + "/ringd-" + std::to_string(::getpid());
  std::string why;
  if (::access(dir.c_str(), F_OK) == 0 && !remove_own_dir(dir, &why))
    throw PathError("cannot reuse " + dir + ": " + why);
  ensure_own_dir(dir, 0077);
  mark_own_dir(dir, "ringd " + std::to_string(::getpid()) + " " +
                        std::to_string(process_start_time(::getpid())) + " " + pid_namespace());
  return dir;
}

}  // namespace ring::ringd
