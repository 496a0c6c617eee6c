// Replays every spec we have (examples, invalid configs, the fuzz corpus with any past crash
// reproducers) through the parser in the normal build, so a fixed fuzz finding stays fixed.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/plan/plan.h"
#include "common/spec/parse.h"
#include "tests/common/run.h"

namespace {

namespace fs = std::filesystem;

TEST(FuzzReplay, CorpusAndConfigsNeverCrash) {
  int n = 0;
  for (const char* dir : {"configs", "tests/fuzz/corpus"}) {
    for (const auto& e : fs::recursive_directory_iterator(ring::test::source_path(dir))) {
      if (!e.is_regular_file()) continue;
      std::string text = ring::test::read_file(e.path().string());
      ring::spec::LoadResult r;
      ASSERT_NO_THROW(r = ring::spec::load_spec_string(text, e.path().filename().string()))
          << e.path();
      EXPECT_TRUE(r.ok() || r.error_count() > 0) << e.path();
      if (r.ok()) (void)ring::plan::to_text(ring::plan::make_plan(*r.spec), *r.spec);
      ++n;
    }
  }
  EXPECT_GT(n, 40);
}

}  // namespace
