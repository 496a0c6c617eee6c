// ringd for a job.kind generate spec: the node's workers are `ring-worker --generate` ranks (the
// generation of worker/generate/generate_run.h: ring-attention prefill over the ranks, the KV
// cache sharded, rank 0 writes the output) that run once and exit. ringd starts them with their
// ranks on one rendezvous, follows rank 0's progress lines, reports to ring-coord (worker_started,
// worker_exited, worker_died, completed, stopped; ringctl status/events/logs/cancel), and ends:
//   every worker exited 0               -> event completed, exit 0
//   a worker died (exit status, signal) -> the others stopped, event failed, exit 1; ring-coord
//                                          fails the job (a generate job is not restarted: it is
//                                          not resumable mid-way; run it again)
//   a stop signal                       -> the workers stopped, event stopped, exit 75
//   ring-coord's stop (ringctl cancel)  -> the workers stopped, event stopped, exit 3 (1 when
//                                          the coordinator failed the job)
// There are no steps, shared memory, optimizer or checkpoints (daemon/INTERFACE.md).
#pragma once

#include "common/spec/spec.h"
#include "daemon/ringd/options.h"

namespace ring::ringd {

// Runs the generate job `s` (validated, check_spec passed) with ringd's options; the exit status.
int run_generate_job(const Options& o, const spec::JobSpec& s);

}  // namespace ring::ringd
