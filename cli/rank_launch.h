// The ranks of a sharded ringctl command (`ringctl generate --ranks P`, `ringctl eval --ranks P`):
// which rank this process is, and the local launcher that starts P ranks of the same command.
//
//   gen::Identity id = rank_identity(flags);        // --rank/--world/--rendezvous, or srun's
//   if (id.world > 1) return run_my_rank(id);         // this process is one rank
//   if (flags.ranks > 1)
//     return launch_local_ranks("generate", "gen", flags.ranks,
//                               [&](const std::string& self, int r, const std::string& dir) {
//                                 return argv_of_rank(self, r, dir);   // ... --rank r --world P
//                               });                                    //     --rendezvous dir
//
// launch_local_ranks: a fresh rendezvous directory (removed at the end), one process per rank
// through proc::run_group (each rank dies with the launcher; when one fails the others are
// stopped, SIGTERM then SIGKILL 5 s later; SIGINT/SIGTERM/SIGHUP are passed on). It returns the
// first failure's exit status, 1 for a rank killed by a signal (not the shell's 128 + N).
// Under srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS > 1) every task is one rank and --rendezvous
// names a directory every task reaches.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "worker/generate/generate_run.h"

namespace ring::cli {

// The flags that place a process among the ranks.
struct RankFlags {
  int ranks = 1;               // --ranks P: launch P local ranks
  int rank = -1, world = 0;    // --rank R --world P (set by the launcher)
  std::string rendezvous;      // --rendezvous DIR
};

// The flags that place one rank among the others, on subcommand sc: --rank, --world (set by the
// launcher), --rendezvous, --transport, --timeout. `what` names the work in the help ("a sharded
// generation").
struct RankPlacementFlags {
  int* rank;
  int* world;
  std::string* rendezvous;
  std::string* transport;
  int* timeout_s;
};
void add_rank_placement_flags(CLI::App* sc, const std::string& what, const RankPlacementFlags& f);

// An environment count (SLURM_*): def when unset; gen::UsageError when not a count.
int env_int(const char* name, int def);

// This process's place: world 1 when it runs alone (or launches). gen::UsageError naming the
// flag when the flags are inconsistent.
gen::Identity rank_identity(const RankFlags& f);

// Rank r's command line: argv[0] is `self` (this executable), the rank's flags end with
// --rank r --world P --rendezvous dir.
using RankArgv =
    std::function<std::vector<std::string>(const std::string& self, int r, const std::string& dir)>;

// Starts `ranks` local ranks of this executable and waits for them. `command` names the command
// in messages ("generate" -> "ringctl generate: rank 1 ..."); `tag` names the rendezvous
// directory (ring-<tag>-rdv-XXXXXX under the temporary directory).
int launch_local_ranks(const std::string& command, const std::string& tag, int ranks,
                       const RankArgv& argv_of);

}  // namespace ring::cli
