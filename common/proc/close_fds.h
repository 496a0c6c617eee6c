// Closing inherited descriptors in a child between fork and exec.
//
// A child must not inherit the parent's sockets, shared-memory handles or files (a worker holding
// ringd's coordinator socket, a daemon holding ringctl's terminal pipe). Not every descriptor is
// opened with O_CLOEXEC (libraries, inherited ones), so the child closes every descriptor from 3
// up before exec. Only async-signal-safe calls are allowed there (other threads of the parent may
// hold locks), so the limit is read before fork:
//
//   const int max_fd = ring::proc::descriptor_limit();   // before fork
//   if (fork() == 0) { dup2(...); ring::proc::close_descriptors_from(3, max_fd); execve(...); }
#pragma once

namespace ring::proc {

// One past the highest descriptor the process may open (RLIMIT_NOFILE, at most 2^20; 65536 when
// unlimited or unknown). Not async-signal-safe-sensitive: call it before fork.
int descriptor_limit();

// Closes every descriptor >= low: close_range(2) when the kernel has it (Linux 5.9), else one
// close() per possible descriptor below max_fd (no /proc walk: opendir allocates).
// Async-signal-safe.
void close_descriptors_from(int low, int max_fd) noexcept;

// The same, but `keep` stays open (a close-on-exec pipe that reports a failed exec). Async-signal-safe.
void close_descriptors_except(int low, int keep, int max_fd) noexcept;

}  // namespace ring::proc
