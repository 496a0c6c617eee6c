// The job spec: key table, parser, diagnostics, robustness, generated reference.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <random>
#include <set>
#include <string>

#include <fmt/format.h>

#include "common/contract/layout.h"
#include "common/plan/plan.h"
#include "common/spec/keys.h"
#include "common/spec/parse.h"
#include "tests/common/run.h"

namespace ring::spec {
namespace {

namespace fs = std::filesystem;
using test::read_file;
using test::source_path;

const char* kMinimal = R"(job:
  name: t
model:
  layers: 2
  d_model: 64
  heads: 4
data:
  source: passkey
  seq_len: 1024
train:
  steps: 10
)";

std::vector<std::string> errors_of(const LoadResult& r) {
  std::vector<std::string> e;
  for (const auto& d : r.diagnostics)
    if (d.severity == Diagnostic::Severity::kError) e.push_back(d.str());
  return e;
}

TEST(SpecKeys, TableIsWellFormed) {
  std::set<std::string> paths;
  std::set<std::string> sections;
  for (const auto& [name, _] : spec_sections()) sections.insert(name);
  for (const auto& k : spec_keys()) {
    EXPECT_TRUE(paths.insert(k.path).second) << "duplicate key " << k.path;
    EXPECT_TRUE(sections.count(k.section())) << k.path << " has no section";
    EXPECT_FALSE(k.description.empty()) << k.path;
    EXPECT_TRUE(k.set && k.get) << k.path;
    // Every key is required, has a default, or says how it is derived.
    EXPECT_TRUE(k.required || k.default_value || !k.derived.empty()) << k.path;
    if (k.type == KeyType::kEnum) {
      EXPECT_GE(k.choices.size(), 2u) << k.path;
      ASSERT_TRUE(k.default_value) << k.path;
      EXPECT_LT(std::get<int64_t>(*k.default_value), static_cast<int64_t>(k.choices.size()));
    }
    if (k.default_value && (k.min || k.max) &&
        (k.type == KeyType::kInt || k.type == KeyType::kFloat)) {
      double v = k.type == KeyType::kInt ? static_cast<double>(std::get<int64_t>(*k.default_value))
                                         : std::get<double>(*k.default_value);
      if (k.min) {
        EXPECT_TRUE(k.min_exclusive ? v > *k.min : v >= *k.min) << k.path;
      }
      if (k.max) {
        EXPECT_LE(v, *k.max) << k.path;
      }
    }
  }
  // The issue's sections and a sample of its keys are all there.
  for (const char* p :
       {"job.name", "model.kv_heads", "model.head_dim", "model.mlp", "model.mlp_hidden",
        "model.recompute", "data.source", "data.paths", "data.pack", "data.max_doc_len",
        "parallel.context_ranks", "parallel.data_replicas", "parallel.ring_order",
        "parallel.causal_balance", "parallel.stagger_us", "optimizer.offload", "optimizer.update",
        "optimizer.compression", "optimizer.density", "optimizer.error_feedback",
        "optimizer.warmup_steps", "train.grad_clip", "checkpoint.keep_last", "checkpoint.async",
        "resources.gpus_per_node", "resources.cpus_per_worker", "resources.host_memory_gb",
        "slurm.qos", "slurm.constraint", "slurm.signal_before_s", "slurm.extra_sbatch",
        "restart.max_restarts", "restart.backoff_s"})
    EXPECT_NE(find_key(p), nullptr) << p;
}

TEST(SpecKeys, DefaultsComeFromTheTable) {
  JobSpec s = default_spec();
  for (const auto& k : spec_keys()) {
    if (!k.default_value) continue;
    auto got = k.get(s);
    ASSERT_TRUE(got) << k.path;
    EXPECT_EQ(value_text(*got, k), value_text(*k.default_value, k)) << k.path;
  }
}

// Writes every key of the table with a non-default value into YAML, parses it and checks each
// value arrived in its field: proves the table, not hand-written code, drives parsing.
TEST(SpecKeys, EveryKeyParsesIntoItsField) {
  JobSpec ref = default_spec();
  std::map<std::string, std::string> yaml_value;
  for (const auto& k : spec_keys()) {
    std::string v;
    switch (k.type) {
      case KeyType::kInt: {
        int64_t lo = k.min ? static_cast<int64_t>(*k.min) : 0;
        v = std::to_string(lo + 1);
        break;
      }
      case KeyType::kFloat: {
        double lo = k.min.value_or(0.0), hi = k.max.value_or(lo + 1.0);
        v = fmt::format("{}", (lo + hi) / 2);
        break;
      }
      case KeyType::kBool: v = "true"; break;
      case KeyType::kString: v = "x1"; break;
      case KeyType::kEnum: v = k.choices.back(); break;
      case KeyType::kStringList: v = "[a, b]"; break;
      case KeyType::kIntList: v = "[0]"; break;
    }
    yaml_value[k.path] = v;
  }
  std::string text;
  for (const auto& [sec, _] : spec_sections()) {
    text += sec + ":\n";
    for (const auto& k : spec_keys())
      if (k.section() == sec) text += "  " + k.name() + ": " + yaml_value[k.path] + "\n";
  }
  // Parse only (cross-field rules will object to this odd combination; that is fine).
  LoadResult r = load_spec_string(text, "all-keys.yaml");
  for (const auto& d : r.diagnostics) {
    // Only cross-field errors are acceptable: each key parsed on its own.
    for (const char* parse_error : {"unknown", "is not an integer", "is not a number",
                                    "is not a boolean", "is not one of", "out of range",
                                    "expected"})
      EXPECT_EQ(d.str().find(parse_error), std::string::npos) << d.str();
  }
  EXPECT_EQ(r.source.keys.size(), spec_keys().size());
}

TEST(SpecParse, MinimalSpecAppliesDefaultsAndResolves) {
  auto r = load_spec_string(kMinimal, "min.yaml");
  ASSERT_TRUE(r.ok()) << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
  const JobSpec& s = *r.spec;
  EXPECT_EQ(s.job.name, "t");
  EXPECT_EQ(s.model.vocab, 256);
  EXPECT_EQ(s.resolved.kv_heads, 4);
  EXPECT_EQ(s.resolved.head_dim, 16);
  EXPECT_EQ(s.resolved.mlp_hidden, 192);  // 8/3 * 64 = 170.7 -> 192 (multiple of 64)
  EXPECT_EQ(s.parallel.causal_balance, CausalBalance::kZigzag);
  EXPECT_EQ(s.optimizer.offload, Offload::kCpu);
  EXPECT_DOUBLE_EQ(s.optimizer.density, 0.001);
}

TEST(SpecParse, GeluHiddenAndExplicitHeadDim) {
  std::string t = std::string(kMinimal) + "";
  t.replace(t.find("  heads: 4"), 10, "  heads: 4\n  mlp: gelu\n  head_dim: 32");
  auto r = load_spec_string(t, "g.yaml");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.spec->resolved.mlp_hidden, 256);
  EXPECT_EQ(r.spec->resolved.head_dim, 32);
}

