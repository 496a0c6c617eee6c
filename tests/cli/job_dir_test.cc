// The job directory rule (common/cli/job_dir.h): the per-user default and its checks (ours, not
// a symlink, private), a --job-dir given by the user (ours, not writable by everyone, writable by
// us), and what counts as node-local. The default's checks run in a child that becomes nobody
// (uid 65534), so that /tmp/ringmaster-65534 can be set up wrongly by root first.
#include "common/cli/job_dir.h"

#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "tests/common/test_proc.h"

namespace ring::jobdir {
namespace {

namespace fs = std::filesystem;
constexpr uid_t kNobody = 65534;

struct TempDir {
  std::string path;
  TempDir() {
    path = "/tmp/ring-jobdir-XXXXXX";
    EXPECT_NE(mkdtemp(path.data()), nullptr);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const JobDirError& e) {
    return e.what();
  }
  return "";
}

mode_t mode_of(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// Runs `f` in a child as nobody; returns its JobDirError text ("" when none; "ok:<path>" when f
// returned a path).
std::string as_nobody(const std::function<std::string()>& f) {
  return ring::test::as_uid(kNobody, [&]() -> std::string {
    try {
      return "ok:" + f();
    } catch (const JobDirError& e) {
      return e.what();
    }
  });
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(JobDir, DefaultIsPerUser) {
  EXPECT_EQ(default_job_dir("tiny", 1234), "/tmp/ringmaster-1234/jobs/tiny");
  EXPECT_EQ(user_root(0), "/tmp/ringmaster-0");
  for (const char* bad : {"", ".", "..", "a/b", "../x"})
    EXPECT_TRUE(contains(error_of([&] { default_job_dir(bad, 1); }), "cannot name a directory"))
        << bad;
}

// A --job-dir: created 0700 with logs/; refused when it is another user's, writable by everyone,
// not a directory, or when logs/ is a symlink; a symlink the user made to their own directory
// is fine.
TEST(JobDir, GivenDirectoryIsOursPrivateAndWritable) {
  TempDir t;
  std::string d = prepare_job_dir(t.path + "/a/b/job/");
  EXPECT_EQ(d, t.path + "/a/b/job");
  EXPECT_EQ(mode_of(d), 0700u);
  EXPECT_EQ(mode_of(d + "/logs"), 0700u);
  EXPECT_EQ(prepare_job_dir(d), d);  // again: fine
  // Group-writable (a project directory) is accepted.
  ASSERT_EQ(chmod(d.c_str(), 0770), 0);
  EXPECT_EQ(prepare_job_dir(d), d);

  std::string open_dir = t.path + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);
  EXPECT_TRUE(contains(error_of([&] { prepare_job_dir(open_dir); }),
                       "job directory " + open_dir + " is writable by every user (mode 1777)"));

  std::string file = t.path + "/file";
  std::ofstream(file) << "x";
  EXPECT_TRUE(contains(error_of([&] { prepare_job_dir(file); }),
                       "job directory " + file + " exists and is not a directory"));

  std::string link = t.path + "/link";
  fs::create_directory_symlink(d, link);
  EXPECT_EQ(prepare_job_dir(link), link);

  std::string planted = t.path + "/planted";
  ASSERT_EQ(mkdir(planted.c_str(), 0700), 0);
  fs::create_directory_symlink(t.path + "/a", planted + "/logs");
  EXPECT_TRUE(contains(error_of([&] { prepare_job_dir(planted); }),
                       "log directory " + planted + "/logs is a symbolic link"));

  if (geteuid() != 0) GTEST_SKIP() << "the rest needs root (chown to nobody)";
  std::string theirs = t.path + "/theirs";
  ASSERT_EQ(mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(chown(theirs.c_str(), kNobody, kNobody), 0);
  EXPECT_TRUE(contains(error_of([&] { prepare_job_dir(theirs); }),
                       "job directory " + theirs + " is owned by nobody (uid 65534), not by you"));
}

// What `ringctl run` met in the issue: a job directory whose logs/ exists but cannot be written
// (ringd then failed on every worker log). Refused up front, naming the directory.
TEST(JobDir, UnwritableLogsAreFoundUpFront) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a directory for nobody)";
  TempDir t;
  ASSERT_EQ(chmod(t.path.c_str(), 0755), 0);
  std::string d = t.path + "/job";
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((d + "/logs").c_str(), 0500), 0);
  ASSERT_EQ(chown(d.c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(chown((d + "/logs").c_str(), kNobody, kNobody), 0);
  std::string e = as_nobody([&] { return prepare_job_dir(d); });
  EXPECT_EQ(e, "cannot create files in " + d +
                   "/logs: Permission denied (the job writes its logs, steps and spec copy "
                   "there); pass --job-dir DIR where you may write");
}

// The default, for nobody: created 0700 under /tmp/ringmaster-65534 (root 0700, jobs/ 0700); a
// planted symlink, a root owned by someone else or writable by others is refused with the path.
TEST(JobDir, DefaultIsCheckedLikeTheSocketDirectory) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (becomes nobody)";
  const std::string root = user_root(kNobody);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(root, ec)))
    GTEST_SKIP() << root << " exists (nobody's own); not touching it";
  struct Cleanup {
    std::string root;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } cleanup{root};
  const std::string name = "jd-test-" + std::to_string(getpid());

