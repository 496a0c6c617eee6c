// `ringctl run` end to end with the real ringd and ring-worker: it starts its own ring-coord when
// none answers (and stops it at the end), or uses the one that answers; progress lines when not
// on a terminal; `ringctl status` from "another terminal" while it runs; Ctrl-C (SIGINT) stops
// it resumably (exit 75), `ringctl checkpoints JOB` lists what it wrote, and `--resume`
// continues from the checkpoint. Plus its refusals.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../common/run.h"
#include "../coordinator/coord_test_util.h"
#include "tests/common/test_proc.h"
#include "coordinator/store.h"
#include "other_user.h"

using namespace ring::coord;
using namespace ring::coord::test;
using nlohmann::json;

namespace {

const std::string kRingctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";
const std::string kSpec = std::string(RING_SOURCE_DIR) + "/tests/cli/run_tiny.yaml";

struct TempDir {
  std::string path = make_temp_dir("ctl-run");
  ~TempDir() { std::filesystem::remove_all(path); }
};

// The environment of a run: its own coordinator endpoint and state dir, UCX on loopback.
std::string env(const TempDir& t) {
  return "RING_COORD=ipc://" + t.path + "/sock/coord.sock RING_STATE_DIR=" + t.path +
         "/state UCX_TLS=self,posix UCX_NET_DEVICES=lo ";
}

// ringctl run in the background, output to a file; SIGINT like a Ctrl-C.
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
  void interrupt() { ::kill(pid_, SIGINT); }
  int wait(double timeout_s) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
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

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A coordinator in this process (coord_test_util.h) at the endpoint env() names, state in
// <t>/state, with the production heartbeat settings (ringd's heartbeats under load).
std::unique_ptr<InProcessCoordinator> coordinator_at(const TempDir& t) {
  return std::make_unique<InProcessCoordinator>([&](CoordinatorOptions& o) {
    const CoordinatorOptions defaults;
    o.state_dir = t.path + "/state";
    o.endpoints = {"ipc://" + t.path + "/sock/coord.sock"};
    o.heartbeat_interval_s = defaults.heartbeat_interval_s;
    o.heartbeat_timeout_s = defaults.heartbeat_timeout_s;
  });
}

}  // namespace

