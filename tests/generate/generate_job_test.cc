// A generation job (job.kind generate) through `ringctl run`: ring-coord, ringd and its
// `ring-worker --generate` ranks. The output equals `ringctl generate` standalone on the same
// checkpoint, prompts and seed (greedy over 1 and 2 ranks and over 4 ranks in two head groups,
// sampled over 2 ranks with --json);
// the job ends completed in ring-coord with its events; a bad generate spec is refused naming
// the key; a killed worker fails the job (no hang, no process left); a SIGSTOPped worker is found
// hung from its flight recorder and fails the job naming it (also across two nodes: the stuck
// rank's node names it), while a slow but progressing job under CPU load (a long prefill) is not
// flagged; `ringctl cancel` and Ctrl-C stop it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "../common/run.h"
#include "../coordinator/coord_test_util.h"
#include "tests/common/test_proc.h"
#include "tests/common/tiny_model.h"

using namespace ring::coord::test;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

namespace fs = std::filesystem;
const std::string kRingctl = RINGCTL;

struct TempDir {
  std::string path = make_temp_dir("genjob");
  ~TempDir() { fs::remove_all(path); }
};

// A run's own coordinator endpoint and state dir, UCX on loopback.
std::string env(const TempDir& t) {
  return "RING_COORD=ipc://" + t.path + "/sock/coord.sock RING_STATE_DIR=" + t.path +
         "/state UCX_TLS=self,posix UCX_NET_DEVICES=lo ";
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The test checkpoint (tests/generate/write_test_checkpoint.cc: 2 layers, d_model 64, 4 heads
// over 2 K/V heads of 16, swiglu 128, bytes) and two prompts sharing a prefix.
class GenerateJob : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = ring::test::run(std::string(GEN_CKPT_WRITER) + " " + t_.path + "/ckpt");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string prefix;
    for (int i = 0; i < 12; ++i) prefix += "the ring passes blocks of keys and values; ";
    write(t_.path + "/a.txt", prefix + "first question?");
    write(t_.path + "/b.txt", prefix + "and a second, longer one to answer!");
  }

  // A generate spec over `ranks` ranks; `extra` lines go into the generate section. Its model is
  // the checkpoint's (write_test_checkpoint: the tests' tiny model).
  std::string spec(int ranks, const std::string& extra, const std::string& name = "gen") {
    const std::string path = t_.path + "/" + name + ".yaml";
    write(path, "job:\n  name: " + name +
                    "\n  kind: generate\n"
                    "model: " + ring::test::tiny_model_yaml() +
                    "\ngenerate:\n  checkpoint: " +
                    t_.path + "/ckpt\n  prompts: [" + t_.path + "/a.txt, " + t_.path +
                    "/b.txt]\n  page_tokens: 64\n" + extra +
                    "parallel:\n  context_ranks: " + std::to_string(ranks) +
                    "\nresources:\n  workers_per_node: " + std::to_string(ranks) +
                    "\n  cpus_per_worker: 1\n");
    return path;
  }

  // `ringctl generate` in one process on the same inputs.
  std::string standalone(const std::string& flags) {
    const std::string out = t_.path + "/standalone.out";
    fs::remove(out);
    auto r = ring::test::run(kRingctl + " generate --checkpoint " + t_.path + "/ckpt " + t_.path +
                             "/a.txt " + t_.path + "/b.txt -o " + out + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ring::test::read_file(out);
  }

  // `ringctl run SPEC` to the end.
  ring::test::RunResult run_job(const std::string& spec_path, const std::string& job_dir) {
    return ring::test::run(env(t_) + kRingctl + " run " + spec_path + " --job-dir " + job_dir);
  }

  json status(int job) {
    // stderr (a note when the coordinator `ringctl run` started is gone) apart from the JSON.
    auto s = ring::test::run("{ " + env(t_) + kRingctl + " status " + std::to_string(job) +
                             " --json 2>/dev/null; }");
    EXPECT_EQ(s.exit_code, 0) << s.output;
    return json::parse(s.output, nullptr, false);
  }

  TempDir t_;
};

TEST_F(GenerateJob, OneRankGreedyEqualsStandalone) {
  const std::string job_dir = t_.path + "/job1";
  auto r = run_job(spec(1, "  max_new_tokens: 24\n"), job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string want = standalone("--max-tokens 24");
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(ring::test::read_file(job_dir + "/generate.out"), want);
  // Progress as training prints it, the coordinator's end state and events.
  EXPECT_TRUE(contains(r.output, "generate_progress")) << r.output;
  EXPECT_TRUE(contains(r.output, "coordinator: completed")) << r.output;
  EXPECT_TRUE(contains(r.output, "output: " + job_dir + "/generate.out")) << r.output;
  const json s = status(1);
  EXPECT_EQ(s.value("state", ""), "completed") << s.dump();
  auto ev = ring::test::run(env(t_) + kRingctl + " events 1");
  EXPECT_TRUE(contains(ev.output, "worker_started")) << ev.output;
  EXPECT_TRUE(contains(ev.output, "job_completed")) << ev.output;
  // ringctl logs: the worker's log, with the generation's own lines.
  auto logs = ring::test::run(env(t_) + kRingctl + " logs 1 2>&1");
  EXPECT_TRUE(contains(logs.output, "generate:")) << logs.output;
  // Seeded sampling on one rank (job 2 of the same state directory).
  const std::string job_dir2 = t_.path + "/job1s";
  r = run_job(spec(1, "  max_new_tokens: 24\n  temperature: 1.1\n  seed: 3\n", "gens"), job_dir2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ring::test::read_file(job_dir2 + "/generate.out"),
            standalone("--max-tokens 24 --temperature 1.1 --seed 3"));
  EXPECT_NE(ring::test::read_file(job_dir2 + "/generate.out"), want);
}

// bf16 (docs/generation.md "bf16"): a checkpoint trained in bf16 (its record says so) and a spec
// with model.dtype bf16 (no longer refused): the job's two ranks generate in bf16 (--json says
// so) the output of `ringctl generate` on the same checkpoint in one process, bf16 by its record.
TEST_F(GenerateJob, TwoRanksBf16EqualsStandalone) {
  auto w = ring::test::run(std::string(GEN_CKPT_WRITER) + " " + t_.path + "/ckpt16 bf16");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  std::string model = ring::test::tiny_model_yaml();
  model.insert(model.size() - 1, ", dtype: bf16");
  const std::string path = t_.path + "/gen16.yaml";
  write(path, "job:\n  name: gen16\n  kind: generate\nmodel: " + model +
                  "\ngenerate:\n  checkpoint: " + t_.path + "/ckpt16\n  prompts: [" + t_.path +
                  "/a.txt, " + t_.path + "/b.txt]\n  page_tokens: 64\n  max_new_tokens: 24\n"
                  "  json: true\nparallel:\n  context_ranks: 2\nresources:\n  workers_per_node: "
                  "2\n  cpus_per_worker: 1\n");
  const std::string job_dir = t_.path + "/job16";
  auto r = run_job(path, job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json got = json::parse(ring::test::read_file(job_dir + "/generate.json"), nullptr, false);
  ASSERT_TRUE(got.is_object()) << ring::test::read_file(job_dir + "/generate.json");
  EXPECT_EQ(got.value("dtype", ""), "bf16");
  const std::string out = t_.path + "/standalone16.json";
  auto s = ring::test::run(kRingctl + " generate --checkpoint " + t_.path + "/ckpt16 " + t_.path +
                           "/a.txt " + t_.path + "/b.txt --json --page-tokens 64 --max-tokens 24 "
                           "-o " + out);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const json want = json::parse(ring::test::read_file(out));
  EXPECT_EQ(want.value("dtype", ""), "bf16");
  ASSERT_EQ(got["prompts"].size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(got["prompts"][i]["tokens"], want["prompts"][i]["tokens"]) << i;
}

TEST_F(GenerateJob, TwoRanksGreedyEqualsStandalone) {
  const std::string job_dir = t_.path + "/job2";
  auto r = run_job(spec(2, "  max_new_tokens: 40\n  output: out/greedy.txt\n"), job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // A relative generate.output is taken from the job directory.
  EXPECT_EQ(ring::test::read_file(job_dir + "/out/greedy.txt"), standalone("--max-tokens 40"));
  EXPECT_EQ(status(1).value("state", ""), "completed");
}

// Two-level prefill in a job (parallel.head_ranks 2: 4 ranks as 2 head groups of 2, the ring
// over the groups): ringd's ranks produce what `ringctl generate` produces in one process.
TEST_F(GenerateJob, FourRanksInTwoHeadGroupsEqualsStandalone) {
  std::string text = ring::test::read_file(spec(4, "  max_new_tokens: 32\n"));
  const std::string key = "context_ranks: 4";
  ASSERT_NE(text.find(key), std::string::npos) << text;
  text.replace(text.find(key), key.size(), key + "\n  head_ranks: 2");
  const std::string path = t_.path + "/gen_heads.yaml";
  write(path, text);
  const std::string job_dir = t_.path + "/job_heads";
  auto r = run_job(path, job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ring::test::read_file(job_dir + "/generate.out"), standalone("--max-tokens 32"));
  EXPECT_EQ(status(1).value("state", ""), "completed");
}

TEST_F(GenerateJob, TwoRanksSampledJsonEqualsStandalone) {
  const std::string job_dir = t_.path + "/job3";
  auto r = run_job(spec(2,
                        "  max_new_tokens: 32\n  temperature: 0.9\n  top_p: 0.9\n"
                        "  seed: 11\n  json: true\n"),
                   job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json got = json::parse(ring::test::read_file(job_dir + "/generate.json"), nullptr, false);
  const json want = json::parse(
      standalone("--max-tokens 32 --temperature 0.9 --top-p 0.9 --seed 11 --json"), nullptr, false);
  ASSERT_TRUE(got.is_object() && want.is_object());
  EXPECT_EQ(got["ranks"]["ranks"], 2);
  ASSERT_EQ(got["prompts"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got["prompts"][i]["tokens"], want["prompts"][i]["tokens"]) << i;
    EXPECT_EQ(got["prompts"][i]["text"], want["prompts"][i]["text"]) << i;
    // Per-token timing: one decode step per token after the first.
    EXPECT_EQ(got["prompts"][i]["step_s"].size() + 1, got["prompts"][i]["tokens"].size());
  }
  // Sampling did something: another seed gives other tokens.
  const json other = json::parse(
      standalone("--max-tokens 32 --temperature 0.9 --top-p 0.9 --seed 12 --json"), nullptr, false);
  EXPECT_NE(other["prompts"][0]["tokens"], want["prompts"][0]["tokens"]);
}

TEST_F(GenerateJob, BadSpecsAreRefusedNamingTheKey) {
  // No prompts.
  const std::string p1 = t_.path + "/np.yaml";
  write(p1,
        "job:\n  name: np\n  kind: generate\nmodel:\n  layers: 2\n  d_model: 64\n  heads: 4\n"
        "generate:\n  checkpoint: " +
            t_.path +
            "/ckpt\n"
            "parallel:\n  context_ranks: 1\nresources:\n  workers_per_node: 1\n");
  auto r = run_job(p1, t_.path + "/jnp");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "job.kind generate needs generate.prompts")) << r.output;
  // A prompt that is not there: before anything starts.
  const std::string p2 = spec(1, "", "missing");
  std::string text = ring::test::read_file(p2);
  text.replace(text.find("/b.txt"), 6, "/nope.txt");
  write(p2, text);
  r = run_job(p2, t_.path + "/jmissing");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "generate.prompts: '" + t_.path + "/nope.txt'")) << r.output;
  EXPECT_FALSE(contains(r.output, "submitted")) << r.output;
  // Training's flags.
  r = ring::test::run(env(t_) + kRingctl + " run " + spec(1, "", "steps") + " --resume");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--resume: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "is a generate job")) << r.output;
  // Sharded model state makes no sense for generation.
  const std::string p3 = spec(1, "", "shard");
  write(p3, ring::test::read_file(p3) + "optimizer:\n  offload: cpu\n");
  text = ring::test::read_file(p3);
  text.replace(text.find("parallel:\n"), 10, "parallel:\n  shard: optimizer\n");
  write(p3, text);
  r = ring::test::run(kRingctl + " validate " + p3);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "parallel.shard: job.kind generate")) << r.output;
  // A model that is not the checkpoint's: the job fails, naming the tensor.
  const std::string p4 = spec(1, "", "wrongmodel");
  text = ring::test::read_file(p4);
  text.replace(text.find("mlp_hidden: 128"), 15, "mlp_hidden: 96");
  write(p4, text);
  r = run_job(p4, t_.path + "/jwrong");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "failed")) << r.output;
  EXPECT_TRUE(contains(r.output, "mlp")) << r.output;
}

