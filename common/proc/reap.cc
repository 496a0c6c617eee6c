#include "common/proc/reap.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "common/proc/read_file.h"

namespace ring::proc {

bool is_zombie(pid_t pid) { return process_state(pid) == 'Z'; }

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
           strsignal(WTERMSIG(st)) + ")";
  return "stopped";
}

std::vector<std::pair<pid_t, int>> reap_ended(const std::vector<pid_t>& watched,
                                              const std::function<bool(int)>& is_cause,
                                              std::chrono::milliseconds grace) {
  std::vector<std::pair<pid_t, int>> ended;
  for (;;) {
    int st = 0;
    const pid_t got = waitpid(-1, &st, WNOHANG);
    if (got <= 0) break;
    ended.emplace_back(got, st);
  }
  const auto clean = [](int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; };
  const bool failure =
      std::any_of(ended.begin(), ended.end(), [&](auto& e) { return !clean(e.second); });
  const bool cause =
      std::any_of(ended.begin(), ended.end(), [&](auto& e) { return is_cause(e.second); });
  if (failure && !cause) {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (pid_t p : watched) {
      if (p <= 0 || std::any_of(ended.begin(), ended.end(), [&](auto& e) { return e.first == p; }))
        continue;
      if (!is_zombie(p)) continue;
      for (;;) {
        int st = 0;
        const pid_t got = waitpid(p, &st, WNOHANG);
        if (got == p) {
          ended.emplace_back(got, st);
          break;
        }
        if (got < 0 || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
  std::stable_partition(ended.begin(), ended.end(), [&](auto& e) { return is_cause(e.second); });
  return ended;
}

}  // namespace ring::proc