TEST(RingctlRun, TrainsWithItsOwnCoordinator) {
  TempDir t;
  std::string job_dir = t.path + "/job";
  auto r = ring::test::run(env(t) + kRingctl + " run " + kSpec + " --steps 4 --job-dir " + job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output << read_text(job_dir + "/logs/ringd-run.stderr");
  EXPECT_TRUE(contains(r.output, "ring-coord started at ipc://" + t.path + "/sock/coord.sock"))
      << r.output;
  // Not a terminal: one plain line per step, no escape sequences.
  for (int s = 1; s <= 4; ++s)
    EXPECT_TRUE(contains(r.output, "step " + std::to_string(s) + "/4  loss ")) << r.output;
  EXPECT_FALSE(contains(r.output, "\033[")) << r.output;
  EXPECT_TRUE(contains(r.output, "job 1 (run-tiny) completed after")) << r.output;
  EXPECT_TRUE(contains(r.output, "steps 1-4 of 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "coordinator: completed")) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoints: " + job_dir + "/checkpoints")) << r.output;

  // The coordinator it started is gone; what it recorded stays in its state dir, where status,
  // events, logs and steps still find it (read-only, with a note).
  auto st = ring::test::run(env(t) + kRingctl + " status 1 --timeout 0.5");
  EXPECT_EQ(st.exit_code, 0) << st.output;
  EXPECT_TRUE(contains(st.output, "completed")) << st.output;
  EXPECT_TRUE(contains(
      st.output, "answering from the state it left in " + t.path + "/state/coord.db (read-only)"))
      << st.output;
  auto ev = ring::test::run(env(t) + kRingctl + " events 1 --json");
  EXPECT_EQ(ev.exit_code, 0) << ev.output;
  EXPECT_TRUE(contains(ev.output, "\"kind\":\"job_completed\"")) << ev.output;
  auto logs = ring::test::run(env(t) + kRingctl + " logs 1 -n 5");
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_TRUE(contains(logs.output, "[worker 0] ")) << logs.output;
  // The exact losses: `steps --json` gives steps.jsonl's records, the coordinator's records the
  // same loss of every step.
  auto file_steps = ring::test::run(env(t) + kRingctl + " steps 1 --json");
  auto coord_steps = ring::test::run(env(t) + kRingctl + " steps 1 --json --source coordinator");
  ASSERT_EQ(file_steps.exit_code, 0) << file_steps.output;
  ASSERT_EQ(coord_steps.exit_code, 0) << coord_steps.output;
  std::istringstream fl(file_steps.output), cl(coord_steps.output);
  std::map<int64_t, double> file_loss, coord_loss;
  // (stdout and stderr together: the records and the note that no coordinator answered)
  for (std::string l; std::getline(fl, l);) {
    if (l.empty() || l[0] != '{') continue;
    auto j = json::parse(l);
    file_loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    EXPECT_TRUE(j.contains("lr") && j.contains("grad_norm")) << l;
  }
  for (std::string l; std::getline(cl, l);) {
    if (l.empty() || l[0] != '{') continue;
    auto j = json::parse(l);
    coord_loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  EXPECT_EQ(file_loss.size(), 4u) << file_steps.output;
  EXPECT_EQ(file_loss, coord_loss) << file_steps.output << coord_steps.output;
  Store store(t.path + "/state/coord.db", {false, 0});
  auto job = store.job(1);
  ASSERT_TRUE(job);
  EXPECT_EQ(to_string(job->state), std::string("completed"));
  EXPECT_EQ(job->last_step, 4);
  EXPECT_EQ(job->job_dir, job_dir);
  EXPECT_EQ(job->checkpoint_dir, job_dir + "/checkpoints");
  // The ring order over the job's one node (ringd's node name).
  auto order = json::parse(job->ring_order);
  ASSERT_EQ(order.size(), 1u) << job->ring_order;
  EXPECT_FALSE(order[0].get<std::string>().empty());
  // ringd's files are where the job dir says.
  EXPECT_TRUE(std::filesystem::exists(job_dir + "/steps.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(job_dir + "/logs/worker-1.log"));
}

TEST(RingctlRun, StatusWhileRunningCtrlCAndResume) {
  TempDir t;
  std::string job_dir = t.path + "/job";
  // A coordinator that is already there is used (and left running).
  auto coord = coordinator_at(t);
  const std::string ep = "ipc://" + t.path + "/sock/coord.sock";

  {
    RunProc run(t, kSpec + " --steps 100000 --job-dir " + job_dir);
    ASSERT_TRUE(wait_for([&] { return contains(run.output(), "step 3/100000"); }, 120s))
        << run.output();
    EXPECT_TRUE(contains(run.output(), "using the coordinator at " + ep)) << run.output();
    // From another terminal.
    auto s = ring::test::run(env(t) + kRingctl + " status 1 --json");
    ASSERT_EQ(s.exit_code, 0) << s.output;
    auto j = json::parse(s.output);
    EXPECT_EQ(j["state"], "running");
    EXPECT_GE(j["step"].get<int64_t>(), 2);
    EXPECT_EQ(j["job_dir"], job_dir);
    EXPECT_EQ(j["total_steps"], 100000);  // --steps overrides train.steps in the coordinator too
    // Ctrl-C: ringd writes a checkpoint and stops; exit 75.
    run.interrupt();
    int rc = run.wait(60);
    EXPECT_EQ(rc, 75) << run.output();
    EXPECT_TRUE(contains(run.output(), "stopping: ringd writes a checkpoint")) << run.output();
    EXPECT_TRUE(contains(run.output(), "stopped (resumable)")) << run.output();
    EXPECT_TRUE(contains(run.output(), "resume with: ringctl run")) << run.output();
    // Issue 31.13: the printed command keeps --steps.
    EXPECT_TRUE(contains(run.output(), " --resume --job-dir " + job_dir + " --steps 100000"))
        << run.output();
    // Issue 31.13: stopped and resumable, not "cancelled".
    EXPECT_TRUE(contains(run.output(), "coordinator: stopped (stopped by a stop signal at step"))
        << run.output();
  }
  // The stopped job is not left live in the coordinator, and not called cancelled.
  Client c(ClientOptions{ep, 3000ms, "", "", ""});
  EXPECT_TRUE(wait_for([&] { return c.status(1).state == "stopped"; }, 15s))
      << c.status(1).state << ": " << c.status(1).state_reason;

  // `ringctl checkpoints JOB` finds the job's checkpoint dir through the coordinator.
  auto ck = ring::test::run(env(t) + kRingctl + " checkpoints 1 --json");
  ASSERT_EQ(ck.exit_code, 0) << ck.output;
  auto cks = json::parse(ck.output);
  ASSERT_TRUE(cks.is_array()) << ck.output;
  EXPECT_GE(cks.size(), 1u) << ck.output;
  // --resume continues after the checkpoint the stop wrote.
  std::ifstream steps(job_dir + "/steps.jsonl");
  int64_t last = 0;
  for (std::string l; std::getline(steps, l);)
    last = std::max<int64_t>(last, json::parse(l).value("step", int64_t{0}));
  ASSERT_GT(last, 0);
  auto r = ring::test::run(env(t) + kRingctl + " run " + kSpec + " --resume --steps " +
                           std::to_string(last + 2) + " --job-dir " + job_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      contains(r.output, "steps " + std::to_string(last + 1) + "-" + std::to_string(last + 2)))
      << r.output;
  EXPECT_EQ(c.status(2).state, "completed");
  // Issue 31.15: the finished runs' nodes are not listed as lost; --all shows them retired.
  EXPECT_TRUE(wait_for([&] {
    auto n = ring::test::run(env(t) + kRingctl + " nodes");
    return n.exit_code == 0 && !contains(n.output, "lost") &&
           contains(n.output, "retired node(s)");
  }, 60s)) << ring::test::run(env(t) + kRingctl + " nodes").output;
  auto all = ring::test::run(env(t) + kRingctl + " nodes --all --json");
  ASSERT_EQ(all.exit_code, 0) << all.output;
  for (const auto& n : json::parse(all.output)) EXPECT_NE(n["state"], "lost") << n.dump();
}

// --set reaches ringd and the coordinator's record (one spec, the overrides listed in it), and a
// run whose job is cancelled from another terminal exits 8 (cancelled), not plan's 3 (no fit).
TEST(RingctlRun, OverridesAreRecordedAndCancelledIsItsOwnCode) {
  TempDir t;
  std::string job_dir = t.path + "/job";
  auto coord = coordinator_at(t);
  const std::string ep = "ipc://" + t.path + "/sock/coord.sock";
  {
    RunProc run(t, kSpec + " --set train.steps=100000 --set checkpoint.every_steps=1000 " +
                       "--job-dir " + job_dir);
    ASSERT_TRUE(wait_for([&] { return contains(run.output(), "step 2/100000"); }, 120s))
        << run.output();
    // The spec ringd runs is the recorded one, private, with the overrides listed.
    std::string copy = read_text(job_dir + "/spec-1.yaml");
    EXPECT_TRUE(contains(copy, "#   --set train.steps=100000\n")) << copy;
    EXPECT_TRUE(contains(copy, "#   --set checkpoint.every_steps=1000\n")) << copy;
    struct stat st {};
    ASSERT_EQ(::stat((job_dir + "/spec-1.yaml").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    Client c(ClientOptions{ep, 3000ms, "", "", ""});
    EXPECT_EQ(c.status(1).total_steps, 100000);
    auto r = ring::test::run(env(t) + kRingctl + " cancel 1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    int rc = run.wait(60);
    EXPECT_EQ(rc, 8) << run.output();
    EXPECT_TRUE(contains(run.output(), "cancelled (ringctl cancel)")) << run.output();
    // Issue 31.15: a cancel is no failure: ringd's log is not shown as if it were.
    EXPECT_FALSE(contains(run.output(), "last lines of ringd's log")) << run.output();
  }
  coord->stop();  // its database, closed
  Store store(t.path + "/state/coord.db", {false, 0});
  auto job = store.job(1);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->spec, read_text(job_dir + "/spec-1.yaml"));
}

// Issue 31.13, 14, 15: a start that fails for good ends the job failed with the cause (it
// stayed "cancelling (cancelled by root)" with no failed event); data that is not here, a job
// the plan says does not fit, and a missing spec are refused before anything starts, each with
// the exit code of the table (1, 3, 1).
TEST(RingctlRun, FailedStartsAndRefusalsEndInTheirOwnStates) {
  TempDir t;
  auto coord = coordinator_at(t);
  const std::string ep = "ipc://" + t.path + "/sock/coord.sock";
  auto r = ring::test::run("timeout 300 env " + env(t) + kRingctl + " run " + kSpec +
                           " --set model.init_from=" + t.path + "/no-such-checkpoint --job-dir " +
                           t.path + "/job");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  Client c(ClientOptions{ep, 3000ms, "", "", ""});
  EXPECT_TRUE(wait_for([&] { return c.status(1).state == "failed"; }, 15s))
      << c.status(1).state << ": " << c.status(1).state_reason;
  EXPECT_TRUE(contains(c.status(1).state_reason, "cannot initialise from model.init_from"))
      << c.status(1).state_reason;
  bool failed_event = false;
  for (const auto& e : c.events(1, 0, 1000)) failed_event |= e.kind == "job_failed";
  EXPECT_TRUE(failed_event);
  EXPECT_TRUE(contains(r.output, "coordinator: failed (ringd on ")) << r.output;

  r = ring::test::run(env(t) + kRingctl + " run " + kSpec + " --set data.paths=[" + t.path +
                      "/no-such-data] --job-dir " + t.path + "/job2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "data.paths[0] " + t.path + "/no-such-data: does not exist"))
      << r.output;
  auto v = ring::test::run(env(t) + kRingctl + " validate " + kSpec + " --set data.paths=[" +
                           t.path + "/no-such-data]");
  EXPECT_EQ(v.exit_code, 0) << v.output;  // a warning: the cluster's nodes may have it
  EXPECT_TRUE(contains(v.output, "does not exist; every node must have it")) << v.output;

  r = ring::test::run(env(t) + kRingctl + " run " + kSpec +
                      " --set data.seq_len=4194304 --job-dir " + t.path + "/job3");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "does not fit this machine")) << r.output;
  EXPECT_TRUE(contains(r.output, "--force runs it anyway")) << r.output;

  r = ring::test::run(env(t) + kRingctl + " run " + t.path + "/no-such-spec.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no-such-spec.yaml")) << r.output;
  // Only the init_from run reached the coordinator.
  EXPECT_THROW(c.status(2), RemoteError);
}

TEST(RingctlRun, RefusesBadSpecMissingRingdAndBadSteps) {
  TempDir t;
  std::string bad = t.path + "/bad.yaml";
  std::ofstream(bad) << "job:\n  name: x\nmodel:\n  layers: -1\n";
  auto r = ring::test::run(env(t) + kRingctl + " run " + bad);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "model.layers")) << r.output;
  EXPECT_TRUE(contains(r.output, "fix them before running")) << r.output;

  r = ring::test::run(env(t) + "RING_RINGD=" + t.path + "/no-ringd " + kRingctl + " run " + kSpec +
                      " --job-dir " + t.path + "/job");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "ringd not found")) << r.output;
  EXPECT_TRUE(contains(r.output, "RING_RINGD")) << r.output;

  r = ring::test::run(env(t) + kRingctl + " run " + kSpec + " --job-dir " + t.path +
                      "/job --coord ipc://" + t.path + "/sock/coord.sock --steps 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // --steps must be positive
}

// The job directory is checked before anything starts (no coordinator, no ringd): another
// user's directory, and, for nobody, one whose logs/ it cannot write (what made ringd restart
// for 98 s and end in "no step finished"), each refused at once with the directory named. Specs
// ringd would refuse are refused too: more than one node, offload none.
TEST(RingctlRun, JobDirAndSpecAreCheckedBeforeAnythingStarts) {
  TempDir t;
  ::chmod(t.path.c_str(), 0755);
  // Two nodes: `run` is one machine.
  std::string two = t.path + "/two.yaml";
  std::string text = read_text(kSpec);
  text.replace(text.find("  nodes: 1"), 10, "  nodes: 2");
  text.replace(text.find("  workers_per_node: 2"), 21, "  workers_per_node: 1");
  std::ofstream(two) << text;
  auto r = ring::test::run(env(t) + kRingctl + " run " + two + " --job-dir " + t.path + "/job");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "resources.nodes is 2: `ringctl run` trains on this machine"))
      << r.output;
  // offload none: ring-worker alone runs it, ringd does not.
  std::string none = t.path + "/none.yaml";
  text = read_text(kSpec);
  text.replace(text.find("  offload: cpu"), 14, "  offload: none");
  std::ofstream(none) << text;
  r = ring::test::run(env(t) + kRingctl + " run " + none + " --job-dir " + t.path + "/job");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "optimizer.offload: offload none is not run by ringd"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "ring-coord started")) << r.output;

  if (geteuid() != 0) GTEST_SKIP() << "the rest needs root: directories of another user (nobody)";
  std::string theirs = t.path + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  r = ring::test::run("timeout 120 env " + env(t) + kRingctl + " run " + kSpec +
                           " --steps 1 --job-dir " + theirs);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "job directory " + theirs +
                                     " is owned by nobody (uid 65534), "
                                     "not by you"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "ring-coord started")) << r.output;

  // nobody, with its own job directory whose logs/ is read-only.
  ring::test::OtherUserBin bin({kRingctl});
  std::string spec = t.path + "/spec.yaml";
  std::filesystem::copy_file(kSpec, spec);
  ::chmod(spec.c_str(), 0644);
  std::string jd = t.path + "/nobodys";
  ASSERT_EQ(::mkdir(jd.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((jd + "/logs").c_str(), 0500), 0);
  ASSERT_EQ(::chown(jd.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chown((jd + "/logs").c_str(), 65534, 65534), 0);
  auto start = std::chrono::steady_clock::now();
  r = ring::test::run("timeout 120 " +
                      ring::test::as_nobody("env RING_COORD=ipc://" + t.path + "/sock/coord.sock " +
                                            bin.path("ringctl") + " run " + spec +
                                            " --steps 1 --job-dir " + jd));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot create files in " + jd + "/logs: Permission denied"))
      << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s) << r.output;
}