// ringctl run in the background (output to a file), as another terminal would see it.
class RunProc {
 public:
  RunProc(const TempDir& t, const std::string& args) : out_(t.path + "/run.out") {
    pid_ = ring::test::start_logged(
        {"/bin/sh", "-c", "exec env " + env(t) + kRingctl + " run " + args}, out_);
  }
  ~RunProc() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait(5);
    }
  }
  std::string output() const { return read_text(out_); }
  void interrupt() { ::kill(pid_, SIGINT); }  // Ctrl-C
  int wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }

 private:
  std::string out_;
  pid_t pid_ = -1;
};

// The pid ringd logged for a worker rank ("worker rank R (local L) pid N").
pid_t worker_pid(const std::string& job_dir, int rank) {
  const std::string log = read_text(job_dir + "/logs/ringd-0.log");
  std::smatch m;
  const std::regex re("worker rank " + std::to_string(rank) + " \\(local \\d+\\) pid (\\d+)");
  if (!std::regex_search(log, m, re)) return -1;
  return static_cast<pid_t>(std::stol(m[1]));
}

TEST_F(GenerateJob, KilledWorkerFailsTheJob) {
  const std::string job_dir = t_.path + "/jkill";
  // Long enough to be killed while decoding.
  RunProc run(t_, spec(2, "  max_new_tokens: 1000000\n") + " --job-dir " + job_dir);
  ASSERT_TRUE(wait_for([&] { return contains(run.output(), "decode "); }, 180s)) << run.output();
  const pid_t victim = worker_pid(job_dir, 1), other = worker_pid(job_dir, 0);
  ASSERT_GT(victim, 0);
  ASSERT_GT(other, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const int rc = run.wait(120);
  EXPECT_EQ(rc, 1) << run.output();
  EXPECT_TRUE(contains(run.output(), "worker_died")) << run.output();
  EXPECT_TRUE(contains(run.output(), "coordinator: failed")) << run.output();
  const json s = status(1);
  EXPECT_EQ(s.value("state", ""), "failed") << s.dump();
  EXPECT_TRUE(contains(s.value("state_reason", ""), "worker rank 1")) << s.dump();
  EXPECT_TRUE(contains(s.value("state_reason", ""), "signal 9")) << s.dump();
  EXPECT_TRUE(contains(s.value("state_reason", ""), "restarts exhausted (0 of 0)")) << s.dump();
  // No rank is left behind.
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(other, "ring-worker"); }, 30s));
  EXPECT_FALSE(fs::exists(job_dir + "/generate.out"));
}

