#include "common/install/locate.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace fs = std::filesystem;

namespace ring::install {
namespace {

bool is_executable(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

void note(std::vector<std::string>* tried, const std::string& what) {
  if (tried) tried->push_back(what);
}

}  // namespace

fs::path self_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path();
}

fs::path build_root() {
  fs::path dir = self_dir();
  for (int up = 0; up < 5 && !dir.empty(); ++up) {
    std::error_code ec;
    if (fs::is_regular_file(dir / RING_BUILD_TREE_MARKER, ec)) return dir;
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return {};
}

std::vector<std::string> plugin_dirs(const std::string& build_subdir) {
  std::vector<std::string> dirs;
  auto add = [&dirs](const fs::path& d) {
    if (d.empty() || !is_dir(d)) return;
    std::string s = d.lexically_normal().string();
    for (const auto& have : dirs)
      if (have == s) return;
    dirs.push_back(s);
  };
  if (fs::path here = self_dir(); !here.empty()) add(here / RING_INSTALL_BIN_TO_PLUGINS);
  add(RING_INSTALL_PLUGIN_DIR);
  if (fs::path root = build_root(); !root.empty()) add(root / build_subdir);
  return dirs;
}

std::string find_program(const std::string& name, const std::vector<std::string>& env_names,
                         const std::string& build_subdir, std::vector<std::string>* tried) {
  for (size_t i = 0; i < env_names.size(); ++i) {
    const char* e = std::getenv(env_names[i].c_str());
    if (!e || !*e) continue;
    if (i > 0)
      std::cerr << program_invocation_short_name << ": warning: $" << env_names[i]
                << " is deprecated; use $" << env_names[0] << "\n";
    note(tried, "$" + env_names[i] + "=" + e);
    return fs::absolute(e).lexically_normal().string();
  }
  std::vector<fs::path> cands;
  if (fs::path here = self_dir(); !here.empty()) cands.push_back(here / name);
  cands.push_back(fs::path(RING_INSTALL_BINDIR) / name);
  if (fs::path root = build_root(); !root.empty()) cands.push_back(root / build_subdir / name);
  for (const fs::path& c : cands) {
    note(tried, c.string());
    if (is_executable(c)) return fs::weakly_canonical(c).string();
  }
  std::stringstream path(std::getenv("PATH") ? std::getenv("PATH") : "");
  std::string d;
  while (std::getline(path, d, ':')) {
    if (d.empty()) continue;
    note(tried, (fs::path(d) / name).string());
    if (is_executable(fs::path(d) / name)) return fs::absolute(fs::path(d) / name).string();
  }
  return {};
}

}  // namespace ring::install
