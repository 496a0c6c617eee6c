// ringctl's commands on a spec alone, run as a user would: `init` (every template validates),
// `--set` on validate and plan, `validate --json`, `plan` exit codes and parameter counts, and
// the exit-code table of `ringctl --help` and docs/operator-guide.md.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/exit_codes.h"
#include "cli/templates.h"
#include "tests/common/run.h"

namespace {

using nlohmann::json;
using ring::test::run;
using ring::test::source_path;

const std::string kRingctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/ring-ctl-spec-XXXXXX";
    EXPECT_NE(mkdtemp(t.data()), nullptr);
    path = t;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

TEST(RingctlInit, EveryTemplateValidates) {
  TempDir t;
  std::vector<std::string> names;
  for (const auto& tpl : ring::cli::spec_templates()) names.push_back(tpl.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"tiny", "passkey", "slurm", "llama7b-1m", "generate"}));
  for (const auto& name : names) {
    std::string file = t.path + "/" + name + ".yaml";
    auto r = run(kRingctl + " init --template " + name + " -o " + file);
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "wrote " + file)) << r.output;
    std::string text = ring::test::read_file(file);
    EXPECT_EQ(text.rfind("# A starting spec from `ringctl init --template " + name + "`", 0), 0u)
        << text;
    // The same bytes on standard output (the default, and -o -).
    EXPECT_EQ(run(kRingctl + " init --template " + name + " 2>/dev/null").output, text);
    EXPECT_EQ(run(kRingctl + " init -t " + name + " -o - 2>/dev/null").output, text);
    r = run(kRingctl + " validate " + file);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
  }
  // The default template is tiny.
  EXPECT_TRUE(contains(run(kRingctl + " init").output, "--template tiny`"));
}

TEST(RingctlInit, RefusesToOverwriteAndNamesUnknownTemplates) {
  TempDir t;
  std::string file = t.path + "/spec.yaml";
  ASSERT_EQ(run(kRingctl + " init -o " + file).exit_code, 0);
  ring::test::run("echo 'mine' > " + file);
  auto r = run(kRingctl + " init --template passkey -o " + file);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, file + " exists; choose another -o FILE, or --force")) << r.output;
  EXPECT_EQ(ring::test::read_file(file), "mine\n");
  r = run(kRingctl + " init --template passkey --force -o " + file);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(ring::test::read_file(file), "name: passkey"));
  // --force never writes through a link or onto a directory.
  std::filesystem::create_symlink(file, t.path + "/link.yaml");
  r = run(kRingctl + " init --force -o " + t.path + "/link.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is not a regular file")) << r.output;
  r = run(kRingctl + " init --force -o " + t.path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  r = run(kRingctl + " init -o " + t.path + "/no/such/dir/spec.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot write " + t.path + "/no/such/dir/spec.yaml"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "No such file or directory")) << r.output;
  // An unknown template: named, with the closest one and the list (usage, exit 2).
  r = run(kRingctl + " init --template passky");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown template 'passky'; did you mean 'passkey'?")) << r.output;
  EXPECT_TRUE(contains(r.output, "templates: tiny, passkey, slurm, llama7b-1m, generate"))
      << r.output;
}

// --set on validate and plan: applied before the checks, judged by the key table, named.
TEST(RingctlSet, ValidateAndPlanApplyOverrides) {
  const std::string tiny = source_path("configs/examples/tiny.yaml");
  auto r = run(kRingctl + " validate " + tiny + " --set model.layers=2 --set data.seq_len=8192");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "ok (tiny: 2 layers, d_model 256, seq_len 8192")) << r.output;
  // A positional after --set is still a file (one value per --set).
  r = run(kRingctl + " validate --set train.steps=30 " + tiny + " " + tiny);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "2 valid, 0 invalid")) << r.output;
  r = run(kRingctl + " validate " + tiny + " --set model.layrs=2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "error: model.layrs: unknown key; did you mean 'model.layers'? "
                       "(--set model.layrs=2)"))
      << r.output;
  r = run(kRingctl + " validate " + tiny + " --set model.recompute=sometimes");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "model.recompute: value 'sometimes' is not a boolean"))
      << r.output;
  // The flag's own form is a usage error.
  r = run(kRingctl + " validate " + tiny + " --set model.layers");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "expected SECTION.KEY=VALUE")) << r.output;
  // plan sizes the overridden spec.
  auto a = json::parse(run(kRingctl + " plan --json " + tiny + " 2>/dev/null").output);
  auto b = json::parse(
      run(kRingctl + " plan --json " + tiny + " --set model.layers=8 2>/dev/null").output);
  EXPECT_EQ(
      b["model"]["params"].get<int64_t>() - b["model"]["params_embedding"].get<int64_t>(),
      2 * (a["model"]["params"].get<int64_t>() - a["model"]["params_embedding"].get<int64_t>()) -
          256);  // twice the blocks; the final norm (d_model) once
}

