#include "worker/ring/ring_main.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <optional>

#include "common/spec/spec.h"
#include "plugins/transport/loader.h"
#include "worker/data/errors.h"
#include "worker/model/model.h"
#include "worker/offload/ringd_client.h"
#include "worker/ring/rank_setup.h"
#include "worker/ring/ring_programs.h"

namespace ring::cp {

int ring_main(const worker::Flags& args, int argc, char** argv) {
  if (args.launch_local) return launch_local(argc, argv, args);
  try {
    const std::optional<spec::JobSpec> spec = load_rank_spec(args);
    if (!spec) return kExitUsage;
    return args.ringd.empty() ? run_rank(args, *spec) : run_offloaded_rank(args, *spec);
  } catch (const offload::RingdGone& e) {
    logger()->error("rank {}: {}", args.rank, e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(kExitRuntime);
  } catch (const transport::TransportError& e) {
    // Thrown while setting up (bootstrap, connect): nothing is in flight yet. Errors during the
    // steps never get here: run_then_exit_on_error exits before anything is unwound.
    logger()->error("rank {}: {}", args.rank, e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(kExitRuntime);
  } catch (const data::DataError& e) {
    logger()->error("rank {}: data: {}", args.rank, e.what());
  } catch (const model::ModelError& e) {
    logger()->error("rank {}: model: {}", args.rank, e.what());
  } catch (const std::exception& e) {
    logger()->error("rank {}: {}", args.rank, e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(kExitRuntime);
}

}  // namespace ring::cp
