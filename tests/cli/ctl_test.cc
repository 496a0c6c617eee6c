// ringctl's coordinator subcommands against a real ring-coord process (temp state dir, private
// ipc socket), with simulated daemons speaking the real protocol: status (table, --json,
// --follow), events, logs, cancel, restart, nodes; the error paths (no coordinator, unknown job,
// another user's job, bad arguments) and their exit codes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include <nlohmann/json.hpp>

#include "../common/run.h"
#include "../coordinator/coord_test_util.h"
#include "coordinator/job_state.h"
#include "tests/common/test_proc.h"
#include "other_user.h"

using namespace ring::coord;
using namespace ring::coord::test;
using nlohmann::json;

namespace {

const std::string kRingctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";
const std::string kCoordBin = std::string(RING_BINARY_DIR) + "/coordinator/ring-coord";

// ring-coord as a child process on <dir>/sock/coord.sock, state in <dir>/state.
class Coord {
 public:
  explicit Coord(bool shared = false) {
    dir_ = make_temp_dir("ctl");
    ::chmod(dir_.c_str(), 0711);
    ep_ = "ipc://" + dir_ + "/sock/coord.sock";
    std::vector<std::string> args{
        kCoordBin, "--state-dir", dir_ + "/state",       "--endpoint", ep_,
        "--sync",  "normal",      "--heartbeat-timeout", "30"};
    if (shared) args.insert(args.end(), {"--socket-mode", "shared"});
    pid_ = ring::test::start_logged(args, dir_ + "/coord.log");
    EXPECT_TRUE(wait_for(
        [&] { return read_text(dir_ + "/coord.log").find("state in") != std::string::npos; }, 10s))
        << read_text(dir_ + "/coord.log");
  }
  ~Coord() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      waitpid(pid_, &st, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  const std::string& ep() const { return ep_; }
  const std::string& dir() const { return dir_; }
  Client client() { return Client(ClientOptions{ep_, 3000ms, "", "", ""}); }
  // ringctl SUBCOMMAND... against this coordinator.
  ring::test::RunResult ctl(const std::string& args) const {
    return ring::test::run("RING_COORD=" + ep_ + " " + kRingctl + " " + args);
  }

 private:
  std::string dir_, ep_;
  pid_t pid_ = -1;
};

json parse_json(const std::string& s) {
  auto j = json::parse(s, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << s;
  return j;
}

std::vector<json> parse_lines(const std::string& s) {
  std::vector<json> out;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l))
    if (!l.empty()) out.push_back(parse_json(l));
  return out;
}

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// A job driven by one simulated daemon up to `steps` steps with a checkpoint at step 2.
struct RunningJob {
  int64_t id;
  std::unique_ptr<SimDaemon> d;
};
RunningJob start_job(Coord& c, const std::string& job_dir, int steps) {
  auto client = c.client();
  RunningJob r;
  // Restart backoff 30 s: a failed attempt stays `restarting` while the test looks.
  r.id = client.submit(test_spec(1, 2, 30, 60), "", job_dir).job;
  r.d = std::make_unique<SimDaemon>(c.ep(), "node-a");
  r.d->register_jobs({{r.id, 0, 0}});
  for (int s = 1; s <= steps; ++s) r.d->step(r.id, 1, s, 3.0 - 0.25 * s);
  r.d->checkpoint(r.id, 1, 2);
  EXPECT_TRUE(wait_for([&] {
    auto st = client.status(r.id);
    return st.step == steps && st.last_checkpoint_step == 2;
  }));
  return r;
}

}  // namespace

TEST(Ringctl, NoCoordinatorSaysWhatToDo) {
  std::string dir = make_temp_dir("ctl-none");
  auto r = ring::test::run(kRingctl + " status --coord ipc://" + dir + "/none.sock");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(contains(r.output, "no coordinator at ipc://" + dir + "/none.sock")) << r.output;
  EXPECT_TRUE(contains(r.output, "ring-coord")) << r.output;
  EXPECT_TRUE(contains(r.output, "ringctl run")) << r.output;
  // A socket file nobody listens on (a coordinator killed with -9): a bounded wait, same code.
  std::string stale = dir + "/stale.sock";
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, stale.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::close(fd);
  }
  for (const char* cmd : {"status", "events 1", "nodes", "cancel 1", "logs 1"}) {
    r = ring::test::run(kRingctl + " " + cmd + " --timeout 0.3 --coord ipc://" + stale);
    EXPECT_EQ(r.exit_code, 4) << cmd << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "ring-coord")) << r.output;
  }
  // tcp without keys says which flag is missing.
  r = ring::test::run(kRingctl + " status --coord tcp://127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(contains(r.output, "--server-key")) << r.output;
  std::filesystem::remove_all(dir);
}

