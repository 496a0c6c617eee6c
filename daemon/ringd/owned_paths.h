// Files and directories that ringd creates, checks and may delete.
//
// ringd deletes only what it created and marked as its own: a directory is removed only when it
// is a real directory (not a symbolic link), owned by our euid, and holds the marker file
// `.ringmaster` (a regular file of ours) that ringd wrote into it when it created it. A
// directory the user named (`--rendezvous ~/work`, a job directory) is never removed, only the
// marked attempt and socket directories ringd made inside it.
//
// ringd's control sockets live in a per-user runtime directory, checked like ring-coord's socket
// directory (coordinator/security.h): <base>/ringd/ringd-<pid>, where <base> is
// $XDG_RUNTIME_DIR/ringmaster (when XDG_RUNTIME_DIR is a directory of ours) or
// /tmp/ringmaster-<euid>. The marker of a socket directory names the ringd's pid, its start
// time and its pid namespace, so the directory of a ringd that died (kill -9) is recognised and
// removed by the next ringd of the same user in the same pid namespace, and the directory of a
// live ringd (even one whose pid was reused, or one in another container) never.
#pragma once

#include <sys/types.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace ring::ringd {

class PathError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kMarkerName = ".ringmaster";

// Creates `dir` (mode 0700) when missing and checks it: a real directory, owned by our euid, no
// bit of `forbidden` set in its mode (0077: private; 0022: not writable by others). Throws
// PathError naming the path, what was found and the fix.
void ensure_own_dir(const std::string& dir, mode_t forbidden = 0077);

// Writes the marker `<dir>/.ringmaster` (0600, O_NOFOLLOW) holding `text`; the directory must
// pass ensure_own_dir(dir, 0022). Throws PathError.
void mark_own_dir(const std::string& dir, const std::string& text);

// True when `dir` is a real directory owned by our euid holding a marker file of ours; `why`
// (when given) says what is missing otherwise.
bool is_own_marked_dir(const std::string& dir, std::string* why = nullptr);

// Removes `dir` and its contents when is_own_marked_dir(dir) (symbolic links inside are removed,
// never followed). Returns false, with the reason in `why`, when it is not ours or removal failed.
bool remove_own_dir(const std::string& dir, std::string* why = nullptr);

// The per-user runtime base (see above), created 0700 when missing and checked: ours, not
// writable by others. Throws PathError.
std::string runtime_base_dir();

// Creates this ringd's private control directory <runtime_base_dir()>/ringd/ringd-<pid> (0700,
// marked with pid and start time) after removing the marked directories of ringd processes of
// ours that are gone (`note` is told about each). Throws PathError.
std::string make_control_dir(const std::function<void(const std::string&)>& note);

// Start time of a process (field 22 of /proc/<pid>/stat, clock ticks since boot); -1 when there
// is no such process.
long long process_start_time(pid_t pid);

}  // namespace ring::ringd