  std::string r = as_nobody([&] { return prepare_default_job_dir(name); });
  EXPECT_EQ(r, "ok:" + root + "/jobs/" + name);
  EXPECT_EQ(mode_of(root), 0700u);
  EXPECT_EQ(mode_of(root + "/jobs"), 0700u);
  EXPECT_EQ(mode_of(root + "/jobs/" + name), 0700u);
  EXPECT_EQ(mode_of(root + "/jobs/" + name + "/logs"), 0700u);
  // 0711 (ring-coord's shared socket directory) is fine for the root.
  ASSERT_EQ(chmod(root.c_str(), 0711), 0);
  EXPECT_EQ(as_nobody([&] { return prepare_default_job_dir(name); }),
            "ok:" + root + "/jobs/" + name);

  // Another user planted the job's directory as a symlink (jobs/ made reachable to do so).
  std::string victim = root + "/jobs/" + name + "-2";
  fs::create_directory_symlink("/etc", victim);
  EXPECT_TRUE(contains(as_nobody([&] { return prepare_default_job_dir(name + "-2"); }),
                       "job directory " + victim + " is a symbolic link; refusing to use it"));
  fs::remove(victim);

  // The per-user root belongs to someone else (made by them before nobody's first run).
  fs::remove_all(root);
  ASSERT_EQ(mkdir(root.c_str(), 0755), 0);
  EXPECT_TRUE(contains(as_nobody([&] { return prepare_default_job_dir(name); }),
                       "directory " + root + " is owned by root (uid 0), not by you"));
  // ... or is a symlink to a directory of theirs.
  fs::remove_all(root);
  TempDir elsewhere;
  fs::create_directory_symlink(elsewhere.path, root);
  EXPECT_TRUE(contains(as_nobody([&] { return prepare_default_job_dir(name); }),
                       "directory " + root + " is a symbolic link"));
  fs::remove(root);
  // nobody's own root, but writable by others.
  ASSERT_EQ(mkdir(root.c_str(), 0777), 0);
  ASSERT_EQ(chmod(root.c_str(), 0777), 0);
  ASSERT_EQ(chown(root.c_str(), kNobody, kNobody), 0);
  EXPECT_TRUE(contains(as_nobody([&] { return prepare_default_job_dir(name); }),
                       "directory " + root +
                           " has mode 0777; it must not be writable by group "
                           "or others"));
}

TEST(JobDir, NodeLocalPlaces) {
  EXPECT_EQ(node_local_reason("/tmp/x/job"), "under /tmp");
  EXPECT_EQ(node_local_reason("/tmp"), "under /tmp");
  EXPECT_EQ(node_local_reason("/dev/shm/job"), "under /dev/shm");
  EXPECT_EQ(node_local_reason("/run/user/0/job"), "under /run");
  EXPECT_EQ(node_local_reason("/var/tmp/job"), "under /var/tmp");
  EXPECT_EQ(node_local_reason("/var/../tmp/job"), "under /tmp");
  EXPECT_EQ(node_local_reason("/tmpfoo/job").rfind("under", 0), std::string::npos);
  // Through a symlink made elsewhere (the build tree; itself under /tmp in a checkout there).
  std::string link = std::string(RING_BINARY_DIR) + "/jobdir-test-link-" + std::to_string(getpid());
  std::error_code ec;
  fs::remove(link, ec);
  fs::create_directory_symlink("/dev/shm", link);
  std::string why = node_local_reason(link + "/job");
  EXPECT_TRUE(why == "under /dev/shm (/dev/shm/job)" || why == "under /tmp") << why;
  fs::remove(link);
}

}  // namespace ring::jobdir
