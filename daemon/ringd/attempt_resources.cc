#include "daemon/ringd/attempt_resources.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "common/contract/shard.h"
#include "daemon/ringd/owned_paths.h"

namespace ring::ringd {

namespace fs = std::filesystem;

void remove_stale_attempts(const std::string& rdv_root, const NoteFn& note) {
  std::error_code ec;
  fs::directory_iterator it(rdv_root, ec), end;
  std::vector<std::string> stale;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("attempt-", 0) == 0) stale.push_back(it->path().string());
  }
  for (const std::string& d : stale) {
    std::string why;
    if (remove_own_dir(d, &why)) note("removed the rendezvous of an earlier run: " + d);
    else note("left in place (not a rendezvous directory ringd made): " + why);
  }
}

bool AttemptResources::make_dirs(int attempt, std::string* why) {
  rdv_ = fmt::format("{}/attempt-{}", c_.rdv_root, attempt);
  try {
    std::error_code ec;
    if (!fs::exists(c_.rdv_root, ec)) {
      fs::create_directories(c_.rdv_root, ec);
      if (ec) throw PathError("cannot create " + c_.rdv_root + ": " + ec.message());
      ::chmod(c_.rdv_root.c_str(), 0700);
    }
    const bool existed = fs::exists(fs::symlink_status(rdv_, ec));
    ensure_own_dir(rdv_, 0022);
    if (existed && c_.nodes == 1 && !is_own_marked_dir(rdv_))
      throw PathError(rdv_ +
                      " exists and was not made by ringd (no marker); choose another "
                      "--rendezvous or remove it");
    if (existed && c_.nodes > 1 && !is_own_marked_dir(rdv_)) {
      // Another node of this job may have made it a moment ago (it marks it next), but what
      // ringd puts there is the marker, workers/ and daemons/: a directory holding anything
      // else is someone's, and adopting it would delete it at the attempt's end.
      for (const auto& e : fs::directory_iterator(rdv_, ec)) {
        const std::string n = e.path().filename().string();
        if (n != kMarkerName && n != "workers" && n != "daemons")
          throw PathError(rdv_ + " exists and holds " + n +
                          ", which ringd did not make; choose another --rendezvous or remove it");
      }
    }
    mark_own_dir(rdv_, fmt::format("ringd rendezvous of job {} attempt {}", spec_.job.name,
                                   attempt));
    ensure_own_dir(rdv_ + "/workers", 0022);
    ensure_own_dir(rdv_ + "/daemons", 0022);
    return true;
  } catch (const std::exception& e) {
    *why = e.what();
    return false;
  }
}

void AttemptResources::create_shm(int attempt, int workers) {
  // The name carries this process's pid and the attempt, so a segment of that name is the
  // leftover of an earlier ringd that had the same pid and was killed before its workers
  // mapped it (shared memory outlives processes): replace it.
  const std::string shm = contract::shm_name(spec_.job.name, c_.node_rank, getpid(), attempt);
  if (shm_unlink(shm.c_str()) == 0) note_("removed a stale shared-memory segment " + shm);
  contract::ShmShape shape = contract::ShmShape::whole(layout_.total(), workers);
  if (spec_.parallel.shard == spec::ShardMode::kFull) {
    // Shard full: the weights of this node's range (no lazy index: the workers copy their whole
    // shard each step) and a slot of each worker's shard.
    const contract::NodeRange r = contract::shard_ranges(layout_, c_.nodes)[c_.node_rank];
    shape.params_begin = r.begin;
    shape.params_n = r.size();
    shape.index_n = 0;
    shape.slot_n = contract::largest_worker_shard(layout_, c_.nodes, workers);
  }
  shm_ = contract::ShmRegion::create(shm, shape);
}

optim::NodeOptimizer& AttemptResources::make_optimizer() {
  optim::Exchange* ex = &local_exchange_;
  if (c_.nodes > 1) {
    exchange_ = std::make_unique<TransportExchange>(c_.transport, c_.node_rank, c_.nodes,
                                                    rdv_ + "/daemons", 120000, 60000);
    ex = exchange_.get();
  }
  opt_ = std::make_unique<optim::NodeOptimizer>(spec_, layout_, c_.total_steps, c_.threads, ex);
  // The optimizer writes (shard optimizer: gathers) the new weights straight into the workers'
  // shared memory.
  if (shm_.valid()) opt_->set_weights_buffer(shm_.params(), shm_.params_begin());
  return *opt_;
}

optim::Exchange& AttemptResources::exchange() {
  if (exchange_) return *exchange_;
  return local_exchange_;
}

void AttemptResources::release() {
  opt_.reset();
  exchange_.reset();
  shm_ = contract::ShmRegion();
  if (c_.node_rank == 0) {
    std::string why;
    if (!remove_own_dir(rdv_, &why)) note_("rendezvous directory left in place: " + why);
  }
}

}  // namespace ring::ringd
