// libFuzzer harness for the job spec parser and validator.
//
// Build and run: scripts/fuzz.sh [--seconds N]   (clang, -fsanitize=fuzzer,address,undefined)
// Whatever the bytes, load_spec_string must return diagnostics: never crash, hang, throw or
// read out of bounds. Valid inputs are also planned, so the planner sees parser output too.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/plan/plan.h"
#include "common/spec/parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = ring::spec::load_spec_string(text, "fuzz.yaml");
  for (const auto& d : r.diagnostics) (void)d.str();
  if (r.ok()) {
    auto p = ring::plan::make_plan(*r.spec);
    (void)ring::plan::to_text(p, *r.spec);
    (void)ring::plan::to_json(p, *r.spec).dump();
  }
  return 0;
}