TEST(Ringctl, StatusTableJsonAndDetails) {
  Coord c;
  auto r = c.ctl("status");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "no jobs")) << r.output;
  EXPECT_EQ(parse_json(c.ctl("status --json").output), json::array());

  std::string job_dir = c.dir() + "/job";
  auto job = start_job(c, job_dir, 5);
  r = c.ctl("status");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Not a terminal: no colour escapes.
  EXPECT_FALSE(contains(r.output, "\033[")) << r.output;
  std::stringstream ss(r.output);
  std::string header, row;
  std::getline(ss, header);
  std::getline(ss, row);
  for (const char* col : {"JOBID", "NAME", "USER", "STATE", "STEP/TOTAL", "LOSS", "TOK/S",
                          "ATTEMPT", "NODES", "AGE", "CKPT"})
    EXPECT_TRUE(contains(header, col)) << header;
  EXPECT_TRUE(contains(row, "tiny")) << row;
  EXPECT_TRUE(contains(row, "running")) << row;
  EXPECT_TRUE(contains(row, "5/200")) << row;
  EXPECT_TRUE(contains(row, "1.7500")) << row;  // 3.0 - 0.25 * 5
  EXPECT_TRUE(contains(row, "root")) << row;

  auto all = parse_json(c.ctl("status --json").output);
  ASSERT_TRUE(all.is_array());
  ASSERT_EQ(all.size(), 1u);
  auto one = parse_json(c.ctl("status " + std::to_string(job.id) + " --json").output);
  // One job's object adds its observability findings (none here).
  EXPECT_TRUE(one["straggler"].is_null()) << one;
  EXPECT_TRUE(one["hang"].is_null()) << one;
  EXPECT_EQ(one["stragglers"], nlohmann::json::array()) << one;  // every finding, none here
  one.erase("straggler");
  one.erase("hang");
  one.erase("stragglers");
  EXPECT_EQ(one, all[0]);
  EXPECT_EQ(one["job"], job.id);
  EXPECT_EQ(one["state"], "running");
  EXPECT_EQ(one["step"], 5);
  EXPECT_EQ(one["total_steps"], 200);
  EXPECT_DOUBLE_EQ(one["loss"].get<double>(), 1.75);
  EXPECT_EQ(one["last_checkpoint_step"], 2);
  EXPECT_EQ(one["job_dir"], job_dir);
  EXPECT_EQ(one["checkpoint_dir"], job_dir + "/checkpoints");  // tiny.yaml: relative dir
  EXPECT_EQ(one["ring_order"], json::array({"node-a"}));
  EXPECT_EQ(one["nodes"], json::array({"node-a"}));

  r = c.ctl("status " + std::to_string(job.id));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "ring order:   node-a")) << r.output;
  EXPECT_TRUE(contains(r.output, "job dir:      " + job_dir)) << r.output;
  EXPECT_TRUE(contains(r.output, "latest complete: step 2")) << r.output;

  // --follow on a job ends when the job does; not on a terminal it prints changes only.
  // The follower's first line (step 5) must be out before the job moves on: wait for it (a
  // loaded machine can take seconds to start ringctl).
  const std::string follow_out = c.dir() + "/follow.out";
  auto follow = std::async(std::launch::async, [&] {
    return c.ctl("status " + std::to_string(job.id) + " --follow --json --interval 0.1 | tee " +
                 follow_out);
  });
  for (int i = 0; i < 600; ++i) {
    std::ifstream f(follow_out);
    std::string first;
    if (std::getline(f, first) && !first.empty()) break;
    std::this_thread::sleep_for(50ms);
  }
  job.d->step(job.id, 1, 6, 1.5);
  job.d->simple(proto::EventKind::kJobCompleted, job.id, 1, 6);
  ASSERT_EQ(follow.wait_for(30s), std::future_status::ready);
  auto lines = parse_lines(follow.get().output);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.front()["step"], 5);
  EXPECT_EQ(lines.back()["state"], "completed");
  EXPECT_EQ(lines.back()["step"], 6);
}

