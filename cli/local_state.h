// ringctl's answers when no coordinator does: the state a stopped ring-coord left.
//
// `ringctl run` starts its own ring-coord when none answers and stops it when the run ends; the
// job's state stays in that coordinator's state directory (coord::default_state_dir():
// $RING_STATE_DIR, else $XDG_STATE_HOME/ringmaster, else ~/.local/state/ringmaster), which
// records the endpoints it served (<state_dir>/endpoints). When nothing answers at such an
// endpoint, `ringctl status`, `events`, `logs` and `steps` read <state_dir>/coord.db read-only
// and say so once on stderr. Other endpoints, other users' state, and requests that change state
// still fail as before (exit 4: no coordinator).
//
//   coord::Client c(with_local_state(o.coord.client_options()));
//   auto j = c.status(7);   // from ring-coord, or from the state it left
#pragma once

#include <string>

#include "coordinator/client.h"

namespace ring::cli {

// `o` with ClientOptions::when_unreachable reading `state_dir` (empty: the default).
coord::ClientOptions with_local_state(coord::ClientOptions o, std::string state_dir = "");

}  // namespace ring::cli
