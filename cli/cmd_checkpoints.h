// `ringctl checkpoints DIR [--verify] [--json]`: the checkpoints under a checkpoint directory
// (step, time, size, nodes, complete/incomplete/corrupt, which one `latest` names); --verify
// reads every data file and compares every tensor checksum. Exit 0 when nothing is wrong, 1 when
// a checkpoint is corrupt or DIR cannot be read, 2 usage.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace ring::cli {

struct CheckpointsCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
CheckpointsCommand add_checkpoints(CLI::App& app);  // cmd_checkpoints.cc

}  // namespace ring::cli
