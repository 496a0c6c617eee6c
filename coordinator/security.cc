#include "coordinator/security.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/files/atomic_write.h"

namespace ring::coord {

namespace {

std::string octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

void write_file_mode(const std::string& path, const std::string& text, mode_t mode) {
  try {
    files::write_file_atomic(path, text, mode);
  } catch (const files::AtomicWriteError& e) {
    throw SecurityError(e.what());
  }
}

}  // namespace

std::string default_socket_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  struct stat st;
  if (xdg && *xdg && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid())
    return std::string(xdg) + "/ringmaster";
  return "/tmp/ringmaster-" + std::to_string(::geteuid());
}

std::string default_state_dir() {
  if (const char* s = std::getenv("RING_STATE_DIR"); s && *s) return s;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/ringmaster";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.local/state/ringmaster";
  return "/var/lib/ringmaster";
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

namespace {
// The checks ssh makes of ~/.ssh and its keys: the path itself is not a symbolic link, is of the
// expected type, is ours, and has none of the `forbidden` mode bits. `what` and `rule` name it
// and the rule in the message ("state directory ...: must be 0700 (chmod 0700 ...)").
void check_owned(const std::string& path, bool dir, mode_t forbidden, const std::string& what,
                 const std::string& fix_mode) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0)
    throw SecurityError("cannot stat " + what + " " + path + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode))
    throw SecurityError(what + " " + path + " is a symbolic link; refusing to use it (it must be " +
                        (dir ? "a real directory" : "a regular file") + ")");
  if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    throw SecurityError(what + " " + path + " is not a " + (dir ? "directory" : "regular file"));
  if (st.st_uid != ::geteuid())
    throw SecurityError(what + " " + path + " is owned by uid " + std::to_string(st.st_uid) +
                        ", not by us (uid " + std::to_string(::geteuid()) +
                        "); it must be ours (chown it, or choose another --state-dir)");
  if (st.st_mode & forbidden)
    throw SecurityError(what + " " + path + " has mode " + octal(st.st_mode) + "; it must " +
                        ((forbidden & 0044) ? "not be accessible to group or others"
                                            : "not be writable by group or others") +
                        " (chmod " + fix_mode + " " + path + ")");
}
}  // namespace

void check_secret_file(const std::string& path) {
  check_owned(path, false, 0077, "secret file", "0600");
}

void prepare_state_dir(const std::string& dir) {
  if (dir.empty()) throw SecurityError("no state directory given");
  if (::mkdir(dir.c_str(), 0700) == 0) {
    if (::chmod(dir.c_str(), 0700) != 0)
      throw SecurityError("cannot chmod state directory " + dir + ": " + std::strerror(errno));
  } else if (errno != EEXIST) {
    throw SecurityError("cannot create state directory " + dir + ": " + std::strerror(errno));
  }
  check_owned(dir, true, 0077, "state directory", "0700");
}

int open_private_file(const std::string& path, const std::string& what) {
  // O_NOFOLLOW: a symbolic link planted in our place is refused, never followed.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP)
      throw SecurityError(what + " " + path + " is a symbolic link; refusing to use it");
    throw SecurityError("cannot open " + what + " " + path + ": " + std::strerror(e));
  }
  try {
    check_owned(path, false, 0077, what, "0600");
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

void check_private_file_if_present(const std::string& path, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return;
  check_owned(path, false, 0077, what, "0600");
}

void check_clients_file(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return;
  // Whoever can write it can add a key with any uid, root's included.
  check_owned(path, false, 0022, "CURVE clients file", "0600");
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
  check_owned(dir, true, 0077, "key directory", "0700");
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
  check_clients_file(path);
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

std::string escape_for_log(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[5];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

}  // namespace ring::coord
