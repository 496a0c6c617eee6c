// Running the build's programs as another Unix user (nobody, uid 65534) in tests.
//
// The checkout may live where that user cannot go (a 0700 home directory, as is common), so the
// binaries are copied into a fresh directory under /tmp that it can reach (0755), and removed
// with it. ringctl needs no library of the build tree (ldd: system libraries only).
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ring::test {

inline constexpr uid_t kNobody = 65534;

class OtherUserBin {
 public:
  // Copies each of `binaries` (paths in the build tree) into the directory.
  explicit OtherUserBin(const std::vector<std::string>& binaries) {
    std::string t = "/tmp/ring-bin-XXXXXX";
    if (!mkdtemp(t.data())) {
      ADD_FAILURE() << "mkdtemp " << t;
      return;
    }
    dir_ = t;
    ::chmod(dir_.c_str(), 0755);
    for (const auto& b : binaries) {
      std::filesystem::path to = std::filesystem::path(dir_) / std::filesystem::path(b).filename();
      std::error_code ec;
      std::filesystem::copy_file(b, to, ec);
      EXPECT_FALSE(ec) << "copy " << b << ": " << ec.message();
      ::chmod(to.c_str(), 0755);
    }
  }
  ~OtherUserBin() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  OtherUserBin(const OtherUserBin&) = delete;
  OtherUserBin& operator=(const OtherUserBin&) = delete;

  // The copy of `name` ("ringctl").
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// `cmd` as nobody, without supplementary groups (a shell command line).
inline std::string as_nobody(const std::string& cmd) {
  return "setpriv --reuid=65534 --regid=65534 --clear-groups " + cmd;
}

}  // namespace ring::test
