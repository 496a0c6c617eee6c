#include "common/cli/job_dir.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/files/users.h"

namespace ring::jobdir {

namespace fs = std::filesystem;

namespace {

std::string octal(mode_t m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// mkdir with exactly `mode` (the umask may remove bits); an existing entry is left to the checks.
void make_dir(const std::string& path, mode_t mode, const char* what) {
  if (::mkdir(path.c_str(), mode) == 0) {
    if (::chmod(path.c_str(), mode) != 0)
      throw JobDirError(std::string("cannot chmod ") + what + " " + path + ": " +
                        std::strerror(errno));
    return;
  }
  if (errno != EEXIST)
    throw JobDirError(std::string("cannot create ") + what + " " + path + ": " +
                      std::strerror(errno));
}

// A real directory (lstat: not a symlink) owned by us, without the `forbidden` mode bits.
void check_own_dir(const std::string& path, mode_t forbidden, const char* what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    throw JobDirError(std::string("cannot stat ") + what + " " + path + ": " +
                      std::strerror(errno));
  if (S_ISLNK(st.st_mode))
    throw JobDirError(std::string(what) + " " + path +
                      " is a symbolic link; refusing to use it (another user may have planted "
                      "it): remove it, or pass --job-dir DIR");
  if (!S_ISDIR(st.st_mode))
    throw JobDirError(std::string(what) + " " + path + " exists and is not a directory");
  if (st.st_uid != ::geteuid())
    throw JobDirError(std::string(what) + " " + path + " is owned by " + files::describe_user(st.st_uid) +
                      ", not by you (" + files::describe_user(::geteuid()) +
                      "); another user could change the job's spec, logs and checkpoints: "
                      "remove it, or pass --job-dir DIR");
  if (st.st_mode & forbidden)
    throw JobDirError(std::string(what) + " " + path + " has mode " + octal(st.st_mode) +
                      "; it must not be " +
                      (forbidden == 0022 ? "writable by group or others (chmod 0700 "
                                         : "accessible to group or others (chmod 0700 ") +
                      path + ")");
}

// Creates a file in `dir` and removes it: the job's processes will write there.
void prove_writable(const std::string& dir) {
  std::string probe = dir + "/.ringmaster-write-test-XXXXXX";
  int fd = ::mkstemp(probe.data());
  if (fd < 0)
    throw JobDirError("cannot create files in " + dir + ": " + std::strerror(errno) +
                      " (the job writes its logs, steps and spec copy there); pass --job-dir DIR "
                      "where you may write");
  ::close(fd);
  ::unlink(probe.c_str());
}

// logs/ (0700, ours, not a symlink) and a file created in both.
void finish(const std::string& dir) {
  prove_writable(dir);
  const std::string logs = dir + "/logs";
  make_dir(logs, 0700, "log directory");
  check_own_dir(logs, 0022, "log directory");
  prove_writable(logs);
}

bool under(const std::string& path, const std::string& prefix) {
  return path == prefix || path.rfind(prefix + "/", 0) == 0;
}

}  // namespace

std::string user_root(uid_t uid) {
  return "/tmp/ringmaster-" + std::to_string(uid);
}

std::string default_job_dir(const std::string& job_name, uid_t uid) {
  if (job_name.empty() || job_name == "." || job_name == ".." ||
      job_name.find('/') != std::string::npos || job_name.find('\0') != std::string::npos)
    throw JobDirError("job name '" + job_name + "' cannot name a directory");
  return user_root(uid) + "/jobs/" + job_name;
}

std::string prepare_default_job_dir(const std::string& job_name) {
  const uid_t uid = ::geteuid();
  const std::string dir = default_job_dir(job_name, uid);
  const std::string root = user_root(uid), jobs = root + "/jobs";
  make_dir(root, 0700, "directory");
  // 0711 is fine: ring-coord shares its socket from this directory in --socket-mode shared.
  check_own_dir(root, 0022, "directory");
  make_dir(jobs, 0700, "directory");
  check_own_dir(jobs, 0077, "directory");
  make_dir(dir, 0700, "job directory");
  check_own_dir(dir, 0077, "job directory");
  finish(dir);
  return dir;
}

std::string prepare_job_dir(const std::string& given) {
  if (given.empty()) throw JobDirError("the job directory is empty");
  std::string dir = fs::absolute(given).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec)
    throw JobDirError("cannot create job directory " + dir + ": " + parent.string() + ": " +
                      ec.message() + "; pass --job-dir DIR where you may write");
  make_dir(dir, 0700, "job directory");
  // Followed: a --job-dir may be a symlink the user made (/scratch/me -> /lustre/...).
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw JobDirError("cannot stat job directory " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw JobDirError("job directory " + dir + " exists and is not a directory");
  if (st.st_uid != ::geteuid())
    throw JobDirError("job directory " + dir + " is owned by " + files::describe_user(st.st_uid) + ", not by you (" +
                      files::describe_user(::geteuid()) +
                      "); another user could change the job's spec, logs and checkpoints: "
                      "choose a directory of your own");
  if (st.st_mode & 0002)
    throw JobDirError("job directory " + dir + " is writable by every user (mode " +
                      octal(st.st_mode) + "); choose a directory of your own inside it, e.g. " +
                      (dir == "/" ? "" : dir) + "/<job name>");
  finish(dir);
  return dir;
}

std::string node_local_reason(const std::string& given) {
  std::string dir = fs::absolute(given).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::vector<std::string> forms{dir};
  std::error_code ec;
  std::string real = fs::weakly_canonical(dir, ec).string();
  if (!ec && real != dir) forms.push_back(real);
  for (const auto& f : forms)
    for (const char* p : {"/tmp", "/var/tmp", "/dev/shm", "/run"})
      if (under(f, p)) return std::string("under ") + p + (f == dir ? "" : " (" + f + ")");
  // The nearest part of the path that exists tells the file system.
  fs::path probe = dir;
  while (!probe.empty() && probe != probe.root_path() && !fs::exists(probe, ec))
    probe = probe.parent_path();
  struct statfs sf {};
  if (!probe.empty() && ::statfs(probe.c_str(), &sf) == 0) {
    if (static_cast<unsigned long>(sf.f_type) == TMPFS_MAGIC)
      return "on a tmpfs (memory of this node)";
    if (static_cast<unsigned long>(sf.f_type) == RAMFS_MAGIC)
      return "on a ramfs (memory of this node)";
  }
  return "";
}

}  // namespace ring::jobdir