TEST(Ringctl, UnknownJobAndBadArguments) {
  Coord c;
  for (const char* cmd : {"status 99", "events 99", "cancel 99", "restart 99", "logs 99"}) {
    auto r = c.ctl(cmd);
    EXPECT_EQ(r.exit_code, 5) << cmd << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "job 99 does not exist")) << cmd << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "ringctl status")) << r.output;
  }
  auto r = c.ctl("status seven");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "'seven' is not a job id")) << r.output;
  r = c.ctl("events");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = c.ctl("restart 1 --from -3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = c.ctl("status --bogus");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// The observability findings of `status JOB` (docs/observability.md): the current straggler
// from `straggler` / `straggler_cleared` events, the latest hang with the reports of one attempt
// and step merged (each node reports what it sees).
TEST(Ringctl, StatusShowsStragglerAndMergedHang) {
  Coord c;
  auto job = start_job(c, c.dir() + "/job", 5);
  auto client = c.client();
  proto::Event st;
  st.kind = proto::EventKind::kStraggler;
  st.job = job.id;
  st.attempt = 1;
  st.rank = 2;
  st.step = 5;
  st.steps = 3;
  st.behind_s = 0.25;
  st.message = "rank 2 is a straggler";
  job.d->event(st);
  for (int64_t missing : {1, 3}) {
    proto::Event h;
    h.kind = proto::EventKind::kHang;
    h.job = job.id;
    h.attempt = 1;
    h.step = 6;
    h.deadline_s = 8;
    h.missing = {missing};
    h.waiting = {
        {missing - 1, "ring recv from rank " + std::to_string(missing) + ", layer 0 hop 0"}};
    job.d->event(h);
  }
  ASSERT_TRUE(wait_for([&] { return client.events(job.id, 0, 1000).size() >= 3; }));
  ASSERT_TRUE(wait_for([&] {
    int n = 0;
    for (const auto& e : client.events(job.id, 0, 1000)) n += e.kind == "hang";
    return n == 2;
  }));
  auto r = c.ctl("status " + std::to_string(job.id) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json one = parse_json(r.output);
  ASSERT_TRUE(one["straggler"].is_object()) << one;
  EXPECT_EQ(one["straggler"]["rank"], 2);
  EXPECT_EQ(one["straggler"]["node"], "node-a");
  EXPECT_EQ(one["straggler"]["steps"], 3);
  ASSERT_TRUE(one["hang"].is_object()) << one;
  EXPECT_EQ(one["hang"]["step"], 6);
  EXPECT_EQ(one["hang"]["missing"], json::array({1, 3}));
  EXPECT_EQ(one["hang"]["waiting"].size(), 2u);
  r = c.ctl("status " + std::to_string(job.id));
  EXPECT_TRUE(contains(r.output, "straggler:    rank 2 on node-a (0.250 s behind per step"))
      << r.output;
  EXPECT_TRUE(contains(
      r.output, "hang:         attempt 1 step 6 (deadline 8 s): never arrived: 1, 3"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0 waits: ring recv from rank 1, layer 0 hop 0")) << r.output;
  // Cleared: no straggler any more; the hang stays (it happened).
  proto::Event cl;
  cl.kind = proto::EventKind::kStragglerCleared;
  cl.job = job.id;
  cl.attempt = 1;
  cl.rank = 2;
  job.d->event(cl);
  ASSERT_TRUE(wait_for(
      [&] { return client.events(job.id, 0, 1000).back().kind == "straggler_cleared"; }));
  one = parse_json(c.ctl("status " + std::to_string(job.id) + " --json").output);
  EXPECT_TRUE(one["straggler"].is_null()) << one;
  EXPECT_TRUE(one["hang"].is_object()) << one;
  EXPECT_TRUE(contains(c.ctl("status " + std::to_string(job.id)).output, "straggler:    none"));
}

TEST(Ringctl, EventsTellTheStory) {
  Coord c;
  auto job = start_job(c, c.dir() + "/job", 3);
  proto::Event died;
  died.kind = proto::EventKind::kWorkerDied;
  died.job = job.id;
  died.attempt = 1;
  died.rank = 2;
  died.signal = 9;
  died.last_log = {"step 3 | loss 2.25", "killed"};
  job.d->event(died);
  auto client = c.client();
  ASSERT_TRUE(wait_for([&] { return client.status(job.id).state == "restarting"; }));

  auto r = c.ctl("events " + std::to_string(job.id) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ev = parse_lines(r.output);
  std::vector<std::string> kinds;
  for (const auto& e : ev) kinds.push_back(e["kind"]);
  for (const char* k : {"submitted", "state", "ring_order", "checkpoint_saved", "worker_died"})
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), k), kinds.end()) << k;
  auto d =
      std::find_if(ev.begin(), ev.end(), [](const json& e) { return e["kind"] == "worker_died"; });
  EXPECT_EQ((*d)["data"]["signal"], 9);
  EXPECT_EQ((*d)["data"]["rank"], 2);
  EXPECT_EQ((*d)["node"], "node-a");
  // Ids grow; --after skips what was seen.
  for (size_t i = 1; i < ev.size(); ++i) EXPECT_GT(ev[i]["id"], ev[i - 1]["id"]);
  auto later = parse_lines(
      c.ctl("events " + std::to_string(job.id) + " --json --after " + ev[1]["id"].dump()).output);
  EXPECT_EQ(later.size(), ev.size() - 2);

  r = c.ctl("events " + std::to_string(job.id));
  EXPECT_TRUE(contains(r.output, "worker_died  rank=2 signal=9")) << r.output;
  EXPECT_TRUE(contains(r.output, "    | killed")) << r.output;

  // --follow ends once the job is final.
  auto cancelled = client.cancel(job.id).state;
  EXPECT_TRUE(cancelled == "cancelling" || cancelled == "cancelled") << cancelled;
  auto follow = std::async(std::launch::async, [&] {
    return c.ctl("events " + std::to_string(job.id) + " --follow --json");
  });
  std::this_thread::sleep_for(200ms);
  job.d->simple(proto::EventKind::kJobStopped, job.id, 1);
  ASSERT_EQ(follow.wait_for(30s), std::future_status::ready);
  auto all = parse_lines(follow.get().output);
  EXPECT_EQ(all.back()["kind"], "state");
  EXPECT_EQ(all.back()["data"]["to"], "cancelled") << all.back().dump();
}

TEST(Ringctl, LogsFromTheJobDir) {
  Coord c;
  std::string job_dir = c.dir() + "/job";
  auto job = start_job(c, job_dir, 1);
  std::string id = std::to_string(job.id);
  auto r = c.ctl("logs " + id);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "does not exist on this host")) << r.output;

  std::filesystem::create_directories(job_dir + "/logs");
  std::ofstream(job_dir + "/logs/worker-0.log") << "=== attempt 1 ===\nr0 a\nr0 b\n";
  std::ofstream(job_dir + "/logs/worker-1.log") << "=== attempt 1 ===\nr1 a\n";
  std::ofstream(job_dir + "/logs/worker-10.log") << "r10 a\n";
  std::ofstream(job_dir + "/logs/ringd-0.log") << "ringd started\n";
  r = c.ctl("logs " + id);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "[worker 0] === attempt 1 ===\n[worker 0] r0 a\n[worker 0] r0 b\n"
            "[worker 1] === attempt 1 ===\n[worker 1] r1 a\n[worker 10] r10 a\n");
  r = c.ctl("logs " + id + " --worker 0 -n 1");
  EXPECT_EQ(r.output, "r0 b\n");
  r = c.ctl("logs " + id + " --ringd");
  EXPECT_EQ(r.output, "[ringd 0] ringd started\n");
  r = c.ctl("logs " + id + " --worker 7");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "workers with logs: 0, 1, 10")) << r.output;
  // A FIFO where a log would be is not read (it would block ringctl): left out, no hang.
  ASSERT_EQ(mkfifo((job_dir + "/logs/worker-2.log").c_str(), 0600), 0);
  r = ring::test::run("timeout 60 env RING_COORD=" + c.ep() + " " + kRingctl + " logs " + id);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "[worker 0] === attempt 1 ===\n[worker 0] r0 a\n[worker 0] r0 b\n"
            "[worker 1] === attempt 1 ===\n[worker 1] r1 a\n[worker 10] r10 a\n");

  // --follow prints what is appended and ends with the job.
  auto follow = std::async(std::launch::async, [&] { return c.ctl("logs " + id + " -w 1 -f"); });
  std::this_thread::sleep_for(500ms);
  std::ofstream(job_dir + "/logs/worker-1.log", std::ios::app) << "r1 late\n";
  std::this_thread::sleep_for(500ms);
  job.d->simple(proto::EventKind::kJobCompleted, job.id, 1, 1);
  ASSERT_EQ(follow.wait_for(30s), std::future_status::ready);
  r = follow.get();
  EXPECT_EQ(r.output, "=== attempt 1 ===\nr1 a\nr1 late\n");
}

