#include "plugins/transport/common/rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "common/proc/read_file.h"

namespace ring::transport {
namespace {

constexpr const char* kMagic = "ringmaster-rendezvous-v1";

// read(2), never a throw: a /proc file of a process reaped mid-read reads as "".
using ring::proc::read_file;

// A one-line file without its trailing newline.
std::string read_small_file(const std::string& path) {
  std::string s = read_file(path);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// State letter and start time of a process from /proc/<pid>/stat; false when it does not exist.
bool proc_stat(long pid, char* state, uint64_t* start_time) {
  std::string s = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  // The command name (field 2) is in parentheses and may contain spaces: parse after the last ')'.
  size_t close = s.rfind(')');
  if (s.empty() || close == std::string::npos) return false;
  std::istringstream in(s.substr(close + 1));
  std::string field;
  in >> *state;
  // Fields 4..21 skipped; starttime is field 22, i.e. the 20th token after the state.
  for (int i = 4; i <= 21 && in >> field; ++i) {
  }
  in >> *start_time;
  return !in.fail();
}

std::string escape_host(std::string h) {
  for (char& c : h)
    if (c == ' ' || c == '\n') c = '_';
  return h;
}

}  // namespace

PeerIdentity self_identity(int rank, int world_size) {
  PeerIdentity id;
  id.rank = rank;
  id.world_size = world_size;
  id.pid = static_cast<long>(getpid());
  char state = 0;
  proc_stat(id.pid, &state, &id.start_time);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  id.host = escape_host(host[0] ? host : "unknown");
  id.boot_id = read_small_file("/proc/sys/kernel/random/boot_id");
  if (id.boot_id.empty()) id.boot_id = "none";
  char ns[128] = {};
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  id.pid_ns = n > 0 ? escape_host(std::string(ns, static_cast<size_t>(n))) : "none";
  return id;
}

bool same_pid_space(const PeerIdentity& self, const PeerIdentity& peer) {
  return self.boot_id != "none" && self.pid_ns != "none" && self.host == peer.host &&
         self.boot_id == peer.boot_id && self.pid_ns == peer.pid_ns;
}

bool local_peer_alive(const PeerIdentity& self, const PeerIdentity& peer) {
  if (!same_pid_space(self, peer) || peer.pid <= 0) return true;
  char state = 0;
  uint64_t start = 0;
  if (!proc_stat(peer.pid, &state, &start)) return false;
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return start == peer.start_time;
}

Result Rendezvous::open(const char* spec, int rank, int world_size) {
  if (spec == nullptr || spec[0] == '\0')
    return error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                 "rendezvous is empty: give a directory path or file:<path>");
  std::string s(spec);
  if (s.rfind("file:", 0) == 0) {
    s = s.substr(5);
  } else if (s.find("://") != std::string::npos) {
    return error(RING_TRANSPORT_ERR_UNSUPPORTED,
                 "rendezvous '" + s + "': only a directory (path or file:<path>) is supported");
  }
  std::error_code ec;
  std::filesystem::create_directories(s, ec);
  if (!std::filesystem::is_directory(s))
    return error(RING_TRANSPORT_ERR_INTERNAL,
                 "rendezvous directory '" + s + "' cannot be created: " + ec.message());
  dir_ = s;
  rank_ = rank;
  world_size_ = world_size;
  self_ = self_identity(rank, world_size);
  return ok_result();
}

Result Rendezvous::publish(const std::string& kind, const std::string& payload) {
  std::string final_path = dir_ + "/" + kind + "-" + std::to_string(rank_);
  std::string tmp_path = final_path + ".tmp." + std::to_string(self_.pid);
  std::ostringstream header;
  header << kMagic << ' ' << self_.rank << ' ' << self_.world_size << ' ' << self_.pid << ' '
         << self_.start_time << ' ' << self_.host << ' ' << self_.boot_id << ' ' << self_.pid_ns
         << ' ' << payload.size() << '\n';
  std::string data = header.str() + payload;
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return error(RING_TRANSPORT_ERR_INTERNAL, "cannot write " + tmp_path + ": " + strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp_path.c_str());
      return error(RING_TRANSPORT_ERR_INTERNAL, "cannot write " + tmp_path + ": " + strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  // fsync so a reader on another host of a shared file system never sees a renamed but empty file.
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp_path.c_str());
    return error(RING_TRANSPORT_ERR_INTERNAL, "cannot rename to " + final_path + ": " + strerror(e));
  }
  return ok_result();
}

Result Rendezvous::read_record(const std::string& path, PeerIdentity* id,
                               std::string* payload) const {
  const std::string all = read_file(path);
  size_t nl = all.find('\n');
  std::istringstream h(nl == std::string::npos ? std::string() : all.substr(0, nl));
  std::string magic;
  size_t len = 0;
  h >> magic >> id->rank >> id->world_size >> id->pid >> id->start_time >> id->host >>
      id->boot_id >> id->pid_ns >> len;
  if (h.fail() || magic != kMagic || all.size() - nl - 1 != len)
    return error(RING_TRANSPORT_ERR_INTERNAL, "rendezvous record " + path + " is malformed");
  *payload = all.substr(nl + 1);
  return ok_result();
}

Result Rendezvous::gather(const std::string& kind, const std::vector<int>& ranks,
                          Clock::time_point deadline, std::vector<PeerIdentity>* identities,
                          std::vector<std::string>* payloads) {
  std::vector<int> want = ranks;
  if (want.empty())
    for (int r = 0; r < world_size_; ++r) want.push_back(r);
  identities->assign(world_size_, PeerIdentity{});
  payloads->assign(world_size_, std::string());
  std::vector<bool> have(world_size_, false);
  auto sleep = std::chrono::microseconds(500);
  for (;;) {
    std::vector<int> missing;
    for (int r : want) {
      if (have[r]) continue;
      std::string path = dir_ + "/" + kind + "-" + std::to_string(r);
      if (::access(path.c_str(), R_OK) != 0) {
        missing.push_back(r);
        continue;
      }
      PeerIdentity id;
      std::string payload;
      Result res = read_record(path, &id, &payload);
      if (!res.ok()) return res;
      if (id.rank != r || id.world_size != world_size_)
        return error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "rendezvous " + path + " was written by rank " + std::to_string(id.rank) +
                         " of world size " + std::to_string(id.world_size) + ", this rank has " +
                         std::to_string(world_size_) + " (stale directory from another job?)");
      (*identities)[r] = id;
      (*payloads)[r] = std::move(payload);
      have[r] = true;
    }
    if (missing.empty()) return ok_result();
    if (Clock::now() >= deadline) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 16; ++i)
        list += (i ? "," : "") + std::to_string(missing[i]);
      if (missing.size() > 16) list += ",...";
      return error(RING_TRANSPORT_ERR_TIMEOUT,
                   "rendezvous in " + dir_ + ": rank " + std::to_string(rank_) + " timed out " +
                       "waiting for '" + kind + "' from " + std::to_string(missing.size()) +
                       " rank(s): " + list);
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(50000));
  }
}

}  // namespace ring::transport
