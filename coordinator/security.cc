#include "coordinator/security.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ring::coord {

namespace {

std::string octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

void write_file_mode(const std::string& path, const std::string& text, mode_t mode) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) throw SecurityError("cannot create " + tmp + ": " + std::strerror(errno));
  if (::fchmod(fd, mode) != 0 ||
      ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    throw SecurityError("cannot write " + tmp + ": " + std::strerror(e));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw SecurityError("cannot rename " + tmp + ": " + std::strerror(errno));
}

}  // namespace

std::string default_socket_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (xdg && *xdg && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid())
    return std::string(xdg) + "/ringmaster";
  return "/tmp/ringmaster-" + std::to_string(::geteuid());
}

std::string default_endpoint() {
  return "ipc://" + default_socket_dir() + "/coord.sock";
}

void prepare_socket_dir(const std::string& dir, SocketMode mode) {
  const mode_t want = mode == SocketMode::kPrivate ? 0700 : 0711;
  if (::mkdir(dir.c_str(), want) == 0) {
    // The umask may have removed bits; set exactly what we want.
    if (::chmod(dir.c_str(), want) != 0)
      throw SecurityError("cannot chmod " + dir + ": " + std::strerror(errno));
  } else if (errno != EEXIST) {
    throw SecurityError("cannot create socket directory " + dir + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0)
    throw SecurityError("cannot stat " + dir + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode))
    throw SecurityError("socket directory " + dir + " is a symbolic link; refusing to use it");
  if (!S_ISDIR(st.st_mode))
    throw SecurityError("socket directory " + dir + " exists and is not a directory");
  if (st.st_uid != ::geteuid())
    throw SecurityError("socket directory " + dir + " is owned by uid " +
                        std::to_string(st.st_uid) + ", not by us (uid " +
                        std::to_string(::geteuid()) + "); remove it or choose another --endpoint");
  const mode_t forbidden = mode == SocketMode::kPrivate ? 0077 : 0022;
  if (st.st_mode & forbidden)
    throw SecurityError("socket directory " + dir + " has mode " + octal(st.st_mode) +
                        (mode == SocketMode::kPrivate
                             ? "; it must not be accessible to group or others (chmod 0700 "
                             : "; it must not be writable by group or others (chmod 0711 ") +
                        dir + ")");
}

void check_secret_file(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0)
    throw SecurityError("cannot stat " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw SecurityError(path + " is not a regular file");
  if (st.st_uid != ::geteuid())
    throw SecurityError(path + " is owned by uid " + std::to_string(st.st_uid) + ", not by us");
  if (st.st_mode & 0077)
    throw SecurityError(path + " has mode " + octal(st.st_mode) +
                        "; a secret key must be 0600 (chmod 0600 " + path + ")");
}

CurveKeyPair read_key_file(const std::string& path) {
  check_secret_file(path);
  std::ifstream f(path);
  CurveKeyPair k;
  std::string tag, val;
  while (f >> tag >> val) {
    if (tag == "public")
      k.public_key = val;
    else if (tag == "secret")
      k.secret_key = val;
  }
  if (k.public_key.size() != 40 || k.secret_key.size() != 40)
    throw SecurityError(path + ": expected 'public <z85>' and 'secret <z85>' lines (40 chars)");
  return k;
}

std::string read_public_key(const std::string& path) {
  std::ifstream f(path);
  std::string k;
  if (!(f >> k) || k.size() != 40)
    throw SecurityError("cannot read a Z85 public key (40 characters) from " + path);
  return k;
}

CurveKeyPair load_or_create_curve_keys(const std::string& dir, const std::string& basename) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw SecurityError("cannot create " + dir + ": " + std::strerror(errno));
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 0022))
    throw SecurityError("key directory " + dir +
                        " must be a directory owned by us and not writable by others");
  std::string key = dir + "/" + basename + ".key";
  std::string pub = dir + "/" + basename + ".pub";
  if (::access(key.c_str(), F_OK) == 0) {
    CurveKeyPair k = read_key_file(key);
    if (::access(pub.c_str(), F_OK) != 0) write_file_mode(pub, k.public_key + "\n", 0644);
    return k;
  }
  char pk[41], sk[41];
  if (zmq_curve_keypair(pk, sk) != 0)
    throw SecurityError(std::string("cannot create a CURVE key pair: ") +
                        zmq_strerror(zmq_errno()));
  CurveKeyPair k{pk, sk};
  write_file_mode(key, "public " + k.public_key + "\nsecret " + k.secret_key + "\n", 0600);
  write_file_mode(pub, k.public_key + "\n", 0644);
  return k;
}

std::vector<AuthorizedClient> read_authorized_clients(const std::string& path) {
  std::vector<AuthorizedClient> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    long long uid = -1;
    if (!(is >> key) || key[0] == '#') continue;
    if (!(is >> uid) || key.size() != 40 || uid < 0 || uid > 0xffffffffLL) continue;
    out.push_back({key, static_cast<uint32_t>(uid)});
  }
  return out;
}

std::optional<uint32_t> uid_from_peer_address(const char* pa) {
  if (!pa) return std::nullopt;
  // "<addr>:uid:gid:pid": take the third field from the end.
  std::string s(pa);
  size_t p3 = s.rfind(':');
  if (p3 == std::string::npos || p3 == 0) return std::nullopt;
  size_t p2 = s.rfind(':', p3 - 1);
  if (p2 == std::string::npos || p2 == 0) return std::nullopt;
  size_t p1 = s.rfind(':', p2 - 1);
  if (p1 == std::string::npos) return std::nullopt;
  std::string uid = s.substr(p1 + 1, p2 - p1 - 1);
  if (uid.empty() || uid.size() > 10) return std::nullopt;
  for (char c : uid)
    if (c < '0' || c > '9') return std::nullopt;
  unsigned long long v = std::stoull(uid);
  if (v > 0xffffffffULL) return std::nullopt;
  return static_cast<uint32_t>(v);
}

std::string user_name(uint32_t uid) {
  struct passwd pw, *res = nullptr;
  char buf[4096];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res) return res->pw_name;
  return "uid:" + std::to_string(uid);
}

}  // namespace ring::coord