TEST(Ringctl, CancelRestartNodes) {
  Coord c;
  auto job = start_job(c, c.dir() + "/job", 3);
  std::string id = std::to_string(job.id);
  auto client = c.client();

  // checkpoint: every node of the running job is told to checkpoint now (docs/checkpoints.md).
  auto r = c.ctl("checkpoint " + id);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "job " + id + ": running (checkpoint_now sent to 1 node(s))"))
      << r.output;
  auto now = job.d->expect_command(proto::CommandKind::kCheckpointNow, job.id, 5s);
  EXPECT_EQ(now.attempt, 1);

  r = c.ctl("restart " + id + " --from 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = parse_json(r.output);
  EXPECT_EQ(j["state"], "restarting");
  EXPECT_TRUE(contains(j["message"], "from step 2")) << r.output;
  // The next attempt starts from step 2: the daemon is told to roll back.
  auto cmd = job.d->expect_command(proto::CommandKind::kRollBack, job.id, 5s);
  EXPECT_EQ(cmd.step, 2);
  EXPECT_EQ(cmd.attempt, 2);

  auto n = parse_json(c.ctl("nodes --json").output);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0]["name"], "node-a");
  EXPECT_EQ(n[0]["state"], "up");
  EXPECT_EQ(n[0]["jobs"], json::array({job.id}));
  r = c.ctl("nodes");
  EXPECT_TRUE(contains(r.output, "NODE")) << r.output;
  EXPECT_TRUE(contains(r.output, "node-a")) << r.output;

  r = c.ctl("cancel " + id);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "job " + id + ": cancelling (cancelled by root)")) << r.output;
  job.d->simple(proto::EventKind::kJobStopped, job.id, 2);
  ASSERT_TRUE(wait_for([&] { return client.status(job.id).state == "cancelled"; }));
  // A final job cannot be cancelled again, nor checkpointed: exit 7 with the rule.
  r = c.ctl("cancel " + id);
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_TRUE(contains(r.output, "cancelled")) << r.output;
  r = c.ctl("checkpoint " + id);
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_TRUE(contains(r.output, "only a running job can checkpoint")) << r.output;
  // cancel --wait on a pending job returns at once.
  auto p = client.submit(test_spec(1, 0, 1, 1));
  r = c.ctl("cancel " + std::to_string(p.job) + " --wait --json");
  EXPECT_EQ(parse_json(r.output)["state"], "cancelled");
}

TEST(Ringctl, AnotherUsersJobIsRefused) {
  Coord c(/*shared=*/true);
  auto client = c.client();
  int64_t roots = client.submit(test_spec(1, 0, 1, 1)).job;
  // nobody runs a copy it can reach: the checkout may be in a 0700 home directory.
  ring::test::OtherUserBin bin({kRingctl});
  std::string as_nobody =
      ring::test::as_nobody("env RING_COORD=" + c.ep() + " " + bin.path("ringctl") + " ");
  for (const char* cmd : {"cancel", "restart"}) {
    auto r = ring::test::run(as_nobody + cmd + " " + std::to_string(roots));
    EXPECT_EQ(r.exit_code, 6) << cmd << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "belongs to root (uid 0); nobody (uid 65534) may not"))
        << r.output;
  }
  EXPECT_EQ(client.status(roots).state, "pending");
  // Reading is allowed.
  auto r = ring::test::run(as_nobody + "status " + std::to_string(roots) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(parse_json(r.output)["owner"], "root");
  // Private mode: another user cannot even reach the socket, and is told why.
  Coord priv;
  r = ring::test::run(ring::test::as_nobody(bin.path("ringctl") + " status --coord " + priv.ep()));
  EXPECT_EQ(r.exit_code, 4) << r.output;
}