// A rank SIGSTOPped mid-decode: its peer blocks in the decode all_gather; ringd's hang check
// (generate.hang_deadline_s 3: the deadline is max(3 s, 10 x the slowest step)) names the
// stopped rank, stops both and fails the job far sooner than the transport's 600 s timeout.
TEST_F(GenerateJob, StoppedWorkerIsFoundHungAndFailsTheJob) {
  const std::string job_dir = t_.path + "/jstop";
  RunProc run(t_, spec(2, "  max_new_tokens: 1000000\n  hang_deadline_s: 3\n") + " --job-dir " +
                      job_dir);
  ASSERT_TRUE(wait_for([&] { return contains(run.output(), "decode "); }, 180s)) << run.output();
  const pid_t victim = worker_pid(job_dir, 1), other = worker_pid(job_dir, 0);
  ASSERT_GT(victim, 0);
  ASSERT_GT(other, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = run.wait(300);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(victim, SIGCONT);  // only if the test failed: ringd kills it
  EXPECT_EQ(rc, 1) << run.output();
  std::printf("SIGSTOP to the end of the job: %.1f s\n", took);
  // Far under the transport's 600 s (the deadline here is a few seconds; the rest is margin for
  // a loaded machine).
  EXPECT_LT(took, 300) << run.output();
  const std::string out = run.output();
  EXPECT_TRUE(contains(out, "missing=[1]")) << out;
  EXPECT_TRUE(contains(out, "worker_failed")) << out;
  EXPECT_TRUE(contains(out, "coordinator: failed")) << out;
  // The finding: rank 1 stopped in a decode step, rank 0 waiting on it in the all_gather.
  const json ev = status(1);
  ASSERT_TRUE(ev.is_object()) << ev;
  EXPECT_EQ(ev.value("state", ""), "failed") << ev.dump();
  const std::string reason = ev.value("state_reason", "");
  EXPECT_TRUE(contains(reason, "worker rank 1 on ")) << reason;
  EXPECT_TRUE(contains(reason, "hung: decode step ")) << reason;
  EXPECT_TRUE(contains(reason, "rank 1 is stopped (SIGSTOP)")) << reason;
  const json& hang = ev["hang"];
  ASSERT_TRUE(hang.is_object()) << ev.dump();
  EXPECT_EQ(hang["missing"], json::array({1})) << hang.dump();
  ASSERT_EQ(hang["waiting"].size(), 1u) << hang.dump();
  EXPECT_EQ(hang["waiting"][0]["rank"], 0) << hang.dump();
  EXPECT_TRUE(contains(hang["waiting"][0].value("where", ""), "collective")) << hang.dump();
  // The deadline that passed: the floor, or 10 x a slow step; never the transport's 600 s.
  EXPECT_GE(hang.value("deadline_s", 0.0), 3.0) << hang.dump();
  EXPECT_LT(hang.value("deadline_s", 0.0), 600.0) << hang.dump();
  // The flight recorder of the hang for `ringctl trace`: both ranks' decode steps.
  const std::string trace = read_text(job_dir + "/timeline/node-0.jsonl");
  EXPECT_TRUE(contains(trace, "[0,") && contains(trace, "[1,")) << trace.substr(0, 2000);
  EXPECT_TRUE(contains(trace, "\"decode\"")) << trace.substr(0, 2000);
  // No rank is left behind (the stopped one is killed).
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(victim, "ring-worker"); }, 30s));
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(other, "ring-worker"); }, 30s));
  EXPECT_FALSE(fs::exists(job_dir + "/generate.out"));
}