TEST(SpecParse, ErrorsNameFileLineColumnKeyValueAndRule) {
  std::string t = std::string(kMinimal);
  t.replace(t.find("layers: 2"), 9, "layers: 2000");
  auto r = load_spec_string(t, "x.yaml");
  ASSERT_FALSE(r.ok());
  auto e = errors_of(r);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "x.yaml:4:11: error: model.layers: value 2000 is out of range; allowed [1, 1024]");
}

TEST(SpecParse, ReportsEveryErrorNotJustTheFirst) {
  std::string t = R"(job:
  name: t
model:
  layers: 0
  d_model: big
  heads: 4
  mlp: relu
  colour: red
data:
  source: passkey
  seq_len: 1024
train:
  steps: 10
)";
  auto r = load_spec_string(t, "many.yaml");
  auto e = errors_of(r);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_NE(e[0].find("many.yaml:4:11: error: model.layers"), std::string::npos) << e[0];
  EXPECT_NE(e[1].find("many.yaml:5:12: error: model.d_model: value 'big' is not an integer"),
            std::string::npos) << e[1];
  EXPECT_NE(e[2].find("model.mlp: value 'relu' is not one of swiglu | gelu"), std::string::npos);
  EXPECT_NE(e[3].find("model.colour: unknown key"), std::string::npos);
}

