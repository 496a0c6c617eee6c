// Replacing a file all at once: readers (and a machine that crashes midway) see the old content
// or the new one, never a part, and never a file written through a planted link.
//
//   ring::files::write_file_atomic(dir + "/job.sbatch", script, 0700);
//
// The text goes to a fresh temporary in the same directory (O_CREAT|O_EXCL|O_NOFOLLOW: never an
// existing file or a link), gets exactly `mode` (the umask does not apply), is fsynced, renamed
// over the path, and the directory is fsynced so that the rename itself survives a crash.
// Used for ringctl submit's spec copy and sbatch script, ring-coord's CURVE keys and the
// checkpoint manifests.
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace ring::files {

// "cannot write PATH: STEP: REASON" (STEP: create TMP, write TMP, fsync TMP, rename TMP, fsync
// directory DIR).
class AtomicWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Replaces `path` with `text` (see above). fsync = false skips both fsyncs (tests and benchmarks
// on tmpfs); the rename is atomic still. On failure the temporary is removed and `path` is left
// as it was. Throws AtomicWriteError.
void write_file_atomic(const std::string& path, std::string_view text, mode_t mode = 0600,
                       bool fsync = true);

}  // namespace ring::files