// Two nodes (two ringd, one rank each, no coordinator), rank 1 SIGSTOPped mid-decode: node 1's
// ringd names its rank missing and fails it; node 0's rank only waits on it (its ringd never
// names rank 0), and dies on the lost peer. Both ringd exit 1, no rank is left.
TEST_F(GenerateJob, TwoNodesTheStuckRanksNodeNamesIt) {
  std::string text = ring::test::read_file(
      spec(2, "  max_new_tokens: 1000000\n  hang_deadline_s: 3\n", "twonodes"));
  text.replace(text.find("workers_per_node: 2"), 19, "nodes: 2\n  workers_per_node: 1");
  const std::string path = t_.path + "/twonodes.yaml";
  write(path, text);
  const std::string jd = t_.path + "/j2n";
  auto args = [&](int node) {
    return std::vector<std::string>{RINGD, "--spec", path, "--job-dir", jd, "--json",
                                    "--worker-threads", "1", "--worker-bin", RING_WORKER,
                                    "--nodes", "2", "--node-rank", std::to_string(node),
                                    "--rendezvous", t_.path + "/rdv2n", "--stop-grace", "1"};
  };
  ring::test::ProcOptions po = ring::test::ucx_loopback();
  ring::test::Proc d0(args(0), t_.path + "/d0.out", t_.path + "/d0.err", po);
  ring::test::Proc d1(args(1), t_.path + "/d1.out", t_.path + "/d1.err", po);
  ASSERT_TRUE(wait_for([&] { return contains(read_text(jd + "/logs/ringd-0.log"), "decode "); },
                       180s))
      << read_text(jd + "/logs/ringd-0.log") << read_text(t_.path + "/d1.err");
  auto pid_in = [&](int node, int rank) {
    std::smatch m;
    const std::string log = read_text(jd + "/logs/ringd-" + std::to_string(node) + ".log");
    const std::regex re("worker rank " + std::to_string(rank) + " \\(local 0\\) pid (\\d+)");
    return std::regex_search(log, m, re) ? static_cast<pid_t>(std::stol(m[1])) : -1;
  };
  const pid_t victim = pid_in(1, 1), other = pid_in(0, 0);
  ASSERT_GT(victim, 0);
  ASSERT_GT(other, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const int st1 = d1.wait(300), st0 = d0.wait(300);
  ::kill(victim, SIGCONT);  // only if the test failed: ringd kills it
  const std::string log1 = read_text(jd + "/logs/ringd-1.log"),
                    log0 = read_text(jd + "/logs/ringd-0.log");
  EXPECT_TRUE(WIFEXITED(st1) && WEXITSTATUS(st1) == 1) << st1 << log1;
  EXPECT_TRUE(WIFEXITED(st0) && WEXITSTATUS(st0) == 1) << st0 << log0;
  EXPECT_TRUE(contains(log1, "rank 1 is stopped (SIGSTOP)")) << log1;
  EXPECT_TRUE(contains(log1, "failed: worker rank 1 hung")) << log1;
  EXPECT_FALSE(contains(log0, "worker rank 0 hung")) << log0;
  EXPECT_FALSE(contains(log0, "never arrived: rank 0")) << log0;
  // What node 0 saw (its check may come first: its rank waiting; or its rank died first).
  for (const std::string& l : {std::string("hang: "), std::string("failed: ")})
    if (const size_t at = log0.find(l); at != std::string::npos)
      std::printf("node 0: %s\n", log0.substr(at, log0.find('\n', at) - at).c_str());
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(victim, "ring-worker"); }, 30s));
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(other, "ring-worker"); }, 30s));
}