TEST(SpecParse, CrossFieldErrorsPointAtTheKey) {
  std::string t = std::string(kMinimal);
  t.replace(t.find("  heads: 4"), 10, "  heads: 4\n  kv_heads: 3");
  auto r = load_spec_string(t, "x.yaml");
  auto e = errors_of(r);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].rfind("x.yaml:7:13: error: model.kv_heads:", 0), 0u) << e[0];
}

TEST(SpecParse, AnchorsAndAliasesWork) {
  std::string t = R"(job:
  name: t
model:
  layers: &n 2
  d_model: 64
  heads: 4
  kv_heads: *n
data:
  source: passkey
  seq_len: 1024
train:
  steps: 10
)";
  auto r = load_spec_string(t, "a.yaml");
  ASSERT_TRUE(r.ok()) << errors_of(r)[0];
  EXPECT_EQ(r.spec->resolved.kv_heads, 2);
}

TEST(SpecParse, ExponentIntegersAndSingleStringLists) {
  std::string t = std::string(kMinimal);
  t.replace(t.find("seq_len: 1024"), 13, "seq_len: 1.048576e6\n  paths: /tmp");
  t.replace(t.find("source: passkey"), 15, "source: text");
  auto r = load_spec_string(t, "e.yaml");
  ASSERT_TRUE(r.ok()) << errors_of(r)[0];
  EXPECT_EQ(r.spec->data.seq_len, 1048576);
  EXPECT_EQ(r.spec->data.paths, std::vector<std::string>{"/tmp"});
}

TEST(SpecParse, WarningsDoNotFailValidation) {
  std::string t = std::string(kMinimal) + "optimizer:\n  warmup_steps: 5\n";
  auto r = load_spec_string(t, "w.yaml");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].severity, Diagnostic::Severity::kWarning);
  EXPECT_NE(r.diagnostics[0].str().find("warning: optimizer.warmup_steps: ignored"),
            std::string::npos);
}

// optimizer.compress_at: owner by default; sender is accepted with shard none and optimizer,
// ignored (a warning) without top-k, and refused with shard full (configs/invalid/).
TEST(SpecParse, CompressAtDefaultsToOwner) {
  auto r = load_spec_string(std::string(kMinimal) + "optimizer:\n  compression: topk\n", "o.yaml");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.spec->optimizer.compress_at, CompressAt::kOwner);
  EXPECT_STREQ(to_string(r.spec->optimizer.compress_at), "owner");
  r = load_spec_string(std::string(kMinimal) +
                           "parallel:\n  shard: optimizer\n  context_ranks: 2\n"
                           "optimizer:\n  compression: topk\n"
                           "  compress_at: sender\nresources:\n  nodes: 2\n"
                           "  workers_per_node: 1\n",
                       "s.yaml");
  EXPECT_TRUE(errors_of(r).empty()) << (errors_of(r).empty() ? "" : errors_of(r)[0]);
  ASSERT_TRUE(r.spec);
  EXPECT_EQ(r.spec->optimizer.compress_at, CompressAt::kSender);
  r = load_spec_string(std::string(kMinimal) + "optimizer:\n  compress_at: sender\n", "w.yaml");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_NE(r.diagnostics[0].str().find(
                "warning: optimizer.compress_at: ignored: optimizer.compression is none"),
            std::string::npos)
      << r.diagnostics[0].str();
}

