#include "tests/common/test_json.h"

#include <sstream>

namespace ring::test {

std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::stringstream ss(slurp(path));
  for (std::string l; std::getline(ss, l);) {
    nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

}  // namespace ring::test
