// Whatever the bytes, load_spec_string must return diagnostics: never crash, hang, throw or
// read out of bounds. Valid inputs are also planned, so the planner sees parser output too.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "common/plan/plan.h"
#include "common/spec/parse.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {

void fail(const char* target, const std::string& what) {
  std::fprintf(stderr, "fuzz target %s: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

void spec_input(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = spec::load_spec_string(text, "fuzz.yaml");
  for (const auto& d : r.diagnostics) (void)d.str();
  if (!r.ok() && r.error_count() == 0) fail("spec", "refused without an error diagnostic");
  if (r.ok()) {
    auto p = plan::make_plan(*r.spec);
    (void)plan::to_text(p, *r.spec);
    (void)plan::to_json(p, *r.spec).dump();
  }
}

}  // namespace ring::fuzz