// Slurm signals the nodes' ringd a few milliseconds apart (preemption, requeue, scancel). Node
// 0's ringd hears first and stops its rank; node 1's rank fails on the lost peer before node 1's
// ringd hears. That exit is held (HeldDeath): the stop that follows makes it part of the stop,
// and both nodes end stopped (exit 75), not failed.
TEST_F(GenerateJob, PeerStoppedFirstIsPartOfTheStopNotAFailure) {
  std::string text = ring::test::read_file(
      spec(2, "  max_new_tokens: 1000000\n", "stopfirst"));
  text.replace(text.find("workers_per_node: 2"), 19, "nodes: 2\n  workers_per_node: 1");
  const std::string path = t_.path + "/stopfirst.yaml";
  write(path, text);
  const std::string jd = t_.path + "/jsf";
  auto args = [&](int node) {
    return std::vector<std::string>{RINGD, "--spec", path, "--job-dir", jd, "--json",
                                    "--worker-threads", "1", "--worker-bin", RING_WORKER,
                                    "--nodes", "2", "--node-rank", std::to_string(node),
                                    "--rendezvous", t_.path + "/rdvsf", "--stop-grace", "1"};
  };
  ring::test::ProcOptions po = ring::test::ucx_loopback();
  ring::test::Proc d0(args(0), t_.path + "/d0.out", t_.path + "/d0.err", po);
  ring::test::Proc d1(args(1), t_.path + "/d1.out", t_.path + "/d1.err", po);
  ASSERT_TRUE(wait_for([&] { return contains(read_text(jd + "/logs/ringd-0.log"), "decode "); },
                       180s))
      << read_text(jd + "/logs/ringd-0.log") << read_text(t_.path + "/d1.err");
  ASSERT_EQ(::kill(d0.pid, SIGTERM), 0);
  const int st0 = d0.wait(120);
  EXPECT_TRUE(WIFEXITED(st0) && WEXITSTATUS(st0) == 75) << st0;
  // Node 1's rank has failed on its stopped peer, and node 1's ringd holds that exit.
  ASSERT_TRUE(wait_for(
      [&] { return contains(read_text(jd + "/logs/ringd-1.log"), "unless a stop arrives"); }, 60s))
      << read_text(jd + "/logs/ringd-1.log");
  ASSERT_EQ(::kill(d1.pid, SIGTERM), 0);
  const int st1 = d1.wait(120);
  const std::string log1 = read_text(jd + "/logs/ringd-1.log");
  EXPECT_TRUE(WIFEXITED(st1) && WEXITSTATUS(st1) == 75) << st1 << log1;
  EXPECT_TRUE(contains(log1, "exit came with the stop: not a failure")) << log1;
  EXPECT_FALSE(contains(log1, "failed: ")) << log1;
  EXPECT_FALSE(contains(read_text(t_.path + "/d1.out"), "\"worker_died\"")) << log1;
}