TEST(SpecParse, SuggestsKeys) {
  EXPECT_EQ(suggest_key("model", "d_modle"), "model.d_model");
  EXPECT_EQ(suggest_key("model", "kvheads"), "model.kv_heads");
  EXPECT_EQ(suggest_key("model", "seq_len"), "data.seq_len");
  EXPECT_EQ(suggest_key("model", "completely_unrelated"), "");
}

// Hostile inputs: each must produce errors (never a crash, hang or exception).
TEST(SpecRobustness, HostileInputsGiveErrors) {
  std::vector<std::pair<std::string, std::string>> cases;
  cases.push_back({"deep flow nesting", std::string(100000, '[') + std::string(100000, ']')});
  cases.push_back({"deep map nesting", [] {
                     std::string s;
                     for (int i = 0; i < 3000; ++i) s += std::string(i % 400, ' ') + "a:\n";
                     return s;
                   }()});
  cases.push_back({"non-utf8", std::string("job:\n  name: \xff\xfe\n")});
  cases.push_back({"nul bytes", std::string("job:\n  name: a\0b\n", 16)});
  cases.push_back({"huge number", std::string(kMinimal).replace(
                                      std::string(kMinimal).find("steps: 10"), 9,
                                      "steps: 1" + std::string(400, '0'))});
  cases.push_back({"huge float", std::string(kMinimal) + "optimizer:\n  lr: 1e999999\n"});
  cases.push_back({"alias bomb", [] {
                     std::string s = "a: &a [x, x, x, x, x, x, x, x, x]\n";
                     char prev = 'a';
                     for (char c = 'b'; c <= 'j'; ++c) {
                       s += fmt::format("{}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n", c, c,
                                        fmt::arg("p", prev));
                       prev = c;
                     }
                     return s + "data:\n  paths: *j\n";
                   }()});
  cases.push_back({"tags", "job: !!binary aGVsbG8=\nmodel: !custom {layers: 2}\n"});
  // yaml-cpp's LoadAll never returns on a ',' at document level (found by the fuzzer).
  cases.push_back({"stray comma", ", a\nb:\n  c: 1\n"});
  cases.push_back({"stray comma after flow", "[a], b\n"});
  cases.push_back({"too big", std::string(kMaxSpecBytes + 10, '#')});
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200; ++i) {
    std::string junk(rng() % 512, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    cases.push_back({fmt::format("random junk {}", i), junk});
  }
  for (const auto& [name, text] : cases) {
    LoadResult r;
    ASSERT_NO_THROW(r = load_spec_string(text, "h.yaml")) << name;
    EXPECT_FALSE(r.ok()) << name;
    EXPECT_GE(r.error_count(), 1u) << name;
  }
}

TEST(SpecRobustness, FileErrors) {
  auto r = load_spec_file("/nonexistent/spec.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.diagnostics[0].str().find("/nonexistent/spec.yaml: error: cannot open"),
            std::string::npos);
  r = load_spec_file("/tmp");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.diagnostics[0].str().find("is a directory"), std::string::npos);
}

