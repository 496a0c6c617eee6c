// The job directory: where a job's logs, steps.jsonl, spec copy, rendezvous and (with a relative
// or no checkpoint.dir) checkpoints go. One rule for every program that picks or checks one:
// ringctl run and submit, ringd (when no --job-dir is given), and ring-coord (what it records
// for a job submitted without one).
//
//   default:  /tmp/ringmaster-<uid>/jobs/<job.name>
//
// Why there: /tmp is the node's local disk, large enough for logs and small checkpoints, as the
// old default (/tmp/ringmaster/<name>) was; the per-uid root is the same one ring-coord uses for
// its socket when $XDG_RUNTIME_DIR is unset, so one user's files sit under one directory that
// only that user owns. Not $XDG_RUNTIME_DIR (a small tmpfs, emptied at logout, absent in batch
// jobs), not $TMPDIR (Slurm points it at a per-job directory that goes when the job ends), not
// the home directory (a small quota on NFS on most clusters, and checkpoints are large). A
// multi-node job needs a shared file system instead: `ringctl submit` requires --job-dir there.
//
// The checks are those of ring-coord's socket directory (coordinator/security.cc): the per-uid
// root and everything under it are real directories (not symlinks) owned by us; the root is not
// writable by group or others (it may be 0711 when ring-coord shares its socket), jobs/ and the
// job's directory are 0700. A directory given with --job-dir may be a symlink and may be group
// writable (project directories often are), but it must be ours and not writable by everyone,
// and we must be able to create files in it. Violations throw JobDirError naming the path, what
// was found and what to do.
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>

namespace ring::jobdir {

class JobDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// /tmp/ringmaster-<uid>: the per-user root.
std::string user_root(uid_t uid);
// /tmp/ringmaster-<uid>/jobs/<job_name>, the default for a job of `uid`. Pure: creates nothing.
// Throws JobDirError when job_name could leave jobs/ ("", ".", "..", a '/').
std::string default_job_dir(const std::string& job_name, uid_t uid);

// Creates the default job directory of `job_name` for this process's euid (root, jobs/ and the
// job's directory, each checked) and returns its path.
std::string prepare_default_job_dir(const std::string& job_name);

// Creates `dir` (0700, parents as needed) if missing, checks it (see above), creates
// <dir>/logs (0700) and proves that a file can be created there. Returns the absolute,
// normalised path.
std::string prepare_job_dir(const std::string& dir);

// Whether `dir` is on a node-local file system that other nodes of a cluster cannot see:
// under /tmp, /var/tmp, /dev/shm or /run (as written or once symlinks are resolved), or on a
// tmpfs/ramfs. Returns the reason ("under /tmp", "on a tmpfs"), or "" when it may be shared.
std::string node_local_reason(const std::string& dir);

}  // namespace ring::jobdir
