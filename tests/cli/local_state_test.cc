// ringctl after its coordinator stopped (cli/local_state.h): status, events, logs and steps read
// the state ring-coord left in its state directory, read-only, when nothing answers at an
// endpoint that state was served at; requests that change state, and other endpoints, still exit
// 4. And `ringctl steps` from a live coordinator: losses exactly as reported, from the job's
// steps.jsonl (with learning rate and gradient norm) or the coordinator's records.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../common/run.h"
#include "../coordinator/coord_test_util.h"
#include "coordinator/store.h"

using namespace ring::coord;
using namespace ring::coord::test;
using nlohmann::json;

namespace {

const std::string kRingctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// Losses whose shortest round-trip text has 17 significant digits: printing them with fewer
// digits would change them.
const double kLoss[] = {2.718281828459045, 1.0000000000000002, 0.30000000000000004};

// A coordinator with one job (job dir <dir>/job) that ran 3 steps on a simulated daemon.
struct Fixture {
  InProcessCoordinator coord;
  std::string job_dir = coord.dir() + "/job";
  int64_t job = 0;

  Fixture() {
    auto c = coord.client();
    job = c.submit(test_spec(1, 0, 1, 1), "", job_dir).job;
    SimDaemon d(coord.endpoint(), "node-a");
    d.register_jobs({{job, 0, 0}});
    for (int s = 1; s <= 3; ++s) d.step(job, 1, s, kLoss[s - 1]);
    EXPECT_TRUE(wait_for([&] { return c.steps(job).size() == 3; }, 30s));
    d.simple(ring::protocol::EventKind::kJobCompleted, job, 1, 3);
    EXPECT_TRUE(wait_for([&] { return c.status(job).state == "completed"; }, 30s));
  }

  // ringctl with the coordinator's endpoint and state directory.
  ring::test::RunResult ringctl(const std::string& args, const std::string& endpoint = "") {
    return ring::test::run("RING_COORD=" + (endpoint.empty() ? coord.endpoint() : endpoint) +
                           " RING_STATE_DIR=" + coord.dir() + "/state " + kRingctl + " " + args);
  }
};

}  // namespace