// Every numeric flag of every subcommand refuses NaN, infinities, other spellings (hex, blanks,
// exponents for integers) and values out of range, naming the flag and its rule; a usage error
// exits 2 before anything is contacted (no coordinator runs here: a value let through would end
// in exit 4 "no coordinator" or worse).
TEST(Ringctl, NumericFlagsRefuseNanInfinityAndOutOfRange) {
  std::string dir = make_temp_dir("ctl-nums");
  std::string spec = ring::test::source_path("tests/cli/run_tiny.yaml");
  std::string coord = " --coord ipc://" + dir + "/none.sock";
  struct Case {
    std::string args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"status --timeout nan", "--timeout: expected seconds in [0.05, 3600], got 'nan'"},
      {"status --timeout inf", "--timeout: expected seconds in [0.05, 3600], got 'inf'"},
      {"status --timeout -1", "--timeout: expected seconds in [0.05, 3600], got '-1'"},
      {"status --timeout 1e9", "--timeout: expected seconds in [0.05, 3600], got '1e9'"},
      {"status --timeout 0x10", "--timeout: expected seconds in [0.05, 3600], got '0x10'"},
      {"status --timeout ' 5'", "--timeout: expected seconds in [0.05, 3600], got ' 5'"},
      {"status --follow --interval nan", "--interval: expected seconds in [0.1, 3600], got 'nan'"},
      {"status --follow --interval 0", "--interval: expected seconds in [0.1, 3600], got '0'"},
      {"nodes --timeout NaN", "--timeout: expected seconds in [0.05, 3600], got 'NaN'"},
      {"cancel 1 --wait --wait-timeout nan",
       "--wait-timeout: expected seconds in [0.1, 86400], got 'nan'"},
      {"cancel 1 --wait --wait-timeout -inf",
       "--wait-timeout: expected seconds in [0.1, 86400], got '-inf'"},
      {"restart 1 --from -1", "--from: expected an integer in [0, 1099511627776], got '-1'"},
      {"restart 1 --from 2.5", "--from: expected an integer in [0, 1099511627776], got '2.5'"},
      {"restart 1 --from 1e3", "--from: expected an integer in [0, 1099511627776], got '1e3'"},
      {"events 1 --after -5", "--after: expected an integer in [0, 9007199254740992], got '-5'"},
      {"events 1 --after nan", "--after: expected an integer in [0, 9007199254740992], got 'nan'"},
      {"logs 1 --lines -1", "--lines: expected an integer in [0, 2147483648], got '-1'"},
      {"logs 1 --worker 99999999999999999999",
       "--worker: expected an integer in [0, 4294967295], got '99999999999999999999'"},
      {"run " + spec + " --steps 0", "--steps: expected an integer in [1, 1099511627776], got '0'"},
      {"run " + spec + " --steps nan",
       "--steps: expected an integer in [1, 1099511627776], got 'nan'"},
      {"run " + spec + " --steps 1e30",
       "--steps: expected an integer in [1, 1099511627776], got '1e30'"},
      {"run " + spec + " --threads 100000",
       "--threads: expected an integer in [1, 4096], got '100000'"},
      {"slurm-started 1 --slurm-job 5 --restarts -1",
       "--restarts: expected an integer in [0, 1000000], got '-1'"},
      {"status --coord tcp://127.0.0.1:99999", "--coord: port '99999' is not in 1..65535"},
      {"status --coord tcp://127.0.0.1:0", "--coord: port '0' is not in 1..65535"},
      {"status --coord ipc://relative.sock", "--coord: ipc:// needs an absolute path"},
      {"status --coord udp://x:1", "--coord: expected ipc://PATH or tcp://HOST:PORT"},
  };
  for (const auto& c : cases) {
    bool has_coord = c.args.find("--coord") != std::string::npos;
    auto r = ring::test::run("timeout 60 " + kRingctl + " " + c.args + (has_coord ? "" : coord));
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.message)) << c.args << "\n" << r.output;
  }
  // $RING_COORD follows the --coord rule.
  auto env = ring::test::run("RING_COORD=tcp://127.0.0.1:99999 " + kRingctl + " status");
  EXPECT_EQ(env.exit_code, 2) << env.output;
  EXPECT_TRUE(contains(env.output, "$RING_COORD: port '99999' is not in 1..65535")) << env.output;
  // Job ids: digits only.
  for (const char* id : {"0", "-3", "7x", "+7", " 7", "1e3", "99999999999999999999"}) {
    auto r = ring::test::run(kRingctl + " status '" + id + "'" + coord);
    EXPECT_EQ(r.exit_code, 2) << id << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "is not a job id")) << id << "\n" << r.output;
  }
  std::filesystem::remove_all(dir);
}

