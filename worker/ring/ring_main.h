// ring-worker's multi-rank mode (context parallelism over P processes, no daemon needed):
//
//   ring-worker --spec F --rank R --world P --rendezvous DIR [--transport ucx]   one rank
//   ring-worker --spec F --launch-local          forks P = context_ranks x data_replicas ranks
//
// With data replicas (D > 1) the P ranks form D rings of context_ranks ranks, each training on
// its own sequences of the step (ring_rank.h); train.micro_batches sequences per replica per
// step accumulate their gradients before the one update.
//
// The launcher makes a fresh rendezvous directory, starts the P ranks as one rank group
// (common/proc/rank_group.h; each
// dies with it), forwards SIGINT/SIGTERM/SIGHUP to them, and when one rank fails stops the others
// (SIGTERM, SIGKILL after 5 s); it exits with the first failure's status and removes the
// directory. ringd spawns ranks with the same flags (daemon/ringd/supervisor.h).
//
// One file per program (declared in ring_programs.h): rank_local.cc (a rank with the optimizer
// in-process), rank_offloaded.cc (a rank under ringd, --ringd: the optimizer offloaded to it) and
// launch_local.cc (the launcher); rank_setup.h their shared set-up; ring_main.cc only dispatches.
#pragma once

#include "worker/flags.h"

namespace ring::cp {

// main() of the multi-rank mode (flags.mode is kLaunchLocal or kRank; argc/argv are the
// launcher's own, passed on to its ranks); returns the process exit status (0 ok, 1 runtime
// failure, 2 usage or spec error).
int ring_main(const worker::Flags& flags, int argc, char** argv);

}  // namespace ring::cp
