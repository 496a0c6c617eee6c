#include "common/files/users.h"

#include <pwd.h>

#include <vector>

namespace ring::files {

std::string user_name(uid_t uid) {
  struct passwd pw {};
  struct passwd* out = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &out) == 0 && out) return out->pw_name;
  return "uid " + std::to_string(uid);
}

std::string describe_user(uid_t uid) {
  const std::string name = user_name(uid);
  const std::string id = "uid " + std::to_string(uid);
  return name == id ? id : name + " (" + id + ")";
}

}  // namespace ring::files
