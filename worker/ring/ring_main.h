// ring-worker's multi-rank mode (context parallelism over P processes, no daemon needed):
//
//   ring-worker --spec F --rank R --world P --rendezvous DIR [--transport ucx]   one rank
//   ring-worker --spec F --launch-local                       forks P = context_ranks ranks
//
// The launcher makes a fresh rendezvous directory, starts the P ranks (each dies with it:
// PR_SET_PDEATHSIG), forwards SIGINT/SIGTERM/SIGHUP to them, and when one rank fails stops the
// others (SIGTERM, SIGKILL after 5 s); it exits with the first failure's status and removes the
// directory. ringd (a later issue) spawns ranks with the same flags.
#pragma once

namespace ring::cp {

// Whether argv asks for the multi-rank mode (--rank or --launch-local is present).
bool is_ring_invocation(int argc, char** argv);

// main() of the multi-rank mode; returns the process exit status (0 ok, 1 runtime failure,
// 2 usage or spec error).
int ring_main(int argc, char** argv);

}  // namespace ring::cp
