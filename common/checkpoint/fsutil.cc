#include "common/checkpoint/fsutil.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/files/atomic_write.h"
#include "common/files/read_file.h"
#include "common/checkpoint/checkpoint.h"

namespace ring::ckpt::fs {

std::string errno_text(int err) { return std::strerror(err); }

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.rfind('/');
  return pos == std::string::npos ? p : p.substr(pos + 1);
}

std::string dirname(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.rfind('/');
  if (pos == std::string::npos) return ".";
  return pos == 0 ? "/" : p.substr(0, pos);
}

void mkdirs(const std::string& dir) {
  // Each missing component is made 0700: checkpoints hold the job's weights (private per user).
  std::string p;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    p = dir.substr(0, i);
    if (p.empty() || is_dir(p)) continue;
    if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST)
      throw CheckpointError(p + ": cannot create the directory: " + errno_text(errno));
  }
  if (!is_dir(dir)) throw CheckpointError(dir + ": exists and is not a directory");
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(dir + ": cannot open the directory to fsync: " +
                                    errno_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError(dir + ": fsync of the directory failed: " + errno_text(err));
}

void pwrite_all(int fd, const void* p, size_t n, uint64_t off, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, c, n > (1u << 30) ? (1u << 30) : n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(path + ": write of " + std::to_string(n) + " bytes at offset " +
                            std::to_string(off) + " failed: " + errno_text(errno));
    }
    if (w == 0) throw CheckpointError(path + ": write returned 0 at offset " + std::to_string(off));
    c += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

void pread_all(int fd, void* p, size_t n, uint64_t off, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, c, n > (1u << 30) ? (1u << 30) : n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(path + ": read at offset " + std::to_string(off) +
                            " failed: " + errno_text(errno));
    }
    if (r == 0)
      throw CheckpointError(path + ": truncated: ends before offset " + std::to_string(off + n));
    c += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
}

void write_atomic(const std::string& dir, const std::string& name, const std::string& text,
                  bool do_fsync) {
  try {
    files::write_file_atomic(join(dir, name), text, 0600, do_fsync);
  } catch (const files::AtomicWriteError& e) {
    throw CheckpointError(e.what());
  }
}

std::string read_file(const std::string& path, size_t max_bytes) {
  try {
    return files::read_regular_file(path, max_bytes);
  } catch (const files::ReadError& e) {
    throw CheckpointError(e.what());
  }
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

uint64_t file_size(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) throw CheckpointError(path + ": missing");
    throw CheckpointError(path + ": cannot stat: " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) throw CheckpointError(path + ": not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

std::vector<std::string> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw CheckpointError(dir + ": cannot list the directory: " + errno_text(errno));
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace ring::ckpt::fs