// The same tight floor on a job that is slow but progressing: a 2-rank job with a long prompt
// (its prefill layers take far longer than a decode step) beside CPU burners completes, with no
// hang reported.
TEST_F(GenerateJob, SlowButProgressingJobUnderLoadIsNotFlagged) {
  std::string long_prompt;
  while (long_prompt.size() < 12000) long_prompt += "keys and values pass around the ring. ";
  write(t_.path + "/long.txt", long_prompt);
  std::string text = ring::test::read_file(spec(2, "  max_new_tokens: 200\n  hang_deadline_s: 1\n",
                                                "slow"));
  text.replace(text.find("/b.txt"), 6, "/long.txt");
  const std::string path = t_.path + "/slow.yaml";
  write(path, text);
  // Two burners per core of this machine's share: the ranks get a fraction of a core each.
  std::vector<pid_t> burners;
  for (int i = 0; i < 4; ++i) {
    const pid_t p = ::fork();
    if (p == 0) {
      for (volatile uint64_t x = 0;; ++x) {
      }
    }
    if (p > 0) burners.push_back(p);
  }
  struct Stop {
    std::vector<pid_t>& b;
    ~Stop() {
      for (pid_t p : b) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
  } stop{burners};
  const std::string job_dir = t_.path + "/jslow";
  auto r = run_job(path, job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "coordinator: completed")) << r.output;
  EXPECT_FALSE(contains(read_text(job_dir + "/logs/ringd-0.log"), "hang:"))
      << read_text(job_dir + "/logs/ringd-0.log");
  const json s = status(1);
  EXPECT_EQ(s.value("state", ""), "completed") << s.dump();
  EXPECT_TRUE(s["hang"].is_null()) << s.dump();
}

