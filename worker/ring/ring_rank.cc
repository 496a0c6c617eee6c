#include "worker/ring/ring_rank.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

namespace ring::cp {

void exit_now(const std::string& who, const char* message, int exit_code) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), message);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(exit_code);
}

RingRank::RingRank(const spec::JobSpec& spec, const RankOptions& o)
    : plugin_(transport::TransportPlugin::load(o.transport)), timeout_ms_(o.op_timeout_ms) {
  std::vector<int> order = ring_order_from_spec(spec.parallel, o.world, &note_);
  ring_ = make_ring(o.rank, o.world, order);
  ring_transport_config_t cfg{};
  cfg.rank = o.rank;
  cfg.world_size = o.world;
  cfg.rendezvous = o.rendezvous.c_str();
  cfg.bootstrap_timeout_ms = o.bootstrap_timeout_ms;
  cfg.op_timeout_ms = o.op_timeout_ms;
  cfg.device = -1;
  comm_ = std::make_unique<transport::TransportComm>(plugin_, cfg);
  if (o.world > 1) {
    const int peers[2] = {ring_.prev, ring_.next};
    comm_->check(comm_->api().connect(comm_->get(), peers, ring_.prev == ring_.next ? 1 : 2, 0),
                 "connect to ring neighbours");
  }
  progress_ = std::make_unique<ProgressEngine>(comm_.get());
}

RingRank::~RingRank() {
  progress_.reset();  // stop the thread before the comm is finalized
  comm_.reset();
}

int64_t RingRank::global_count(int64_t local) {
  if (ring_.world == 1) return local;
  std::vector<int64_t> all(ring_.world);
  progress_->collective([&](transport::TransportComm& c) {
    c.check(c.api().all_gather(c.get(), &local, all.data(), sizeof(int64_t), timeout_ms_),
            "all_gather of valid-label counts");
  });
  int64_t sum = 0;
  for (int64_t x : all) sum += x;
  return sum;
}

void RingRank::reduce(float* grads, int64_t n, model::LossResult* loss) {
  if (ring_.world == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  struct Part {
    double loss_sum;
    int64_t valid;
  };
  Part mine{loss->loss_sum, loss->valid};
  std::vector<Part> all(ring_.world);
  progress_->collective([&](transport::TransportComm& c) {
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
  if (ring_.world == 1) return;
  constexpr uint32_t kTagDone = 0x52410010, kTagRelease = 0x52410011;
  auto check = [&](int h, const char* what, int peer) {
    ProgressEngine::Result r = progress_->wait(h, timeout_ms_);
    if (r.status != RING_TRANSPORT_OK)
      throw transport::TransportError(r.status, "shutdown: " + std::string(what) + " rank " +
                                                    std::to_string(peer) + ": " + r.error);
  };
  char token = 1;
  if (ring_.rank == 0) {
    std::vector<char> in(ring_.world);
    std::vector<int> h;
    for (int r = 1; r < ring_.world; ++r) h.push_back(progress_->post_recv(&in[r], 1, r, kTagDone));
    for (int r = 1; r < ring_.world; ++r) check(h[r - 1], "done from", r);
    h.clear();
    for (int r = 1; r < ring_.world; ++r)
      h.push_back(progress_->post_send(&token, 1, r, kTagRelease));
    for (int r = 1; r < ring_.world; ++r) check(h[r - 1], "release to", r);
  } else {
    char in = 0;
    const int hr = progress_->post_recv(&in, 1, 0, kTagRelease);
    check(progress_->post_send(&token, 1, 0, kTagDone), "done to", 0);
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
