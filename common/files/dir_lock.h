// One job per directory: an exclusive lock on DIR/.ringmaster.lock, held for the life of the
// job, that names its holder.
//
//   auto lock = ring::files::DirLock::acquire(job_dir, {{"job", 12}, {"run", "r1a2b3c4d"}});
//   // ... the job runs; the lock goes with the object (or the process)
//
// An open-file-description lock (fcntl F_OFD_SETLK): released by the kernel when the process
// dies however it dies (no stale lock after kill -9), and, on NFS (v4, or v3 with lockd) and on
// Lustre mounted with flock, seen by every node of the shared file system. The lock file holds
// the holder's record (JSON: host, pid, user, since, and what the caller adds), rewritten by the
// holder, so a refused caller can name who has the directory. The file is created 0600, opened
// O_NOFOLLOW (never through a planted link) and must be ours.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace ring::files {

// Another process holds the directory. what(): "<dir> is in use by <holder>"; holder(): the
// holder's record (may be empty when it could not be read).
class DirBusy : public std::runtime_error {
 public:
  DirBusy(const std::string& what, nlohmann::json holder)
      : std::runtime_error(what), holder_(std::move(holder)) {}
  const nlohmann::json& holder() const { return holder_; }

 private:
  nlohmann::json holder_;
};

// The lock file cannot be made or used (not ours, a link, I/O error); names the path and rule.
class DirLockError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DirLock {
 public:
  static constexpr const char* kFileName = ".ringmaster.lock";

  // Takes the lock or throws DirBusy (held by another open file description, in this process
  // or another) or DirLockError. `record` is merged into the holder record.
  static DirLock acquire(const std::string& dir, const nlohmann::json& record = {});
  // Whether someone holds `dir`'s lock now: their record, or nullopt (free, or no lock file).
  // Never creates the file.
  static std::optional<nlohmann::json> holder(const std::string& dir);
  // "job 12 (run r1a2b3c4d), ringd pid 345 on host a, user bob, since 2026-12-07 05:01:02 UTC".
  static std::string describe(const nlohmann::json& record);

  DirLock(DirLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

  const std::string& path() const { return path_; }

 private:
  DirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace ring::files
