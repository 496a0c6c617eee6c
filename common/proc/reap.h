// Reaping a group of children that fail together (the ranks of a ring, ringd's workers), so that
// the one to blame is reported.
//
// When one rank is killed its peers notice within milliseconds and exit with an error. A killed
// process turns zombie at once (its main thread has exited), but it can be reaped only after all
// its threads have exited, which on a loaded machine can come after its peers have exited and
// been reaped. reap_ended collects what has ended and, when it found only failures that are not
// signals, also waits a little for any watched child that is already a zombie; the result lists
// the signalled ones (the causes) first.
//
//   for (auto [pid, status] : ring::proc::reap_ended(worker_pids, is_cause)) ...
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ring::proc {

// Whether pid has exited and waits to be reaped (state Z in /proc/<pid>/stat). False when there
// is no such process.
bool is_zombie(pid_t pid);

// Every child that has ended (waitpid(-1, WNOHANG) until none), as (pid, wait status). If some
// ended with a failure (!clean) and none is a cause (is_cause(status)), each of `watched` still
// unreaped that is a zombie is waited for (up to `grace` in all) and added. The result is
// ordered causes first, otherwise in reaping order.
std::vector<std::pair<pid_t, int>> reap_ended(
    const std::vector<pid_t>& watched, const std::function<bool(int status)>& is_cause,
    std::chrono::milliseconds grace = std::chrono::milliseconds(1000));

// A wait status in words: "exited with status 3", "was killed by signal 9 (Killed)", "stopped".
std::string describe_status(int status);

}  // namespace ring::proc
