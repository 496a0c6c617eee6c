// Users named in messages about files: "bob (uid 1001)", or "uid 1001" when the name is unknown.
#pragma once

#include <sys/types.h>

#include <string>

namespace ring::files {

std::string describe_user(uid_t uid);  // "bob (uid 1001)"
std::string user_name(uid_t uid);      // "bob", or "uid 1001"

}  // namespace ring::files
