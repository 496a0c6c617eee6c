#include "common/proc/close_fds.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace ring::proc {

int descriptor_limit() {
  struct rlimit nofile {};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY)
    return static_cast<int>(std::min<rlim_t>(nofile.rlim_cur, rlim_t{1} << 20));
  return 65536;
}

void close_descriptors_from(int low, int max_fd) noexcept {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, static_cast<unsigned>(low), ~0u, 0u) == 0) return;
#endif
  for (int f = low; f < max_fd; ++f) ::close(f);
}

void close_descriptors_except(int low, int keep, int max_fd) noexcept {
  if (keep < low) return close_descriptors_from(low, max_fd);
#ifdef SYS_close_range
  if (keep == low || syscall(SYS_close_range, static_cast<unsigned>(low),
                             static_cast<unsigned>(keep - 1), 0u) == 0) {
    close_descriptors_from(keep + 1, max_fd);
    return;
  }
#endif
  for (int f = low; f < keep; ++f) ::close(f);
  close_descriptors_from(keep + 1, max_fd);
}

}  // namespace ring::proc
