// The sbatch script of `ringctl submit` (common/slurm/sbatch_script) and the parsers of Slurm's
// output (common/slurm/slurm_cli): every directive, quoting that survives bash, bad inputs, and
// the script's signal handling run by bash with stand-ins for srun/scontrol on PATH.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/proc/spawn.h"
#include "common/slurm/sbatch_script.h"
#include "common/slurm/slurm_cli.h"
#include "common/spec/parse.h"

namespace fs = std::filesystem;
using ring::slurm::ScriptError;
using ring::slurm::ScriptInputs;

namespace {

ring::spec::JobSpec tiny_spec() {
  auto r = ring::spec::load_spec_file(std::string(RING_SOURCE_DIR) + "/configs/examples/tiny.yaml");
  EXPECT_TRUE(r.ok());
  return *r.spec;
}

ScriptInputs inputs() {
  ScriptInputs in;
  in.spec_path = "/shared/jobs/tiny/spec.yaml";
  in.job_dir = "/shared/jobs/tiny";
  in.ringd = "/opt/ring/bin/ringd";
  in.ringctl = "/opt/ring/bin/ringctl";
  in.coord_endpoint = "ipc:///run/ring/coord.sock";
  in.coord_job = 7;
  return in;
}

std::vector<std::string> directives(const std::string& script) {
  std::vector<std::string> d;
  std::istringstream in(script);
  std::string l;
  while (std::getline(in, l))
    if (l.rfind("#SBATCH ", 0) == 0) d.push_back(l.substr(8));
  return d;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string sh(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

TEST(SbatchScript, EveryDirective) {
  auto s = tiny_spec();
  s.resources.nodes = 3;
  s.resources.workers_per_node = 2;
  s.resources.cpus_per_worker = 4;
  s.resources.gpus_per_node = 8;
  s.slurm.partition = "gpu";
  s.slurm.account = "proj-42";
  s.slurm.qos = "high";
  s.slurm.constraint = "h100&ib";
  s.slurm.time = "1-12:00:00";
  s.slurm.requeue = true;
  s.slurm.signal_before_s = 300;
  s.slurm.extra_sbatch = {"--exclusive", "--mail-type=END"};
  auto script = ring::slurm::render_sbatch_script(s, inputs());
  auto d = directives(script);
  EXPECT_EQ(script.rfind("#!/bin/bash\n", 0), 0u);
  for (const char* want :
       {"--job-name=tiny", "--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=8",
        "--gres=gpu:8", "--partition=gpu", "--account=proj-42", "--qos=high",
        "--constraint=h100&ib", "--time=1-12:00:00", "--requeue", "--signal=B:USR1@300",
        "--open-mode=append", "--output=/shared/jobs/tiny/slurm-%j.out", "--exclusive",
        "--mail-type=END"})
    EXPECT_TRUE(has(d, want)) << want << "\n" << script;
  EXPECT_EQ(d.size(), 16u) << script;
  // One ringd per node, tied to the coordinator, always resuming.
  EXPECT_NE(script.find("srun --nodes=3 --ntasks-per-node=1 --cpus-per-task=8 --kill-on-bad-exit=1 "
                        "\"$ringd\" --spec \"$spec\" --job-dir \"$RING_JOB_DIR\" --coord "
                        "\"$coord\" --job \"$coord_job\" --resume-if-any &"),
            std::string::npos)
      << script;
  EXPECT_NE(script.find("\ncoord=ipc:///run/ring/coord.sock\ncoord_job=7\n"), std::string::npos);
  EXPECT_NE(script.find("/opt/ring/bin/ringctl slurm-started \"$coord_job\" --coord \"$coord\""),
            std::string::npos);
  EXPECT_EQ(script.find("--ring-job"), std::string::npos) << "no SPANK options unless asked";
  // Directives come before the first command (sbatch stops reading them there).
  EXPECT_LT(script.rfind("#SBATCH"), script.find("set -u"));
}

TEST(SbatchScript, DefaultsLeaveOptionalDirectivesOut) {
  auto s = tiny_spec();
  s.slurm.requeue = false;
  s.slurm.signal_before_s = 0;
  auto in = inputs();
  in.coord_endpoint.clear();
  in.coord_job = 0;
  auto script = ring::slurm::render_sbatch_script(s, in);
  auto d = directives(script);
  EXPECT_TRUE(has(d, "--no-requeue"));
  EXPECT_TRUE(has(d, "--nodes=1"));
  EXPECT_TRUE(has(d, "--cpus-per-task=4"));  // 4 workers x 1 CPU
  for (const auto& x : d)
    for (const char* absent : {"--gres", "--partition", "--account", "--qos", "--constraint",
                               "--time", "--signal"})
      EXPECT_NE(x.rfind(absent, 0), 0u) << x;
  EXPECT_EQ(script.find("--coord"), std::string::npos);
  EXPECT_EQ(script.find("slurm-started"), std::string::npos);
  EXPECT_NE(script.find("--resume-if-any &"), std::string::npos);
}

TEST(SbatchScript, SpankOptionsWhenThePluginIsThere) {
  auto in = inputs();
  in.spank = true;
  auto script = ring::slurm::render_sbatch_script(tiny_spec(), in);
  EXPECT_NE(script.find("--ring-job=\"$coord_job\" --ring-coord=\"$coord\" \"$ringd\""),
            std::string::npos)
      << script;
  // ringd without --coord (a ringd that cannot report): the start is still recorded.
  in.ringd_reports = false;
  script = ring::slurm::render_sbatch_script(tiny_spec(), in);
  EXPECT_EQ(script.find("--job \"$coord_job\""), std::string::npos) << script;
  EXPECT_NE(script.find("slurm-started \"$coord_job\""), std::string::npos) << script;
  in.ringd_reports = true;
  // submit --dry-run: no id yet; the script wants it from the environment.
  in.coord_job = 0;
  script = ring::slurm::render_sbatch_script(tiny_spec(), in);
  EXPECT_NE(script.find("\ncoord_job=${RING_COORD_JOB:?"), std::string::npos) << script;
}

TEST(SbatchScript, ShellQuoting) {
  using ring::slurm::shell_quote;
  EXPECT_EQ(shell_quote("abc/d-e_f.g"), "abc/d-e_f.g");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
  // Paths with blanks, quotes, $ and backquotes reach the script's variables unchanged.
  auto in = inputs();
  in.job_dir = "/shared/my jobs/it's $HOME `x`";
  in.spec_path = "/shared/a b/spec;rm.yaml";
  in.ringd = "/opt/r d/ringd";
  auto script = ring::slurm::render_sbatch_script(tiny_spec(), in);
  auto d = directives(script);
  EXPECT_TRUE(has(d, "--output=\"/shared/my jobs/it's $HOME `x`/slurm-%j.out\"")) << script;
  std::string lines;
  std::istringstream is(script);
  std::string l;
  while (std::getline(is, l))
    if (l.rfind("export RING_JOB_DIR=", 0) == 0 || l.rfind("spec=", 0) == 0 ||
        l.rfind("ringd=", 0) == 0)
      lines += l + "\n";
  fs::path f = fs::temp_directory_path() / ("sbatch_quote_" + std::to_string(getpid()));
  std::ofstream(f) << lines << "printf '%s|%s|%s' \"$RING_JOB_DIR\" \"$spec\" \"$ringd\"\n";
  EXPECT_EQ(sh("bash " + f.string()),
            "/shared/my jobs/it's $HOME `x`|/shared/a b/spec;rm.yaml|/opt/r d/ringd");
  fs::remove(f);
  // The whole script is valid bash.
  fs::path g = fs::temp_directory_path() / ("sbatch_syntax_" + std::to_string(getpid()));
  std::ofstream(g) << script;
  EXPECT_EQ(sh("bash -n " + g.string() + " 2>&1; echo rc=$?"), "rc=0\n");
  fs::remove(g);
}

TEST(SbatchScript, BadInputsNameTheProblem) {
  auto s = tiny_spec();
  auto expect_error = [&](ScriptInputs in, const ring::spec::JobSpec& sp, const std::string& what) {
    try {
      ring::slurm::render_sbatch_script(sp, in);
      ADD_FAILURE() << "no error; expected one containing: " << what;
    } catch (const ScriptError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto in = inputs();
  in.spec_path = "jobs/spec.yaml";
  expect_error(in, s, "spec path: 'jobs/spec.yaml' is not an absolute path");
  in = inputs();
  in.job_dir = "/a\nb";
  expect_error(in, s, "job dir: the path contains a line break");
  in = inputs();
  in.job_dir = "/jobs/100%";
  expect_error(in, s, "contains '%', which sbatch expands");
  in = inputs();
  in.job_dir = "/jobs/\"x\"";
  expect_error(in, s, "job dir: contains a double quote");
  in = inputs();
  in.ringd = "";
  expect_error(in, s, "ringd: empty path");
  in = inputs();
  in.coord_job = -3;
  expect_error(in, s, "coordinator job id must be positive, got -3");
  auto bad = s;
  bad.slurm.extra_sbatch = {"--comment=a\nrm -rf /"};
  expect_error(inputs(), bad, "slurm.extra_sbatch: item");
  bad = s;
  bad.slurm.extra_sbatch = {"exclusive"};
  expect_error(inputs(), bad, "is not an sbatch option");
  bad = s;
  bad.slurm.partition = "a\"b";
  expect_error(inputs(), bad, "slurm.partition: contains a double quote");
  bad = s;
  bad.resources.nodes = 0;
  expect_error(inputs(), bad, "resources.nodes: 0 is below 1");
}

TEST(SlurmCli, ScontrolRecord) {
  std::string line =
      "JobId=42 JobName=tiny UserId=root(0) GroupId=root(0) Priority=1 JobState=PENDING "
      "Reason=BeginTime Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:15 "
      "RunTime=00:00:07 TimeLimit=UNLIMITED SubmitTime=2026-01-01T10:00:00 StartTime=Unknown "
      "Partition=low NodeList=(null) Command=/tmp/my jobs/job.sbatch WorkDir=/tmp";
  auto rec = ring::slurm::parse_scontrol_record(line);
  EXPECT_EQ(rec["Command"], "/tmp/my jobs/job.sbatch");
  EXPECT_EQ(rec["UserId"], "root(0)");
  auto v = ring::slurm::job_view_from_scontrol(rec);
  EXPECT_TRUE(v.found);
  EXPECT_EQ(v.id, "42");
  EXPECT_EQ(v.state, "PENDING");
  EXPECT_EQ(v.reason, "BeginTime");
  EXPECT_EQ(v.restarts, 2);
  EXPECT_EQ(v.nodes, "");
  EXPECT_EQ(v.exit_code, "0:15");
  EXPECT_EQ(v.partition, "low");
  EXPECT_EQ(v.start_time, "");
  EXPECT_EQ(ring::slurm::summary(v), "PENDING (BeginTime), 2 restarts");
  v.state = "COMPLETED";
  v.reason = "";
  v.nodes = "node[1-2]";
  v.restarts = 1;
  EXPECT_EQ(ring::slurm::summary(v), "COMPLETED on node[1-2], exit 0:15, 1 restart");
  EXPECT_EQ(ring::slurm::to_json(v)["restarts"], 1);
  EXPECT_EQ(ring::slurm::summary(ring::slurm::JobView{}),
            "not known to Slurm (finished long ago, or another cluster)");
}

TEST(SlurmCli, SbatchParsableAndJobIds) {
  using ring::slurm::parse_sbatch_parsable;
  EXPECT_EQ(parse_sbatch_parsable("1234\n"), "1234");
  EXPECT_EQ(parse_sbatch_parsable("1234;cluster\n"), "1234");
  EXPECT_EQ(parse_sbatch_parsable("sbatch: warning: x\n77\n"), "77");
  EXPECT_THROW(parse_sbatch_parsable("sbatch: error: Batch job submission failed"),
               ring::slurm::SlurmError);
  EXPECT_TRUE(ring::slurm::valid_job_id("12_3"));
  EXPECT_FALSE(ring::slurm::valid_job_id("12;rm"));
  EXPECT_FALSE(ring::slurm::valid_job_id(""));
  EXPECT_THROW(ring::slurm::cancel("1 2"), ring::slurm::SlurmError);
  EXPECT_THROW(ring::slurm::requeue_excluding("1;2", {"node2"}), ring::slurm::SlurmError);
  EXPECT_THROW(ring::slurm::requeue_excluding("12", {"node[2-3]"}), ring::slurm::SlurmError);
}

// sinfo -h -N -o "%N|%T" as Slurm 22.05 prints it: a node per partition it is in; '*' is "not
// responding".
TEST(SlurmCli, UnhealthyNodesFromSinfo) {
  EXPECT_EQ(ring::slurm::parse_unhealthy_nodes("node1|idle\nnode1|idle\nnode2|down*\nnode2|down*\n"
                                               "node3|drained\nnode4|allocated*\nnode5|mixed\n"
                                               "node6|draining\nnode7|fail\nnode8|completing\n"
                                               "garbage\n|down\n"),
            (std::vector<std::string>{"node2", "node3", "node4", "node6", "node7"}));
  EXPECT_TRUE(ring::slurm::parse_unhealthy_nodes("").empty());
}

// A directory where a rendered batch script runs under bash with stand-ins on PATH: bin/srun runs
// its command in place; the test adds what else it needs (write_exe) and starts the script
// (start) with extra environment.
struct ScriptSandbox {
  fs::path dir;
  explicit ScriptSandbox(const std::string& name)
      : dir(fs::temp_directory_path() / (name + "_" + std::to_string(getpid()))) {
    fs::create_directories(dir / "bin");
    write_exe(dir / "bin/srun",
              "#!/bin/bash\nwhile [ \"${1#--}\" != \"$1\" ]; do shift; done\nexec \"$@\"\n");
  }
  ~ScriptSandbox() { fs::remove_all(dir); }
  static void write_exe(const fs::path& p, const std::string& text) {
    std::ofstream(p) << text;
    chmod(p.c_str(), 0755);
  }
  ScriptInputs inputs() const {
    ScriptInputs in;
    in.spec_path = (dir / "spec.yaml").string();
    in.job_dir = (dir / "job").string();
    in.ringd = (dir / "ringd").string();
    return in;
  }
  // Runs `bash job.sbatch` (output in out.txt) with `env` ("K=V K2=V2") in its environment.
  pid_t start(const std::string& script, const std::string& env) {
    std::ofstream(dir / "job.sbatch") << script;
    std::string cmd = "cd " + dir.string() + " && PATH=" + (dir / "bin").string() + ":$PATH " + env +
                      " exec bash job.sbatch > out.txt 2>&1";
    ring::proc::SpawnOptions so;
    so.argv = {"/bin/bash", "-c", cmd};
    so.death_signal = SIGKILL;
    const ring::proc::Spawned child = ring::proc::spawn(so);
    EXPECT_TRUE(child) << child.error;
    return child ? child.pid : -1;
  }
  std::string slurp(const std::string& rel) const {
    std::ifstream f(dir / rel);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
};

// The script's own logic, run by bash: Slurm's warning (SIGUSR1 to the batch shell) reaches
// ringd, which exits 75; the script then requeues the job. srun and scontrol are stand-ins on
// PATH (srun runs the command in place, scontrol records its arguments); the cluster tests run
// the real ones.
TEST(SbatchScript, TimeLimitWarningReachesRingdAndRequeues) {
  ScriptSandbox sb("sbatch_sig");
  sb.write_exe(sb.dir / "bin/scontrol",
               "#!/bin/bash\necho \"$*\" >> \"$RING_JOB_DIR/scontrol.calls\"\n");
  sb.write_exe(sb.dir / "ringd",
               "#!/bin/bash\necho \"$*\" > \"$RING_JOB_DIR/ringd.args\"\n"
               "trap 'echo usr1 > \"$RING_JOB_DIR/ringd.signal\"; exit 75' USR1\n"
               "touch \"$RING_JOB_DIR/ringd.ready\"\nwhile :; do sleep 0.05; done\n");
  auto s = tiny_spec();
  s.slurm.signal_before_s = 60;
  ScriptInputs in = sb.inputs();
  const pid_t pid = sb.start(ring::slurm::render_sbatch_script(s, in),
                             "SLURM_JOB_ID=99 SLURM_JOB_NODELIST=node1");
  ASSERT_GT(pid, 0);
  // Generous: the script starts bash, the fake srun and the fake ringd on a loaded machine.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(sb.dir / "job/ringd.ready") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  if (!fs::exists(sb.dir / "job/ringd.ready")) kill(pid, SIGKILL);
  ASSERT_TRUE(fs::exists(sb.dir / "job/ringd.ready"));
  kill(pid, SIGUSR1);  // what --signal=B:USR1@60 does
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 75);
  EXPECT_EQ(sb.slurp("job/ringd.signal"), "usr1\n");
  EXPECT_EQ(sb.slurp("job/scontrol.calls"), "requeue 99\n");
  EXPECT_EQ(sb.slurp("job/ringd.args"),
            "--spec " + in.spec_path + " --job-dir " + in.job_dir + " --resume-if-any\n");
  std::string out = sb.slurp("out.txt");
  EXPECT_NE(out.find("ringmaster: Slurm job 99, start 1, nodes node1"), std::string::npos) << out;
  EXPECT_NE(out.find("time-limit warning"), std::string::npos) << out;
  EXPECT_NE(out.find("requeueing before the time limit"), std::string::npos) << out;
}

// Issue 31, point 16: a start whose allocation holds a node the job excludes (`ringctl
// slurm-started` exits 10) starts no ringd; the script waits for ring-coord's requeue without
// that node, which ends it (Slurm's SIGTERM; here the test's).
TEST(SbatchScript, AnAllocationWithAnExcludedNodeStartsNoRingd) {
  ScriptSandbox sb("sbatch_exc");
  sb.write_exe(sb.dir / "ringctl",
               "#!/bin/bash\necho \"$*\" > \"$RING_JOB_DIR/ringctl.args\"\n"
               "echo 'ringmaster: ring-coord job 7 is restarting (this allocation holds excluded "
               "node2; ring-coord requeues the job without)'\nexit 10\n");
  sb.write_exe(sb.dir / "ringd", "#!/bin/bash\necho \"$*\" > \"$RING_JOB_DIR/ringd.args\"\n");
  ScriptInputs in = sb.inputs();
  in.ringctl = (sb.dir / "ringctl").string();
  in.coord_endpoint = "ipc:///run/ring/coord.sock";
  in.coord_job = 7;
  const pid_t pid =
      sb.start(ring::slurm::render_sbatch_script(tiny_spec(), in),
               "SLURM_JOB_ID=99 SLURM_RESTART_COUNT=1 SLURM_JOB_NODELIST='node[1-2]'");
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (sb.slurp("out.txt").find("waiting for the requeue") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  std::string out = sb.slurp("out.txt");
  EXPECT_NE(out.find("holds a node the job excludes; waiting for the requeue without it"),
            std::string::npos)
      << out;
  // The script decides before it waits: had it started ringd, that would have come first.
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(sb.dir / "job/ringd.args")) << sb.slurp("job/ringd.args");
  EXPECT_EQ(sb.slurp("job/ringctl.args"),
            "slurm-started 7 --coord ipc:///run/ring/coord.sock --slurm-job 99 --restarts 1 "
            "--nodes node[1-2]\n");
}
