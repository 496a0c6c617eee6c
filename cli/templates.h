// The starting specs of `ringctl init --template NAME`: configs/examples/ files compiled into
// ringctl (cli/CMakeLists.txt generates templates.cc from them), so an installed ringctl has them
// and every template is an example that the test suite validates.
#pragma once

#include <string>
#include <vector>

namespace ring::cli {

struct SpecTemplate {
  std::string name;         // "tiny"
  std::string source;       // "configs/examples/tiny.yaml"
  std::string description;  // one line for --help
  std::string text;         // the file
};

// In the order `ringctl init --help` lists them; the first is the default.
const std::vector<SpecTemplate>& spec_templates();

}  // namespace ring::cli