// An unknown command or flag is named, with the closest one and the list; exit 2.
TEST(Ringctl, UnknownCommandsAndFlagsAreNamed) {
  auto r = ring::test::run(kRingctl + " statsu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown command 'statsu'; did you mean 'status'?")) << r.output;
  EXPECT_TRUE(contains(r.output, "commands: validate, plan, init, run, status")) << r.output;
  r = ring::test::run(kRingctl + " frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown command 'frobnicate'")) << r.output;
  EXPECT_FALSE(contains(r.output, "did you mean")) << r.output;
  r = ring::test::run(kRingctl);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "a command is required")) << r.output;
  EXPECT_TRUE(contains(r.output, "commands: validate")) << r.output;
  r = ring::test::run(kRingctl + " --jsn");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown flag '--jsn'")) << r.output;
  // Flags of a subcommand.
  r = ring::test::run(kRingctl + " status --jsn");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ringctl status: unknown flag '--jsn'; did you mean '--json'?"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "flags of status: --help, --json, --follow")) << r.output;
  r = ring::test::run(kRingctl + " logs 1 --follw");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown flag '--follw'; did you mean '--follow'?")) << r.output;
  r = ring::test::run(kRingctl + " validate --quiet=yes x.yaml --bogus-flag");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = ring::test::run(kRingctl + " restart 1 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ringctl restart: unexpected argument '2'")) << r.output;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l)) out.push_back(l);
  return out;
}

// status as squeue/sacct: -u, -t, --format with widths, --noheader, --parsable.
TEST(Ringctl, StatusSelectsAndFormatsLikeSqueue) {
  Coord c;
  auto client = c.client();
  auto job = start_job(c, c.dir() + "/job", 5);
  const std::string run_id = std::to_string(job.id);
  const std::string done_id = std::to_string(client.submit(test_spec(1, 0, 1, 1)).job);
  client.cancel(std::stoll(done_id));
  ASSERT_TRUE(wait_for([&] { return client.status(std::stoll(done_id)).state == "cancelled"; }));

  auto r = c.ctl("status --noheader --parsable --format=id,name,state,step");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_of(r.output), (std::vector<std::string>{run_id + "|tiny|running|5/200",
                                                          done_id + "|tiny|cancelled|0/200"}))
      << r.output;
  // With a header; field names in any case.
  r = c.ctl("status --parsable -o ID,State");
  EXPECT_EQ(lines_of(r.output)[0], "JOBID|STATE") << r.output;
  // -t: states in any case, a comma list.
  r = c.ctl("status --noheader --parsable -o id -t RUNNING");
  EXPECT_EQ(r.output, run_id + "\n");
  r = c.ctl("status --noheader --parsable -o id --states running,Cancelled");
  EXPECT_EQ(lines_of(r.output).size(), 2u) << r.output;
  r = c.ctl("status -t failed");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "no jobs of any user in failed")) << r.output;
  // Every state ring-coord has is one -t knows.
  for (auto st : ring::coord::kAllJobStates)
    EXPECT_EQ(c.ctl(std::string("status -t ") + ring::coord::to_string(st)).exit_code, 0)
        << ring::coord::to_string(st);
  r = c.ctl("status -t runing");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown state 'runing'; did you mean 'running'?")) << r.output;
  // -u: names or uids.
  const std::string me = getpwuid(geteuid())->pw_name;
  r = c.ctl("status --noheader --parsable -o id -u " + me);
  EXPECT_EQ(lines_of(r.output).size(), 2u) << r.output;
  r = c.ctl("status --noheader --parsable -o id -u " + std::to_string(geteuid()) + " -t running");
  EXPECT_EQ(r.output, run_id + "\n");
  r = c.ctl("status --noheader -o id -u 4000000");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "");
  r = c.ctl("status -u no-such-user-here");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown user 'no-such-user-here'")) << r.output;
  // Widths cut or pad (header too); elapsed like sacct's.
  r = c.ctl("status --format=id,name:2,state:10,elapsed -t running");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = lines_of(r.output);
  ASSERT_EQ(l.size(), 2u) << r.output;
  EXPECT_EQ(l[0].rfind("JOBID  NA  STATE       ELAPSED", 0), 0u) << r.output;
  EXPECT_TRUE(contains(l[1], "  ti  running    ")) << r.output;
  // The default columns, without the header.
  r = c.ctl("status --noheader");
  EXPECT_FALSE(contains(r.output, "JOBID")) << r.output;
  EXPECT_TRUE(contains(r.output, "5/200")) << r.output;
  // With JOB and a column option: the row, not the details.
  r = c.ctl("status " + run_id + " --parsable --noheader -o id,loss");
  EXPECT_EQ(r.output, run_id + "|1.7500\n");
  // Bad fields and widths are named.
  r = c.ctl("status --format=id,nmae");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown field 'nmae'; did you mean 'name'?")) << r.output;
  r = c.ctl("status --format=name:0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "width '0' is not an integer in [1, 1000]")) << r.output;
  // -t selects what --json prints too.
  auto j = parse_json(c.ctl("status --json -t cancelled").output);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(std::to_string(j[0]["job"].get<int64_t>()), done_id);
}

