#include "worker/ring/ring_rank.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace ring::cp {

void exit_now(const std::string& who, const char* message, int exit_code) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), message);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(exit_code);
}

namespace {

// A communicator of `world` ranks on the rendezvous `dir` (a directory path or file:<path>).
// A sub-directory of the given rendezvous (`make_dir`) is created first, so that ranks arriving
// in any order find it; the plugin reports a directory it cannot use.
std::unique_ptr<transport::TransportComm> make_comm(const transport::TransportPlugin& plugin,
                                                    const RankOptions& o, int rank, int world,
                                                    const std::string& dir, bool make_dir) {
  if (make_dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir.rfind("file:", 0) == 0 ? dir.substr(5) : dir, ec);
  }
  ring_transport_config_t cfg{};
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.rendezvous = dir.c_str();
  cfg.bootstrap_timeout_ms = o.bootstrap_timeout_ms;
  cfg.op_timeout_ms = o.op_timeout_ms;
  cfg.device = -1;
  return std::make_unique<transport::TransportComm>(plugin, cfg);
}

}  // namespace

RingRank::RingRank(const spec::JobSpec& spec, const RankOptions& o)
    : plugin_(transport::TransportPlugin::load(o.transport)), timeout_ms_(o.op_timeout_ms) {
  if (o.replicas < 1 || o.world % o.replicas != 0 || o.rank < 0 || o.rank >= o.world)
    throw std::invalid_argument("rank " + std::to_string(o.rank) + " of " +
                                std::to_string(o.world) + " with " + std::to_string(o.replicas) +
                                " data replicas: the world must be a multiple of the replicas");
  const int ctx = o.world / o.replicas;
  replicas_ = o.replicas;
  replica_ = o.rank / ctx;
  world_rank_ = o.rank;
  world_size_ = o.world;
  const int c = o.rank % ctx;
  std::vector<int> order = ring_order_from_spec(spec.parallel, ctx, &note_);
  ring_ = make_ring(c, ctx, order);
  // One replica: the ring's communicator is the job's, on the directory given (as without
  // replicas). Several: one per replica, then one over every rank, in that order on every rank.
  const bool replicated = o.replicas > 1;
  comm_ =
      make_comm(plugin_, o, c, ctx,
                replicated ? o.rendezvous + "/replica-" + std::to_string(replica_) : o.rendezvous,
                replicated);
  if (ctx > 1) {
    const int peers[2] = {ring_.prev, ring_.next};
    comm_->check(comm_->api().connect(comm_->get(), peers, ring_.prev == ring_.next ? 1 : 2, 0),
                 "connect to ring neighbours");
  }
  progress_ = std::make_unique<ProgressEngine>(comm_.get());
  if (replicated) {
    world_comm_ = make_comm(plugin_, o, o.rank, o.world, o.rendezvous + "/world", true);
    world_progress_ = std::make_unique<ProgressEngine>(world_comm_.get());
  }
}

RingRank::~RingRank() {
  // Stop the threads before their comms are finalized.
  world_progress_.reset();
  world_comm_.reset();
  progress_.reset();
  comm_.reset();
}

void RingRank::all_gather(const void* send, void* recv, size_t bytes, int timeout_ms,
                          const char* what) {
  if (world_size_ == 1) {
    std::memcpy(recv, send, bytes);
    return;
  }
  world_engine().collective([&](transport::TransportComm& c) {
    c.check(c.api().all_gather(c.get(), send, recv, bytes, timeout_ms), what);
  });
}

int64_t RingRank::global_count(int64_t local) {
  if (world_size_ == 1) return local;
  std::vector<int64_t> all(world_size_);
  all_gather(&local, all.data(), sizeof(int64_t), timeout_ms_, "all_gather of valid-label counts");
  int64_t sum = 0;
  for (int64_t x : all) sum += x;
  return sum;
}

void RingRank::reduce(float* grads, int64_t n, model::LossResult* loss) {
  if (world_size_ == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  struct Part {
    double loss_sum;
    int64_t valid;
  };
  Part mine{loss->loss_sum, loss->valid};
  std::vector<Part> all(world_size_);
  world_engine().collective([&](transport::TransportComm& c) {
    c.check(c.api().all_reduce_sum_f32(c.get(), grads, grads, static_cast<size_t>(n), timeout_ms_),
            "all_reduce_sum_f32 of the weight gradients");
    c.check(c.api().all_gather(c.get(), &mine, all.data(), sizeof(Part), timeout_ms_),
            "all_gather of the loss");
  });
  loss->loss_sum = 0;
  loss->valid = 0;
  for (const Part& p : all) {
    loss->loss_sum += p.loss_sum;
    loss->valid += p.valid;
  }
  reduce_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void RingRank::shutdown() {
  if (world_size_ == 1) return;
  ProgressEngine& engine = world_engine();
  constexpr uint32_t kTagDone = 0x52410010, kTagRelease = 0x52410011;
  auto check = [&](int h, const char* what, int peer) {
    ProgressEngine::Result r = engine.wait(h, timeout_ms_);
    if (r.status != RING_TRANSPORT_OK)
      throw transport::TransportError(r.status, "shutdown: " + std::string(what) + " rank " +
                                                    std::to_string(peer) + ": " + r.error);
  };
  char token = 1;
  if (world_rank_ == 0) {
    std::vector<char> in(world_size_);
    std::vector<int> h;
    for (int r = 1; r < world_size_; ++r) h.push_back(engine.post_recv(&in[r], 1, r, kTagDone));
    for (int r = 1; r < world_size_; ++r) check(h[r - 1], "done from", r);
    h.clear();
    for (int r = 1; r < world_size_; ++r) h.push_back(engine.post_send(&token, 1, r, kTagRelease));
    for (int r = 1; r < world_size_; ++r) check(h[r - 1], "release to", r);
  } else {
    char in = 0;
    const int hr = engine.post_recv(&in, 1, 0, kTagRelease);
    check(engine.post_send(&token, 1, 0, kTagDone), "done to", 0);
    check(hr, "release from", 0);
  }
}

int64_t valid_labels(const data::SequenceShard& shard) {
  int64_t n = 0;
  for (int32_t l : shard.labels) n += l != data::kIgnoreLabel;
  return n;
}

model::Batch shard_batch(const data::SequenceShard& s) {
  return model::Batch{static_cast<int64_t>(s.tokens.size()), s.tokens.data(), s.labels.data(),
                      s.positions.data(), s.doc_ids.data()};
}

int64_t peak_rss_bytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t kb = 0;
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::atoll(line + 6);
  std::fclose(f);
  return kb * 1024;
}

}  // namespace ring::cp
