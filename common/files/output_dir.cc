#include "common/files/output_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/files/users.h"

namespace ring::files {

namespace {

std::string octal(mode_t m) {
  char b[16];
  std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(m & 07777));
  return b;
}

}  // namespace

std::string prepare_output_dir(const std::string& given, const std::string& what) {
  namespace fs = std::filesystem;
  if (given.empty()) throw OutputDirError(what + ": the directory is empty");
  std::string dir = fs::absolute(given).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const uid_t me = ::geteuid();
  struct stat ls {};
  if (::lstat(dir.c_str(), &ls) != 0) {
    if (errno != ENOENT)
      throw OutputDirError(what + " " + dir + ": " + std::strerror(errno));
    std::error_code ec;
    fs::create_directories(fs::path(dir).parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      throw OutputDirError(what + " " + dir + ": cannot create: " + std::strerror(errno));
    if (::lstat(dir.c_str(), &ls) != 0)
      throw OutputDirError(what + " " + dir + ": " + std::strerror(errno));
  }
  if (S_ISLNK(ls.st_mode) && ls.st_uid != me)
    throw OutputDirError(what + " " + dir + " is a symbolic link of " + describe_user(ls.st_uid) +
                         ", not yours: refusing to write where another user points");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw OutputDirError(what + " " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw OutputDirError(what + " " + dir + " is not a directory");
  if (st.st_uid != me)
    throw OutputDirError(what + " " + dir + " is owned by " + describe_user(st.st_uid) +
                         ", not by you (" + describe_user(me) +
                         "): its owner could change or replace what is written there; choose a "
                         "directory of your own");
  if (st.st_mode & 0022)
    throw OutputDirError(what + " " + dir + " has mode " + octal(st.st_mode) +
                         ": group or others may write there and could swap files in after the "
                         "write; chmod go-w " + dir + ", or choose another directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw OutputDirError(what + " " + dir + ": cannot write there: " + std::strerror(errno));
  return dir;
}

}  // namespace ring::files