// cancel of several jobs: each reported, every id checked first, the first failure's code.
TEST(Ringctl, CancelSeveralJobs) {
  Coord c;
  auto client = c.client();
  auto a = std::to_string(client.submit(test_spec(1, 0, 1, 1)).job);
  auto b = std::to_string(client.submit(test_spec(1, 0, 1, 1)).job);
  auto keep = client.submit(test_spec(1, 0, 1, 1)).job;
  // A malformed id: nothing is cancelled.
  auto r = c.ctl("cancel " + std::to_string(keep) + " seven");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "'seven' is not a job id")) << r.output;
  EXPECT_EQ(client.status(keep).state, "pending");
  r = c.ctl("cancel " + a + " 99 " + b + " " + a);
  EXPECT_EQ(r.exit_code, 5) << r.output;  // 99: no such job
  EXPECT_TRUE(contains(r.output, "job " + a + ": cancelled")) << r.output;
  EXPECT_TRUE(contains(r.output, "job " + b + ": cancelled")) << r.output;
  EXPECT_TRUE(contains(r.output, "job 99 does not exist")) << r.output;
  EXPECT_TRUE(contains(r.output, "not every job was cancelled (exit 5")) << r.output;
  EXPECT_EQ(client.status(std::stoll(b)).state, "cancelled");
  // All cancelled: 0; one per line with --json.
  r = c.ctl("cancel " + std::to_string(keep) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = c.ctl("cancel " + a + " " + b);
  EXPECT_EQ(r.exit_code, 7) << r.output;  // already cancelled
}

// The options the coordinator commands share may come before the command.
TEST(Ringctl, SharedOptionsBeforeTheCommand) {
  Coord c;
  auto client = c.client();
  auto id = client.submit(test_spec(1, 0, 1, 1)).job;
  auto r = ring::test::run(kRingctl + " --coord " + c.ep() + " --timeout 2 status --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(parse_json(r.output)[0]["job"], id);
  r = ring::test::run(kRingctl + " --json --coord=" + c.ep() + " status " + std::to_string(id));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(parse_json(r.output)["job"], id);
  r = ring::test::run(kRingctl + " --coord " + c.ep() + " cancel " + std::to_string(id));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Checked by the command's own rules, before and after alike.
  r = ring::test::run(kRingctl + " --timeout nan --coord " + c.ep() + " status");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--timeout: expected seconds in [0.05, 3600], got 'nan'"))
      << r.output;
  r = ring::test::run(kRingctl + " --coord ipc://relative.sock nodes");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ipc:// needs an absolute path")) << r.output;
  // A command without the option, a missing value, a missing command.
  r = ring::test::run(kRingctl + " --coord " + c.ep() + " validate x.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ringctl validate: takes no --coord")) << r.output;
  r = ring::test::run(kRingctl + " --coord");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--coord needs a value")) << r.output;
  r = ring::test::run(kRingctl + " --coord " + c.ep());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "a command is required")) << r.output;
  // An option that is not shared is still an unknown flag before the command.
  r = ring::test::run(kRingctl + " --follow status");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown flag '--follow'")) << r.output;
}

// `ringctl submit` of a multi-node job: its nodes must all see the job directory (spec copy,
// rendezvous, logs), so the node-local default and node-local places are refused with the
// reason before ring-coord is asked anything (exit 2, not 4 without a coordinator); a shared
// directory is what the rendered script names.
TEST(RingctlSubmit, MultiNodeJobsNeedASharedJobDir) {
  std::string dir = make_temp_dir("ctl-submit");
  std::string spec = ring::test::source_path("configs/examples/slurm-2node.yaml");
  std::string base = kRingctl + " submit " + spec + " --coord ipc://" + dir + "/none.sock";
  for (const std::string& dry : {std::string(" --dry-run"), std::string()}) {
    auto r = ring::test::run(base + dry);
    EXPECT_EQ(r.exit_code, 2) << dry << r.output;
    EXPECT_TRUE(contains(r.output,
                         "resources.nodes is 2: give --job-dir DIR on a file system "
                         "every node mounts"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "/tmp/ringmaster-" + std::to_string(geteuid()) +
                                       "/jobs/<name>, is on this node only"))
        << r.output;
  }
  for (const std::string& local : {dir + "/job", std::string("/dev/shm/ring-job"),
                                   std::string("/run/ring-job"), std::string("/var/tmp/job")}) {
    auto r = ring::test::run(base + " --dry-run --job-dir " + local);
    EXPECT_EQ(r.exit_code, 2) << local << r.output;
    EXPECT_TRUE(contains(r.output, "--job-dir " + local + " is under /")) << r.output;
    EXPECT_TRUE(contains(r.output, "the 2 nodes of this job would not see the spec")) << r.output;
  }
  // A directory on a shared file system: a path that need not exist for --dry-run, outside the
  // node-local places and not on a tmpfs (its nearest existing ancestor is /).
  std::string shared = "/ring-shared-fs-test-" + std::to_string(getpid()) + "/job";
  auto r = ring::test::run(base + " --dry-run --job-dir " + shared);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "export RING_JOB_DIR=" + shared + "\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "#SBATCH --output=" + shared + "/slurm-%j.out")) << r.output;
  EXPECT_TRUE(contains(r.output, "spec=" + shared + "/spec.yaml\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "#SBATCH --nodes=2")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(shared)) << "--dry-run creates nothing";
  // A one-machine "cluster" (the test cluster of slurm/) may say so.
  r = ring::test::run(base + " --dry-run --local-job-dir-ok --job-dir " + dir + "/job");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "export RING_JOB_DIR=" + dir + "/job\n")) << r.output;
  // One node: the per-user default is fine.
  r = ring::test::run(kRingctl + " submit " +
                      ring::test::source_path("configs/examples/tiny.yaml") +
                      " --dry-run --coord ipc://" + dir + "/none.sock");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "export RING_JOB_DIR=/tmp/ringmaster-" +
                                     std::to_string(geteuid()) + "/jobs/tiny\n"))
      << r.output;
  std::filesystem::remove_all(dir);
}

