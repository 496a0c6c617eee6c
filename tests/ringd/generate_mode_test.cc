// ringd's generate mode before its workers (daemon/ringd/generate_job.h, GenerateMode::prepare):
// the ranks' rendezvous directory of a one-node run is made fresh, and one left by an earlier
// ringd of the same pid is removed only when it carries ringd's marker (owned_paths.h); anything
// else there is the user's and is kept, with a clear error.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/ringd/generate_job.h"
#include "daemon/ringd/owned_paths.h"
#include "daemon/ringd/startup.h"
#include "tests/common/test_proc.h"

namespace ring::ringd {
namespace {

namespace fs = std::filesystem;

struct Rig {
  ring::test::TempDir t;
  Options o;
  spec::JobSpec s;
  std::string job_dir = t.path + "/job", worker_bin = "/bin/true";
  placement::Placement placement;
  Supervisor sup{Supervisor::Options{}};
  std::vector<std::string> errors;
  Rig() {
    fs::create_directories(job_dir);
    o.nodes = 1;
    o.node_rank = 0;
    s.resources.workers_per_node = 2;  // two ranks: a rendezvous is needed
  }
  GenerateMode mode() {
    return GenerateMode(DaemonParts{o, s, job_dir, worker_bin, placement, sup,
                                    [](const std::string&) {},
                                    [this](const std::string& e) { errors.push_back(e); },
                                    [](const std::string&, nlohmann::json) {},
                                    [] { return static_cast<CoordLink*>(nullptr); }});
  }
  // Where prepare() puts this process's rendezvous (ringd's pid is ours here).
  std::string rdv() const {
    return rendezvous_root(o, job_dir) + "/generate-" + std::to_string(::getpid());
  }
};

TEST(GenerateMode, AForeignDirectoryAtTheRendezvousIsKeptAndNamed) {
  Rig r;
  fs::create_directories(r.rdv());
  std::ofstream(r.rdv() + "/notes.txt") << "mine";
  GenerateMode m = r.mode();
  const std::optional<int> exit = m.prepare();
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(*exit, kExitFailed);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].find("is not a rendezvous ringd made"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find(r.rdv()), std::string::npos) << r.errors[0];
  std::string text;
  std::ifstream(r.rdv() + "/notes.txt") >> text;
  EXPECT_EQ(text, "mine") << "the user's file must survive";
}

TEST(GenerateMode, ADirectoryRingdMarkedIsReplacedByAFreshOne) {
  Rig r;
  fs::create_directories(r.rdv());
  mark_own_dir(r.rdv(), "generate");
  std::ofstream(r.rdv() + "/stale") << "x";
  {
    GenerateMode m = r.mode();
    EXPECT_FALSE(m.prepare().has_value()) << (r.errors.empty() ? "" : r.errors[0]);
    EXPECT_FALSE(fs::exists(r.rdv() + "/stale"));
    struct stat st {};
    ASSERT_EQ(::stat(r.rdv().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    m.shut_down();
  }
  // Its own rendezvous goes with the run.
  EXPECT_FALSE(fs::exists(r.rdv()));
}

}  // namespace
}  // namespace ring::ringd
