// The three programs of ring-worker's multi-rank mode (internal to worker/ring/), which
// ring_main (ring_main.h) dispatches to; their shared set-up is rank_setup.h. Each returns the
// process exit status (rank_setup.h's kExit*).
#pragma once

#include "common/spec/spec.h"
#include "worker/flags.h"

namespace ring::cp {

// rank_local.cc: a rank of a ring with the optimizer in-process (started by launch_local or by
// hand), training `spec` (load_rank_spec's) for --steps or train.steps steps.
int run_rank(const worker::Flags& args, const spec::JobSpec& spec);

// rank_offloaded.cc: a rank driven by ringd (--ringd), the optimizer offloaded to it; ringd
// decides the number of steps.
int run_offloaded_rank(const worker::Flags& args, const spec::JobSpec& spec);

// launch_local.cc: --launch-local, the local launcher: starts the spec's ranks as one rank group
// on a fresh rendezvous directory (argc/argv are its own, passed on to the ranks).
int launch_local(int argc, char** argv, const worker::Flags& args);

}  // namespace ring::cp
