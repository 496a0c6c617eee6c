// What ringd checks and prepares before its first attempt (daemon/ringd/startup.h), without
// starting it: the spec against the command line, the job directory, the rendezvous root, the
// checkpoint directory; each failure names the file or key and exits with the contract's code.
#include "daemon/ringd/startup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "common/spec/parse.h"
#include "tests/common/test_proc.h"

namespace {

using namespace ring;
using ringd::Options;

spec::JobSpec tiny4() {
  spec::LoadResult r = spec::load_spec_file(std::string(RING_SOURCE_DIR) + "/tests/ringd/tiny4.yaml");
  EXPECT_TRUE(r.ok());
  return *r.spec;
}

mode_t mode_of(const std::string& p) {
  struct stat st{};
  ::lstat(p.c_str(), &st);
  return st.st_mode & 07777;
}

TEST(RingdStartup, SpecMustFitTheCommandLine) {
  Options o;
  o.spec = "job.yaml";
  const spec::JobSpec good = tiny4();
  EXPECT_FALSE(ringd::check_spec(good, o).has_value());
  // Data replicas: context_ranks x data_replicas workers (2 rings of 2 on the 4 workers).
  spec::JobSpec s = good;
  s.parallel.context_ranks = 2;
  s.parallel.data_replicas = 2;
  EXPECT_FALSE(ringd::check_spec(s, o).has_value());
  s.parallel.data_replicas = 3;
  auto f = ringd::check_spec(s, o);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->code, ringd::kExitUsage);
  EXPECT_EQ(f->message,
            "job.yaml: parallel.context_ranks 2 x data_replicas 3 = 6 ranks but 1 node(s) x "
            "resources.workers_per_node 4 = 4 workers");
  Options two = o;
  two.nodes = 2;
  f = ringd::check_spec(good, two);
  ASSERT_TRUE(f.has_value());
  EXPECT_NE(f->message.find("parallel.context_ranks 4 x data_replicas 1 = 4 ranks but 2 node(s) "
                            "x resources.workers_per_node 4 = 8 workers"),
            std::string::npos) << f->message;
  s = good;
  s.optimizer.offload = spec::Offload::kNone;
  f = ringd::check_spec(s, o);
  ASSERT_TRUE(f.has_value());
  EXPECT_NE(f->message.find("optimizer.offload = none"), std::string::npos);
}

TEST(RingdStartup, JobDirIsCreatedPrivateAndLogsMustBeADirectory) {
  test::TempDir t("ringd-startup");
  std::string dir = t.path + "/a/job";
  ASSERT_FALSE(ringd::prepare_job_dir(&dir).has_value());
  EXPECT_EQ(dir, t.path + "/a/job");
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(dir + "/logs"), 0700u);
  std::string bad = t.path + "/b";
  ASSERT_EQ(::mkdir(bad.c_str(), 0700), 0);
  ASSERT_EQ(::symlink("/tmp", (bad + "/logs").c_str()), 0);
  auto f = ringd::prepare_job_dir(&bad);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->code, ringd::kExitFailed);
  EXPECT_EQ(f->message, "--job-dir " + t.path +
                            "/b: logs is not a directory (a symbolic link?); refusing to write there");
  std::ofstream(t.path + "/file") << "x";
  std::string under_file = t.path + "/file/job";
  f = ringd::prepare_job_dir(&under_file);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->code, ringd::kExitUsage);
  EXPECT_EQ(f->message.rfind("--job-dir " + under_file + ": ", 0), 0u) << f->message;
}

std::map<std::string, std::string> g_env;
const char* fake_env(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

TEST(RingdStartup, RendezvousRoot) {
  Options o;
  g_env = {};
  EXPECT_EQ(ringd::rendezvous_root(o, "/j", fake_env), "/j/rendezvous");
  g_env = {{"SLURM_JOB_ID", "77"}};
  EXPECT_EQ(ringd::rendezvous_root(o, "/j", fake_env), "/j/rendezvous/slurm-77.0");
  g_env = {{"SLURM_JOB_ID", "77"}, {"SLURM_RESTART_COUNT", "2"}};
  EXPECT_EQ(ringd::rendezvous_root(o, "/j", fake_env), "/j/rendezvous/slurm-77.2");
  o.rendezvous = "/r";  // the user's directory, as given
  EXPECT_EQ(ringd::rendezvous_root(o, "/j", fake_env), "/r");
}

TEST(RingdStartup, CheckpointDir) {
  test::TempDir t("ringd-startup");
  std::string dir = "x";
  ASSERT_FALSE(ringd::prepare_checkpoint_dir("", t.path, &dir).has_value());
  EXPECT_EQ(dir, "");  // no checkpoints
  ASSERT_FALSE(ringd::prepare_checkpoint_dir("ck/../checkpoints", t.path, &dir).has_value());
  EXPECT_EQ(dir, t.path + "/checkpoints");
  EXPECT_EQ(mode_of(dir), 0700u);
  std::ofstream(t.path + "/plain") << "x";
  auto f = ringd::prepare_checkpoint_dir(t.path + "/plain", t.path, &dir);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->code, ringd::kExitFailed);
  EXPECT_EQ(f->message, "checkpoint.dir " + t.path + "/plain: not a directory");
}

}  // namespace