// The spec copy and the batch script `ringctl submit` writes are private (0600, 0700), and a
// job directory that is not ours is refused before ring-coord records the job.
TEST(RingctlSubmit, SpecCopyIsPrivateAndTheJobDirIsChecked) {
  Coord c;
  std::string dir = make_temp_dir("ctl-submit-files");
  // sbatch refuses (a stand-in first in PATH): the files are written before it runs.
  std::filesystem::create_directories(dir + "/bin");
  std::ofstream(dir + "/bin/sbatch") << "#!/bin/sh\necho 'sbatch: stand-in refuses' >&2\nexit 1\n";
  ::chmod((dir + "/bin/sbatch").c_str(), 0755);
  std::string env = "PATH=" + dir + "/bin:$PATH RING_COORD=" + c.ep() + " ";
  std::string spec = ring::test::source_path("configs/examples/tiny.yaml");
  // (--ringd: any executable; the script is never run)
  auto r = ring::test::run("umask 022; " + env + kRingctl + " submit " + spec +
                           " --spank off --ringd /bin/true --job-dir " + dir +
                           "/job --set train.log_every=5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "stand-in refuses")) << r.output;
  struct stat st {};
  ASSERT_EQ(stat((dir + "/job/spec-1.yaml").c_str(), &st), 0) << r.output;
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // The copy is the spec the --set made, and lists it.
  std::string copy = read_text(dir + "/job/spec-1.yaml");
  EXPECT_TRUE(contains(copy, "#   --set train.log_every=5\n")) << copy;
  EXPECT_TRUE(contains(copy, "log_every: 5\n")) << copy;
  ASSERT_EQ(stat((dir + "/job/job-1.sbatch").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir + "/job").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  if (geteuid() != 0) GTEST_SKIP() << "the rest needs root: a directory of another user";
  // Another user's directory: refused, and ring-coord has no new job.
  std::string theirs = dir + "/theirs";
  ::mkdir(theirs.c_str(), 0755);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  auto before = c.client().status().size();
  r = ring::test::run(env + kRingctl + " submit " + spec +
                      " --spank off --ringd /bin/true --job-dir " + theirs);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "job directory " + theirs +
                                     " is owned by nobody (uid 65534), "
                                     "not by you"))
      << r.output;
  EXPECT_EQ(c.client().status().size(), before);
  std::filesystem::remove_all(dir);
}

// What other users and their daemons choose (job names, reasons, event data) reaches every
// user's terminal through ringctl: control bytes are shown as \xHH, never sent raw, so no one can
// retitle a window, move the cursor or forge a line in someone else's `ringctl status`.
TEST(Ringctl, ControlBytesFromTheCoordinatorNeverReachTheTerminal) {
  Coord c;
  auto client = c.client();
  const std::string evil = "x\033]0;owned\007\r\nFAKE 99 root completed\033[2J\xc2\x9b";
  auto sub = client.submit(test_spec(1, 0, 1, 1), evil);
  SimDaemon d(c.ep(), "node-b");
  d.register_jobs({{sub.job, 0, 0}});
  proto::Event died;  // a worker's last log lines, as a daemon reports them
  died.kind = proto::EventKind::kWorkerDied;
  died.job = sub.job;
  died.attempt = 1;
  died.rank = 0;
  died.exit_code = 1;
  died.last_log = {"boom\033[2J\033]0;owned\007", "second\rline"};
  d.event(died);
  ASSERT_TRUE(wait_for(
      [&] { return contains(c.ctl("events " + std::to_string(sub.job)).output, "worker_died"); },
      30s));
  const std::string id = std::to_string(sub.job);
  for (const std::string& cmd :
       std::vector<std::string>{"status", "status " + id, "nodes", "events " + id}) {
    auto r = c.ctl(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << r.output;
    for (char bad : {'\033', '\007', '\r'})
      EXPECT_EQ(r.output.find(bad), std::string::npos) << cmd << ": raw control byte in\n"
                                                       << r.output;
    EXPECT_EQ(r.output.find("\xc2\x9b"), std::string::npos) << cmd;
    EXPECT_EQ(r.output.find("\nFAKE"), std::string::npos) << cmd << r.output;
  }
  EXPECT_TRUE(contains(c.ctl("status").output, "x\\x1b]0;owned\\x07\\x0d\\x0aFAKE"));
  EXPECT_TRUE(contains(c.ctl("events " + std::to_string(sub.job)).output,
                       "| boom\\x1b[2J\\x1b]0;owned\\x07"));
  // --name itself follows the job.name rule.
  // (bounded: a regression would start the job)
  for (const char* sub_cmd : {"run --steps 1", "submit --dry-run"}) {
    auto r = ring::test::run("timeout 120 env RING_COORD=" + c.ep() + " " + kRingctl + " " +
                             sub_cmd + " " + ring::test::source_path("configs/examples/tiny.yaml") +
                             " --job-dir " + c.dir() + "/job --name 'bad name'");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "--name: 'bad name' is not a job name")) << r.output;
  }
}
