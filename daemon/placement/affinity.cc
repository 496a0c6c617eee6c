#include "daemon/placement/affinity.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "daemon/placement/errors.h"
#include "daemon/placement/gpu_topology.h"

namespace ring::placement {

namespace {

// Large enough for any machine Linux supports (CONFIG_NR_CPUS max 8192).
constexpr int kMaxCpus = 8192;

struct CpuSet {
  cpu_set_t* set = CPU_ALLOC(kMaxCpus);
  size_t size = CPU_ALLOC_SIZE(kMaxCpus);
  CpuSet() { CPU_ZERO_S(size, set); }
  ~CpuSet() { CPU_FREE(set); }
  CpuSet(const CpuSet&) = delete;
  CpuSet& operator=(const CpuSet&) = delete;
};

}  // namespace

void apply_cpuset(pid_t pid, const std::vector<int>& cpus) {
  if (cpus.empty()) throw PlacementError(fmt::format("empty cpuset for pid {}", pid));
  CpuSet s;
  if (!s.set) throw PlacementError("CPU_ALLOC failed");
  for (int c : cpus) {
    if (c < 0 || c >= kMaxCpus) {
      throw PlacementError(
          fmt::format("CPU {} is out of range for pid {} (0..{})", c, pid, kMaxCpus - 1));
    }
    CPU_SET_S(static_cast<size_t>(c), s.size, s.set);
  }
  // sched_setaffinity acts on one thread; a process's threads are listed in /proc/<pid>/task.
  std::vector<pid_t> tids;
  const pid_t target = pid == 0 ? getpid() : pid;
  std::string dir = fmt::format("/proc/{}/task", target);
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (d) {
    while (dirent* e = readdir(d.get())) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      tids.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
    }
  }
  if (tids.empty()) tids.push_back(target);  // no /proc: the main thread at least
  for (pid_t tid : tids) {
    if (sched_setaffinity(tid, s.size, s.set) != 0) {
      int err = errno;
      // A thread that exited between readdir and the call is not an error.
      if (err == ESRCH && tid != target) continue;
      throw PlacementError(fmt::format("sched_setaffinity(pid {}, thread {}, CPUs {}) failed: {}",
                                       target, tid, format_cpu_list(cpus), std::strerror(err)));
    }
  }
}

std::vector<int> get_cpuset(pid_t tid) {
  CpuSet s;
  if (sched_getaffinity(tid, s.size, s.set) != 0) {
    throw PlacementError(
        fmt::format("sched_getaffinity(thread {}) failed: {}", tid, std::strerror(errno)));
  }
  std::vector<int> out;
  for (int c = 0; c < kMaxCpus; ++c)
    if (CPU_ISSET_S(static_cast<size_t>(c), s.size, s.set)) out.push_back(c);
  return out;
}

}  // namespace ring::placement
