// ringd: the node daemon. See daemon/INTERFACE.md for the contract (command line, job directory,
// exit codes) and daemon/README.md for how it works.
#pragma once

#include "daemon/ringd/options.h"

namespace ring::ringd {

// Runs the daemon to the end; returns the exit status of the contract.
int run(const Options& options);

}  // namespace ring::ringd