TEST(RingctlValidate, JsonResult) {
  TempDir t;
  const std::string tiny = source_path("configs/examples/tiny.yaml");
  const std::string bad = source_path("configs/invalid/bad-enum.yaml");
  auto r = run(kRingctl + " validate --json " + tiny + " " + bad + " --set train.steps=30");
  EXPECT_EQ(r.exit_code, 1);
  auto j = json::parse(r.output);  // stdout and stderr: all of it is the JSON
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["valid"], 1);
  EXPECT_EQ(j["invalid"], 1);
  EXPECT_EQ(j["overrides"], json::array({"train.steps=30"}));
  ASSERT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["files"][0]["file"], tiny);
  EXPECT_EQ(j["files"][0]["ok"], true);
  EXPECT_EQ(j["files"][0]["errors"], json::array());
  EXPECT_EQ(j["files"][0]["job"]["name"], "tiny");
  EXPECT_EQ(j["files"][0]["job"]["workers"], 4);
  const auto& e = j["files"][1]["errors"];
  ASSERT_GE(e.size(), 1u) << r.output;
  EXPECT_EQ(e[0]["file"], bad);
  EXPECT_TRUE(e[0]["line"].is_number()) << e[0];
  EXPECT_TRUE(e[0]["column"].is_number()) << e[0];
  EXPECT_FALSE(e[0]["key"].get<std::string>().empty()) << e[0];
  EXPECT_TRUE(contains(e[0]["rule"], "is not one of")) << e[0];
  // --json may come before the command, as the coordinator commands' options may.
  r = run(kRingctl + " --json validate " + tiny);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output)["ok"], true);
  // Warnings are listed apart (a design beyond this build's limits under --what-if).
  r = run(kRingctl + " validate --json --what-if --set model.head_dim=256 " +
          source_path("configs/examples/llama7b-1m-64x8-h100.yaml"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  j = json::parse(r.output);
  EXPECT_EQ(j["ok"], true);
  ASSERT_GE(j["files"][0]["warnings"].size(), 1u);
  bool limit = false, data = false;
  for (const auto& w : j["files"][0]["warnings"]) {
    limit = limit || contains(w["rule"], "not supported by this build");
    // Its data.paths are the cluster's (/datasets/...): said, not refused.
    data = data || contains(w["rule"], "does not exist; every node must have it");
  }
  EXPECT_TRUE(limit) << j.dump();
  EXPECT_TRUE(data) << j.dump();
}

// One meaning per exit code: --help prints the table, the operator guide has the same rows, and
// plan of a job that does not fit is not `run`'s "cancelled".
TEST(RingctlExitCodes, OneTableInHelpAndDocs) {
  auto help = run(kRingctl + " --help");
  EXPECT_EQ(help.exit_code, 0);
  std::set<int> codes;
  std::string guide = ring::test::read_file(source_path("docs/operator-guide.md"));
  for (const auto& e : ring::cli::exit_code_table()) {
    EXPECT_TRUE(codes.insert(e.code).second) << "code " << e.code << " twice";
    EXPECT_TRUE(std::regex_search(help.output, std::regex("\n +" + std::to_string(e.code) + "  ")))
        << e.code << help.output;
    EXPECT_TRUE(contains(guide, "| " + std::to_string(e.code) + " | ")) << "docs: " << e.code;
  }
  EXPECT_TRUE(codes.count(ring::cli::kExitNoFit) && codes.count(ring::cli::kExitCancelled));
  EXPECT_NE(ring::cli::kExitNoFit, ring::cli::kExitCancelled);
  // The 270B design fits only fully sharded: without sharding it does not.
  auto big = run(kRingctl + " plan --what-if --check --set parallel.shard=none " +
                 source_path("configs/examples/270b-1.2m-64x8-h200.yaml"));
  EXPECT_EQ(big.exit_code, ring::cli::kExitNoFit) << big.output;
  EXPECT_EQ(run(kRingctl + " plan --check " + source_path("configs/examples/tiny.yaml")).exit_code,
            0);
}

// ringd's codes and signals map onto ringctl's table: nothing leaks as 128+N.
TEST(RingctlExitCodes, RingdStatusesMap) {
  using namespace ring::cli;
  auto exited = [](int code) { return code << 8; };  // a wait status of exit(code)
  EXPECT_EQ(from_ringd_status(exited(0)), kExitOk);
  EXPECT_EQ(from_ringd_status(exited(1)), kExitFailed);
  EXPECT_EQ(from_ringd_status(exited(2)), kExitFailed);
  EXPECT_EQ(from_ringd_status(exited(3)), kExitCancelled);
  EXPECT_EQ(from_ringd_status(exited(75)), kExitStopped);
  EXPECT_EQ(from_ringd_status(exited(127)), kExitFailed);
  EXPECT_EQ(from_ringd_status(9), kExitKilled);  // killed by SIGKILL
  EXPECT_TRUE(contains(describe_ringd_status(9), "killed by signal 9"));
  EXPECT_EQ(describe_ringd_status(exited(3)), "cancelled (ringctl cancel)");
}

}  // namespace