// When ringd fails, ringctl run prints the last lines of ringd's own log (it logs there, not to
// the terminal, in --json mode): the cause is on the screen, not only in a file. -v streams
// those lines as they come. The workers here are /bin/false: they die at once, and with
// restart.max_restarts 0 ringd gives up.
TEST(RingctlRun, RingdFailureShowsItsLogAndVerboseStreamsIt) {
  TempDir t;
  std::string job_dir = t.path + "/job";
  auto r = ring::test::run("timeout 300 env RING_WORKER_BIN=/bin/false " + env(t) + kRingctl +
                           " run " + kSpec + " --steps 2 --job-dir " + job_dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "last lines of ringd's log (" + job_dir + "/logs/ringd-0.log):"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "  | ")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with status 1")) << r.output;

  r = ring::test::run("timeout 300 env RING_WORKER_BIN=/bin/false " + env(t) + kRingctl +
                      " run -v " + kSpec + " --steps 2 --job-dir " + job_dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  // ringd's first log line ("job run-tiny | node 0 of 1 | ...") and the failure, as they came.
  EXPECT_TRUE(contains(r.output, "ringd: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "job run-tiny | node 0 of 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with status 1")) << r.output;
}

// The processes ringctl run starts inherit no descriptor of it above 2 (here fd 777, opened by
// the shell without close-on-exec, as a library's socket may be): ringd, and through it the
// workers, start with only stdin/stdout/stderr and what they open themselves. Before, ringd got
// every descriptor of ringctl. The fake worker lists ringd's descriptors and its own, then fails.
TEST(RingctlRun, SpawnedProcessesInheritNoDescriptorAbove2) {
  TempDir t;
  const std::string worker = t.path + "/list-fds";
  {
    std::ofstream w(worker);
    w << "#!/bin/sh\nls /proc/$PPID/fd > " << t.path << "/ringd-fds.$$\n"
      << "ls /proc/self/fd > " << t.path << "/worker-fds.$$\nexit 1\n";
  }
  ASSERT_EQ(::chmod(worker.c_str(), 0755), 0);
  auto r = ring::test::run("timeout 300 bash -c 'exec env RING_WORKER_BIN=" + worker + " " +
                           env(t) + kRingctl + " run " + kSpec + " --steps 2 --job-dir " +
                           t.path + "/job 777</dev/null'");
  EXPECT_NE(r.exit_code, 0) << r.output;  // the workers fail on purpose
  int ringd_lists = 0, worker_lists = 0;
  for (const auto& e : std::filesystem::directory_iterator(t.path)) {
    const std::string name = e.path().filename().string();
    const bool of_ringd = name.rfind("ringd-fds.", 0) == 0;
    if (!of_ringd && name.rfind("worker-fds.", 0) != 0) continue;
    (of_ringd ? ringd_lists : worker_lists)++;
    std::ifstream in(e.path());
    for (std::string fd; std::getline(in, fd);) EXPECT_NE(fd, "777") << name;
  }
  EXPECT_GT(ringd_lists, 0) << r.output;
  EXPECT_GT(worker_lists, 0) << r.output;
}