TEST(RingctlLocalState, AnswersFromTheStateAStoppedCoordinatorLeft) {
  Fixture f;
  const std::string j = std::to_string(f.job);
  auto live = f.ringctl("status " + j + " --json");
  ASSERT_EQ(live.exit_code, 0) << live.output;
  EXPECT_FALSE(contains(live.output, "read-only")) << live.output;
  f.coord.stop();
  ASSERT_FALSE(std::filesystem::exists(f.coord.endpoint().substr(6)));

  // status: the same job, as recorded, with a note that no coordinator answered.
  auto st = f.ringctl("status " + j);
  EXPECT_EQ(st.exit_code, 0) << st.output;
  EXPECT_TRUE(contains(st.output, "completed")) << st.output;
  EXPECT_TRUE(contains(st.output, "no coordinator answers at " + f.coord.endpoint() +
                                      "; answering from the state it left in " + f.coord.dir() +
                                      "/state/coord.db (read-only)"))
      << st.output;
  auto all = f.ringctl("status");
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_TRUE(contains(all.output, "3/")) << all.output;

  // events: every recorded event, the job's completion included.
  auto ev = f.ringctl("events " + j + " --json");
  EXPECT_EQ(ev.exit_code, 0) << ev.output;
  EXPECT_TRUE(contains(ev.output, "\"kind\":\"job_completed\"")) << ev.output;
  EXPECT_TRUE(contains(ev.output, "\"node\":\"node-a\"")) << ev.output;

  // logs: the job directory comes from the recorded state.
  std::filesystem::create_directories(f.job_dir + "/logs");
  std::ofstream(f.job_dir + "/logs/worker-0.log") << "hello from rank 0\n";
  auto logs = f.ringctl("logs " + j);
  EXPECT_EQ(logs.exit_code, 0) << logs.output;
  EXPECT_TRUE(contains(logs.output, "hello from rank 0")) << logs.output;

  // steps: the coordinator's records, each loss exactly as reported.
  auto steps = f.ringctl("steps " + j + " --source coordinator --json");
  ASSERT_EQ(steps.exit_code, 0) << steps.output;
  std::vector<double> losses;
  std::istringstream lines(steps.output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') losses.push_back(json::parse(line)["loss"].get<double>());
  ASSERT_EQ(losses.size(), 3u) << steps.output;
  for (int s = 0; s < 3; ++s) EXPECT_EQ(losses[s], kLoss[s]) << s;
  auto table = f.ringctl("steps " + j + " --source coordinator");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_TRUE(contains(table.output, "0.30000000000000004")) << table.output;
  EXPECT_TRUE(contains(table.output, "1.0000000000000002")) << table.output;

  // Changing state needs a coordinator; a job that was never recorded is not found.
  auto cancel = f.ringctl("cancel " + j);
  EXPECT_EQ(cancel.exit_code, 4) << cancel.output;
  auto missing = f.ringctl("status 99");
  EXPECT_EQ(missing.exit_code, 5) << missing.output;
  EXPECT_TRUE(contains(missing.output, "job 99 does not exist")) << missing.output;

  // An endpoint this state was never served at: no coordinator, as before.
  auto other = f.ringctl("status " + j, "ipc://" + f.coord.dir() + "/sock/other.sock");
  EXPECT_EQ(other.exit_code, 4) << other.output;

  // A socket file nobody listens on (a coordinator killed with -9): after --timeout, the same.
  {
    std::string path = f.coord.endpoint().substr(6);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::close(fd);
    auto stale = f.ringctl("status " + j + " --timeout 0.3");
    EXPECT_EQ(stale.exit_code, 0) << stale.output;
    EXPECT_TRUE(contains(stale.output, "answering from the state it left")) << stale.output;
    std::filesystem::remove(path);
  }

  // Read-only: the database was not changed (no new events) and ring-coord starts on it again.
  {
    Store store(f.coord.dir() + "/state/coord.db", {false, 0});
    EXPECT_EQ(store.job(f.job)->last_step, 3);
  }
  f.coord.start();
  EXPECT_EQ(f.coord.client().status(f.job).state, "completed");
}

TEST(RingctlSteps, FromTheJobsStepsFile) {
  Fixture f;
  const std::string j = std::to_string(f.job);
  // node 0's ringd writes one line per step (daemon/INTERFACE.md); the last one is unfinished.
  std::filesystem::create_directories(f.job_dir);
  {
    std::ofstream s(f.job_dir + "/steps.jsonl");
    s << R"({"step":1,"loss":10.397207260131836,"tokens_per_s":1234.5,"step_ms":81.25,"lr":0.0003,"grad_norm":1.83125,"attempt":1})"
      << "\n"
      << "not json\n"
      << R"({"step":2,"loss":9.87654321012345,"tokens_per_s":2000,"step_ms":80,"lr":0.00015,"grad_norm":0.5,"attempt":1})"
      << "\n"
      << R"({"step":3,"lo)";
  }
  auto t = f.ringctl("steps " + j);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_TRUE(contains(t.output, "STEP  ATTEMPT  LOSS")) << t.output;
  EXPECT_TRUE(contains(t.output, "10.397207260131836")) << t.output;
  EXPECT_TRUE(contains(t.output, "9.87654321012345")) << t.output;
  EXPECT_TRUE(contains(t.output, "0.0003")) << t.output;
  EXPECT_TRUE(contains(t.output, "1.83125")) << t.output;
  EXPECT_TRUE(contains(t.output, "steps.jsonl:2: not a step record")) << t.output;
  EXPECT_FALSE(contains(t.output, "steps.jsonl:4")) << t.output;

  auto js = f.ringctl("steps " + j + " --json --after 1");
  ASSERT_EQ(js.exit_code, 0) << js.output;
  EXPECT_TRUE(contains(js.output, R"("loss":9.87654321012345)")) << js.output;
  EXPECT_FALSE(contains(js.output, "10.397207260131836")) << js.output;

  auto last = f.ringctl("steps " + j + " --last 1 --source file");
  EXPECT_EQ(last.exit_code, 0) << last.output;
  EXPECT_FALSE(contains(last.output, "10.397207260131836")) << last.output;

  // Without the file: --source file says why; auto falls back to the coordinator's records.
  std::filesystem::remove(f.job_dir + "/steps.jsonl");
  auto file = f.ringctl("steps " + j + " --source file");
  EXPECT_EQ(file.exit_code, 1) << file.output;
  EXPECT_TRUE(contains(file.output, f.job_dir + "/steps.jsonl cannot be read here")) << file.output;
  auto coord = f.ringctl("steps " + j);
  EXPECT_EQ(coord.exit_code, 0) << coord.output;
  EXPECT_TRUE(contains(coord.output, "2.718281828459045")) << coord.output;
  // A bad job id and an unknown job.
  EXPECT_EQ(f.ringctl("steps x").exit_code, 2);
  EXPECT_EQ(f.ringctl("steps 42").exit_code, 5);
}
