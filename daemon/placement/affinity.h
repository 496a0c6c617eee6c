// Applying a worker's cpuset (placement.h) to a running process.
#pragma once

#include <sys/types.h>

#include <vector>

namespace ring::placement {

// Restricts every thread of process `pid` (0: the calling process) to `cpus` (OS CPU indices).
// ringd calls it on a worker right after spawning it, before the worker starts its own threads;
// threads created later inherit the mask. Throws PlacementError naming the pid, the CPUs and
// the errno text when the list is empty, an index is out of range or the kernel refuses (for
// instance CPUs outside the job's cgroup).
void apply_cpuset(pid_t pid, const std::vector<int>& cpus);

// The CPUs thread `tid` (0: the calling thread) may run on, ascending.
std::vector<int> get_cpuset(pid_t tid);

}  // namespace ring::placement