TEST_F(GenerateJob, CancelStopsIt) {
  const std::string job_dir = t_.path + "/jcancel";
  RunProc run(t_, spec(2, "  max_new_tokens: 1000000\n") + " --job-dir " + job_dir);
  ASSERT_TRUE(wait_for([&] { return contains(run.output(), "decode "); }, 180s)) << run.output();
  // A generate job reports no steps: ring-coord shows it running once its workers started.
  EXPECT_TRUE(wait_for([&] { return status(1).value("state", "") == "running"; }, 30s))
      << status(1).dump();
  auto c = ring::test::run(env(t_) + kRingctl + " cancel 1");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  const int rc = run.wait(120);
  EXPECT_EQ(rc, 8) << run.output();  // cli/exit_codes.h: cancelled through ring-coord
  EXPECT_EQ(status(1).value("state", ""), "cancelled");
  const pid_t w0 = worker_pid(job_dir, 0);
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(w0, "ring-worker"); }, 30s));
}

TEST_F(GenerateJob, CtrlCStopsItWithNothingToResume) {
  const std::string job_dir = t_.path + "/jint";
  RunProc run(t_, spec(2, "  max_new_tokens: 1000000\n") + " --job-dir " + job_dir);
  ASSERT_TRUE(wait_for([&] { return contains(run.output(), "decode "); }, 180s)) << run.output();
  run.interrupt();
  EXPECT_EQ(run.wait(120), 75) << run.output();
  EXPECT_TRUE(contains(run.output(), "stopping: ringd stops the generation")) << run.output();
  EXPECT_TRUE(contains(run.output(), "generation is not resumable: run it again")) << run.output();
  EXPECT_FALSE(contains(run.output(), "--resume")) << run.output();
  EXPECT_FALSE(fs::exists(job_dir + "/generate.out"));
  const pid_t w0 = worker_pid(job_dir, 0);
  EXPECT_TRUE(wait_for([&] { return !ring::test::alive(w0, "ring-worker"); }, 30s));
}

}  // namespace
