// An attempt's resources on this node, set up when it starts and released when its workers are
// gone: the rendezvous directories <rdv>/attempt-<A>/{workers,daemons}, the shared-memory region
// the workers map, the Exchange between daemons (several nodes) and the NodeOptimizer. Nothing
// here spawns or watches processes (supervisor.h) or decides when an attempt starts or ends
// (attempt.h); the Daemon calls these in the attempt's order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/contract/layout.h"
#include "common/contract/shm.h"
#include "common/spec/spec.h"
#include "daemon/optim/node_optimizer.h"
#include "daemon/ringd/transport_exchange.h"

namespace ring::ringd {

using NoteFn = std::function<void(const std::string&)>;

// The attempt directories (attempt-<N>) an earlier run left under `rdv_root`: each goes when it
// is a real directory of ringd's (owned_paths.h marker), anything else stays; `note` hears each.
void remove_stale_attempts(const std::string& rdv_root, const NoteFn& note);

class AttemptResources {
 public:
  struct Config {
    std::string rdv_root;   // the attempts' rendezvous directories go below
    int node_rank = 0;
    int nodes = 1;
    std::string transport;  // the Exchange's transport (several nodes)
    int threads = 0;        // optimizer threads (0: all cores)
    int64_t total_steps = 0;
  };
  // `note`: ringd's log lines (a stale segment replaced, a directory left in place).
  AttemptResources(Config c, const spec::JobSpec& spec, const contract::ParamLayout& layout,
                   NoteFn note)
      : c_(std::move(c)), spec_(spec), layout_(layout), note_(std::move(note)) {}

  // <rdv_root>/attempt-<attempt>/{workers,daemons}: created 0700 and marked as ringd's, so that
  // only they are ever removed. With several nodes another node may have made it already (same
  // user); with one node an existing unmarked directory is not ours and is refused. False with
  // the reason in *why.
  bool make_dirs(int attempt, std::string* why);
  const std::string& rdv() const { return rdv_; }  // <rdv_root>/attempt-<A> of the attempt

  // The shared memory of `workers` workers for the layout, named by job, node, this process and
  // the attempt; a leftover segment of that name (an earlier ringd with the same pid) is replaced.
  // Throws when it cannot be made.
  void create_shm(int attempt, int workers);
  contract::ShmRegion& shm() { return shm_; }

  // The Exchange (in process for one node, over the transport for several: this blocks until
  // every daemon joined) and the NodeOptimizer over it, writing its weights into shm()'s params
  // once create_shm made it (NodeOptimizer::set_weights_buffer). Throws on failure.
  optim::NodeOptimizer& make_optimizer();
  optim::NodeOptimizer& opt() { return *opt_; }
  optim::Exchange& exchange();
  bool has_optimizer() const { return opt_ != nullptr; }

  // The attempt is over: optimizer, exchange and shared memory go; node 0 removes the attempt's
  // rendezvous directory (a directory that is not ours stays, said through `note`).
  void release();

 private:
  Config c_;
  const spec::JobSpec& spec_;
  const contract::ParamLayout& layout_;
  NoteFn note_;
  std::string rdv_;
  contract::ShmRegion shm_;
  std::unique_ptr<TransportExchange> exchange_;
  optim::LocalExchange local_exchange_;
  std::unique_ptr<optim::NodeOptimizer> opt_;
};

}  // namespace ring::ringd