// A spec is a regular file. A FIFO without a writer, /dev/zero, a directory and a socket are each
// refused at once, naming the file and the rule: nothing blocks (a regression would hang here,
// so each load runs against a deadline, after which the FIFO gets a writer to free it).
TEST(SpecFiles, OnlyRegularFilesAreRead) {
  std::string dir = "/tmp/ring-spec-files-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string fifo = dir + "/spec.fifo", sock = dir + "/spec.sock";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
  ASSERT_EQ(bind(sfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "is a named pipe (FIFO); a spec must be a regular file"},
      {"/dev/zero", "is a character device; a spec must be a regular file"},
      {dir, "is a directory; a spec must be a regular file"},
      {sock, "is a socket; a spec must be a regular file"},
  };
  for (const auto& [path, why] : cases) {
    auto f = std::async(std::launch::async, [p = path] { return load_spec_file(p); });
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << path << ": load_spec_file still blocked after 30 s";
      int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // frees a reader blocked on the FIFO
      if (w >= 0) close(w);
    }
    auto r = f.get();
    ASSERT_FALSE(r.ok()) << path;
    ASSERT_FALSE(r.diagnostics.empty()) << path;
    EXPECT_EQ(r.diagnostics[0].str(), path + ": error: " + why);
  }
  // '-' is standard input only when asked; otherwise it is a file name like any other.
  auto r = load_spec_file("-");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.diagnostics[0].str().find("-: error: cannot open: No such file"), std::string::npos)
      << r.diagnostics[0].str();
  close(sfd);
  fs::remove_all(dir);
}

// Through ringctl, with a deadline on the whole command: a FIFO is refused (exit 1, not a hang),
// and `-` reads standard input.
TEST(SpecFiles, RingctlValidateRefusesAFifoAndReadsStdinWhenAsked) {
  const std::string ringctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";
  std::string dir = "/tmp/ring-spec-fifo-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  ASSERT_EQ(mkfifo((dir + "/s.yaml").c_str(), 0600), 0);
  auto r = test::run("timeout 60 " + ringctl + " validate " + dir + "/s.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir + "/s.yaml: error: is a named pipe (FIFO); a spec must be a "
                                "regular file (or '-' for standard input)"),
            std::string::npos)
      << r.output;
  r = test::run("timeout 60 " + ringctl + " plan " + dir + "/s.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is a named pipe (FIFO)"), std::string::npos) << r.output;
  r = test::run("timeout 60 " + ringctl + " validate - < " +
                source_path("configs/examples/tiny.yaml"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("<stdin>: ok (tiny"), std::string::npos) << r.output;
  r = test::run("timeout 60 " + ringctl + " validate - < " +
                source_path("configs/invalid/bad-enum.yaml"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("<stdin>:"), std::string::npos) << r.output;
  r = test::run("timeout 60 " + ringctl + " validate - - < /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  fs::remove_all(dir);
}

LoadResult with_overrides(const std::string& text, std::vector<std::string> args) {
  LoadOptions o = job_spec_options();
  for (const auto& a : args) {
    auto ov = parse_override(a);
    EXPECT_TRUE(ov) << a;
    if (ov) o.overrides.push_back(*ov);
  }
  return load_spec_string(text, "t.yaml", o);
}

std::string all_diagnostics(const LoadResult& r) {
  std::string s;
  for (const auto& d : r.diagnostics) s += d.str() + "\n";
  return s;
}

// --set KEY=VALUE: applied before any check, judged by the key table like a key of the file,
// named in its diagnostics, and part of the text callers submit.
TEST(SpecOverrides, ApplyJudgeAndRecord) {
  EXPECT_FALSE(parse_override("train.steps"));
  EXPECT_FALSE(parse_override("=5"));
  ASSERT_TRUE(parse_override("job.name=a=b"));
  EXPECT_EQ(parse_override("job.name=a=b")->value, "a=b");

  // A key of the file replaced, a key the file lacks added, a section the file lacks created.
  auto r = with_overrides(
      kMinimal, {"train.steps=7", "model.kv_heads=2", "slurm.partition=gpu", "train.steps=9"});
  ASSERT_TRUE(r.ok()) << all_diagnostics(r);
  EXPECT_EQ(r.spec->train.steps, 9);  // the later override wins
  EXPECT_EQ(r.spec->model.kv_heads, 2);
  EXPECT_EQ(r.spec->slurm.partition, "gpu");
  // The recorded text lists the overrides and reads back to the same spec.
  EXPECT_NE(r.text.find("#   --set train.steps=7\n"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("#   --set slurm.partition=gpu\n"), std::string::npos) << r.text;
  auto back = load_spec_string(r.text, "back.yaml", job_spec_options());
  ASSERT_TRUE(back.ok()) << all_diagnostics(back);
  EXPECT_EQ(back.spec->train.steps, 9);
  EXPECT_EQ(back.spec->slurm.partition, "gpu");
  EXPECT_EQ(back.spec->model.layers, 2);
  // Without overrides the text is the file's, byte for byte.
  EXPECT_EQ(load_spec_string(kMinimal, "t.yaml", job_spec_options()).text, kMinimal);
  // Lists and quoted strings are YAML values.
  r = with_overrides(kMinimal, {"data.source=text", "data.paths=[/a, '/b c']"});
  ASSERT_TRUE(r.ok()) << all_diagnostics(r);
  EXPECT_EQ(r.spec->data.paths, (std::vector<std::string>{"/a", "/b c"}));

  // An unknown key: named, with the closest one, attributed to the override.
  r = with_overrides(kMinimal, {"train.stpes=5"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(all_diagnostics(r).find("t.yaml: error: train.stpes: unknown key; did you mean "
                                    "'train.steps'? (--set train.stpes=5)"),
            std::string::npos)
      << all_diagnostics(r);
  r = with_overrides(kMinimal, {"modle.layers=5"});
  EXPECT_NE(all_diagnostics(r).find("modle.layers: unknown section; did you mean 'model'?"),
            std::string::npos)
      << all_diagnostics(r);
  r = with_overrides(kMinimal, {"model=5"});
  EXPECT_NE(all_diagnostics(r).find("model: a section, not a key: --set takes SECTION.KEY=VALUE"),
            std::string::npos)
      << all_diagnostics(r);
  // A wrong type or range: the key's own rule, no line of the file, the override named.
  r = with_overrides(kMinimal, {"model.layers=many"});
  EXPECT_NE(all_diagnostics(r).find("t.yaml: error: model.layers: value 'many' is not an "
                                    "integer (--set model.layers=many)"),
            std::string::npos)
      << all_diagnostics(r);
  r = with_overrides(kMinimal, {"train.steps=0"});
  EXPECT_NE(all_diagnostics(r).find("train.steps: value 0 is out of range"), std::string::npos)
      << all_diagnostics(r);
  r = with_overrides(kMinimal, {"model.recompute=[1"});
  EXPECT_NE(all_diagnostics(r).find("is not a YAML value"), std::string::npos)
      << all_diagnostics(r);
  r = with_overrides(kMinimal, {"job.name="});
  EXPECT_NE(all_diagnostics(r).find("job.name: key has no value"), std::string::npos)
      << all_diagnostics(r);
  // A cross-field rule broken by an override names it too.
  r = with_overrides(kMinimal, {"model.heads=5"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(all_diagnostics(r).find("(--set model.heads=5)"), std::string::npos)
      << all_diagnostics(r);
}

// job.kind generate: the checkpoint and prompts are required, the training-only keys are not,
// and their rules are not checked; a train spec warns about the generate job keys it ignores.
TEST(SpecGenerate, KindGenerateRules) {
  const std::string base = R"(job:
  name: g
  kind: generate
model:
  layers: 2
  d_model: 64
  heads: 4
parallel:
  context_ranks: 2
resources:
  workers_per_node: 2
)";
  const std::string inputs = "generate:\n  checkpoint: /c\n  prompts: [/a, /b]\n";
  auto r = load_spec_string(base + inputs, "g.yaml", job_spec_options());
  ASSERT_TRUE(r.ok()) << all_diagnostics(r);  // no data.seq_len, no train.steps, no paths
  EXPECT_EQ(r.spec->job.kind, JobKind::kGenerate);
  EXPECT_EQ(r.spec->generate.prompts, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(r.spec->generate.max_new_tokens, 64);
  EXPECT_EQ(r.spec->generate.top_p, 1.0);
  // Training-only rules are not checked (lr_warmup_steps > steps would be an error).
  r = load_spec_string(base + inputs + "optimizer:\n  lr_warmup_steps: 50\n", "g.yaml",
                       job_spec_options());
  EXPECT_TRUE(r.ok()) << all_diagnostics(r);
  // Without inputs: each missing one named.
  r = load_spec_string(base, "g.yaml", job_spec_options());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(all_diagnostics(r).find("job.kind: job.kind generate needs generate.checkpoint"),
            std::string::npos)
      << all_diagnostics(r);
  EXPECT_NE(all_diagnostics(r).find("job.kind generate needs generate.prompts"), std::string::npos);
  // One ring, whole model, cpu.
  std::string t = base + inputs;
  t.replace(t.find("  context_ranks: 2\n"), 18, "  context_ranks: 1\n  data_replicas: 2\n");
  r = load_spec_string(t, "g.yaml", job_spec_options());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(all_diagnostics(r).find("parallel.data_replicas: job.kind generate runs one ring"),
            std::string::npos)
      << all_diagnostics(r);
  r = load_spec_string(base + inputs + "  top_p: 0\n", "g.yaml", job_spec_options());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(all_diagnostics(r).find("generate.top_p"), std::string::npos) << all_diagnostics(r);
  // A train spec still needs data.seq_len and train.steps, and says the job keys are ignored.
  r = load_spec_string(std::string(kMinimal) + inputs, "t.yaml");
  ASSERT_TRUE(r.ok()) << all_diagnostics(r);
  EXPECT_NE(all_diagnostics(r).find("generate.prompts: ignored: job.kind is train"),
            std::string::npos)
      << all_diagnostics(r);
  r = load_spec_string("job:\n  name: t\nmodel:\n  layers: 2\n  d_model: 64\n  heads: 4\n",
                       "t.yaml");
  EXPECT_NE(all_diagnostics(r).find("data.seq_len: required key is missing"), std::string::npos)
      << all_diagnostics(r);
}

TEST(SpecExamples, AllExamplesValidate) {
  int n = 0;
  // Every example validates, the bf16 sizing examples on H100/H200 included (model.dtype bf16,
  // docs/precision.md), with and without this build's runtime limits as errors.
  LoadOptions what_if = job_spec_options();
  what_if.runtime_limits_are_errors = false;
  for (const auto& e : fs::directory_iterator(source_path("configs/examples"))) {
    if (e.path().extension() != ".yaml") continue;
    ++n;
    auto r = load_spec_file(e.path().string(), job_spec_options());
    EXPECT_TRUE(r.ok()) << e.path() << ": "
                        << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
    r = load_spec_file(e.path().string(), what_if);
    EXPECT_TRUE(r.ok()) << e.path() << ": "
                        << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
    for (const auto& d : r.diagnostics)
      EXPECT_EQ(d.message.find("not supported by this build"), std::string::npos)
          << e.path() << ": " << d.str();
  }
  EXPECT_GE(n, 6);
}

// The planner's flat layout (what the lazy-index and bucket limits are checked on) is the one
// ringd and the workers allocate (common/contract/layout.cc), alignment included.
TEST(SpecLimits, FlatLayoutIsTheWorkersLayout) {
  const std::vector<std::string> models = {
      "{layers: 2, d_model: 64, heads: 4}",
      "{layers: 3, d_model: 72, heads: 6, kv_heads: 2, tie_embeddings: false, vocab: 301}",
      "{layers: 1, d_model: 40, heads: 5, head_dim: 6, mlp: gelu, mlp_hidden: 33, vocab: 259}",
      "{layers: 4, d_model: 96, heads: 8, kv_heads: 1, mlp_hidden: 17, tie_embeddings: false}",
  };
  for (const auto& m : models) {
    std::string text = std::string(kMinimal);
    text.replace(text.find("model:"), text.find("data:") - text.find("model:"),
                 "model: " + m + "\n");
    auto r = load_spec_string(text, "m.yaml");
    ASSERT_TRUE(r.ok()) << m << ": " << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
    contract::ParamLayout layout(contract::ModelConfig::from_spec(*r.spec));
    auto f = plan::flat_layout(*r.spec);
    EXPECT_EQ(f.elements, layout.total()) << m;
    int64_t largest = 0;
    for (const auto& b : layout.buckets()) largest = std::max(largest, b.end - b.begin);
    EXPECT_EQ(f.largest_bucket, largest) << m;
  }
}

// The limits of this build are errors for ringctl, warnings for --what-if; ringd's own rule
// (offload cpu) applies to jobs, not to `ring-worker --spec` alone.
TEST(SpecLimits, ScopesOfTheRules) {
  auto wide = source_path("configs/invalid/cuda-head-dim-over-128.yaml");
  EXPECT_FALSE(load_spec_file(wide).ok());
  LoadOptions what_if;
  what_if.runtime_limits_are_errors = false;
  auto r = load_spec_file(wide, what_if);
  ASSERT_TRUE(r.ok()) << errors_of(r)[0];
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].severity, Diagnostic::Severity::kWarning);
  // The same job with 8 heads (head_dim 128) is fine: the limit is head_dim with backend cuda.
  std::string text = read_file(wide);
  text.replace(text.find("heads: 4"), 8, "heads: 8");
  EXPECT_TRUE(load_spec_string(text, "narrow.yaml", job_spec_options()).ok());
  auto none = source_path("configs/invalid/offload-none-under-ringd.yaml");
  EXPECT_TRUE(load_spec_file(none).ok());                       // ring-worker alone
  EXPECT_FALSE(load_spec_file(none, job_spec_options()).ok());  // ringctl, ringd
}

TEST(SpecDocs, ReferenceIsUpToDate) {
  std::string doc = read_file(source_path("docs/spec-reference.md"));
  EXPECT_EQ(doc, spec_reference_markdown())
      << "docs/spec-reference.md is stale: run `cmake --build build --target spec-doc`";
  for (const auto& k : spec_keys()) EXPECT_NE(doc.find("`" + k.path + "`"), std::string::npos);
}

}  // namespace
}  // namespace ring::spec

namespace ring::spec {
namespace {

TEST(SpecRules, SlurmTimeFormats) {
  auto with_time = [](const std::string& t, int64_t signal) {
    return std::string(kMinimal) + "slurm:\n  time: \"" + t + "\"\n  signal_before_s: " +
           std::to_string(signal) + "\n";
  };
  for (const char* ok : {"30", "30:00", "1:00:00", "2-00", "2-12:30", "2-12:30:15", "0:45"})
    EXPECT_TRUE(load_spec_string(with_time(ok, 10), "t.yaml").ok()) << ok;
  for (const char* bad : {"1:2:3:4", "-5", "2-25", "abc", "10:60", "1::2", "", "3-"}) {
    if (std::string(bad).empty()) continue;  // empty means "partition default"
    auto r = load_spec_string(with_time(bad, 10), "t.yaml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.diagnostics[0].str().find("is not a Slurm time"), std::string::npos) << bad;
  }
  // 2-12:30 is 2 days 12.5 hours = 217800 s: a signal at 217800 s is refused, 217799 accepted.
  EXPECT_FALSE(load_spec_string(with_time("2-12:30", 217800), "t.yaml").ok());
  EXPECT_TRUE(load_spec_string(with_time("2-12:30", 65535), "t.yaml").ok());
  auto r = load_spec_string(with_time("0:45", 45), "t.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.diagnostics[0].str().find("(45 s)"), std::string::npos) << r.diagnostics[0].str();
}

}  // namespace
}  // namespace ring::spec
