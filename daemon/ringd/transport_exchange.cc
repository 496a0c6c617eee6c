#include "daemon/ringd/transport_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "common/plan/plan.h"

namespace ring::ringd {

namespace {

// Tags of the shard collectives (any value: this communicator carries nothing else p2p).
constexpr uint32_t kTagReduce = 0x53480001;
constexpr uint32_t kTagSize = 0x53480002;
constexpr uint32_t kTagGather = 0x53480003;
constexpr uint32_t kTagSpan = 0x53480004;

}  // namespace

void TransportExchange::usable(const char* what) const {
  if (!broken_.empty()) {
    throw transport::TransportError(RING_TRANSPORT_ERR_PEER_FAILED,
                                    fmt::format("daemons: {}: node {}: the exchange failed "
                                                "earlier ({})",
                                                what, node_, broken_));
  }
}

void TransportExchange::post(std::vector<Pending>& ps, bool recv, void* buf, size_t size, int peer,
                             uint32_t tag, const char* what) {
  ring_transport_request_t* r = nullptr;
  const ring_transport_t& api = comm_->api();
  const ring_transport_status_t st = recv ? api.irecv(comm_->get(), buf, size, peer, tag, &r)
                                          : api.isend(comm_->get(), buf, size, peer, tag, &r);
  if (st != RING_TRANSPORT_OK) {
    broken_ = fmt::format("{} {} node {}", recv ? "receive from" : "send to", what, peer);
    throw transport::TransportError(
        st, fmt::format("daemons: {}: node {} cannot {} node {}: {}: {}", what, node_,
                        recv ? "receive from" : "send to", peer, ring_transport_status_name(st),
                        api.last_error(comm_->get())));
  }
  ps.push_back({r, peer, recv, size});
}

void TransportExchange::wait_all(std::vector<Pending>& ps, const char* what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  const ring_transport_t& api = comm_->api();
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int ms = static_cast<int>(std::max<int64_t>(1, left.count()));
    size_t got = 0;
    const ring_transport_status_t st = api.wait(comm_->get(), ps[i].req, ms, &got);
    if (st != RING_TRANSPORT_OK) {
      broken_ = fmt::format("{} with node {}", what, ps[i].peer);
      throw transport::TransportError(
          st, fmt::format("daemons: {}: node {} {} node {}: {}: {}", what, node_,
                          ps[i].recv ? "receiving from" : "sending to", ps[i].peer,
                          ring_transport_status_name(st), api.last_error(comm_->get())));
    }
    if (ps[i].recv && got != ps[i].expect) {
      broken_ = fmt::format("{}: a short message from node {}", what, ps[i].peer);
      throw transport::TransportError(
          RING_TRANSPORT_ERR_INTERNAL,
          fmt::format("daemons: {}: node {} got {} bytes from node {}, expected {}", what, node_,
                      got, ps[i].peer, ps[i].expect));
    }
  }
  ps.clear();
}

void TransportExchange::set_reduce_window_floats(int64_t w) {
  if (w < 1)
    throw transport::TransportError(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                                    fmt::format("daemons: reduce window {} floats: must be >= 1", w));
  reduce_window_ = w;
}

void TransportExchange::reduce_sum(float* x, int64_t n, int root) {
  usable("reduce");
  if (root < 0 || root >= nodes_) {
    throw transport::TransportError(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                                    fmt::format("daemons: reduce: root {} of {}", root, nodes_));
  }
  if (nodes_ == 1 || n == 0) return;
  // In windows of w floats: a bucket of any size stages at most two windows per sending node at
  // the root (plan::reduce_stage_bytes), and the fold of one window overlaps the next's arrival.
  const int64_t w = reduce_window_;
  const int64_t windows = (n + w - 1) / w;
  auto span = [&](int64_t c) { return std::min(w, n - c * w); };
  if (node_ != root) {
    // Two windows in flight: the root has posted receives for at most two.
    bytes_sent_ += n * static_cast<int64_t>(sizeof(float));
    std::vector<Pending> flight[2];
    for (int64_t c = 0; c < windows; ++c) {
      std::vector<Pending>& ps = flight[c % 2];
      if (!ps.empty()) wait_all(ps, "reduce");
      post(ps, false, x + c * w, static_cast<size_t>(span(c)) * sizeof(float), root, kTagReduce,
           "reduce");
    }
    for (auto& ps : flight) wait_all(ps, "reduce");
    return;
  }
  // The root: every other node's window c into stage set c % 2, then the left fold in node order
  // (node 0 first, the root's own x at its turn), exactly as one whole-bucket fold would add.
  const int sets = windows > 1 ? 2 : 1;
  const size_t slot = static_cast<size_t>(std::min(n, w));
  stage_.resize(std::max(stage_.size(), static_cast<size_t>(2 * nodes_)));
  for (int set = 0; set < sets; ++set)
    for (int k = 0; k < nodes_; ++k) {
      auto& v = stage_[static_cast<size_t>(set * nodes_ + k)];
      if (k != root && v.size() < slot) v.resize(slot);
    }
  std::vector<Pending> flight[2];
  auto post_window = [&](int64_t c) {
    for (int k = 0; k < nodes_; ++k) {
      if (k == root) continue;
      post(flight[c % 2], true, stage_[static_cast<size_t>((c % 2) * nodes_ + k)].data(),
           static_cast<size_t>(span(c)) * sizeof(float), k, kTagReduce, "reduce");
    }
  };
  post_window(0);
  if (windows > 1) post_window(1);
  for (int64_t c = 0; c < windows; ++c) {
    wait_all(flight[c % 2], "reduce");
    const int64_t len = span(c);
    float* out = x + c * w;
    auto part = [&](int k) -> float* {
      return k == root ? out : stage_[static_cast<size_t>((c % 2) * nodes_ + k)].data();
    };
    if (root != 0) {
      // Start from node 0's part; the root's own x is added at its turn.
      float* acc = part(0);
      for (int k = 1; k < nodes_; ++k) {
        const float* y = part(k);
        for (int64_t i = 0; i < len; ++i) acc[i] += y[i];
      }
      std::memcpy(out, acc, static_cast<size_t>(len) * sizeof(float));
    } else {
      for (int k = 1; k < nodes_; ++k) {
        const float* y = part(k);
        for (int64_t i = 0; i < len; ++i) out[i] += y[i];
      }
    }
    if (c + 2 < windows) post_window(c + 2);
  }
}

std::vector<std::vector<uint8_t>> TransportExchange::gather(const void* data, int64_t bytes,
                                                            int root) {
  usable("gather");
  if (root < 0 || root >= nodes_ || bytes < 0) {
    throw transport::TransportError(
        RING_TRANSPORT_ERR_INVALID_ARGUMENT,
        fmt::format("daemons: gather: root {} of {}, {} bytes", root, nodes_, bytes));
  }
  const auto* p = static_cast<const uint8_t*>(data);
  if (nodes_ == 1) return {std::vector<uint8_t>(p, p + bytes)};
  std::vector<Pending> ps;
  sizes_.assign(static_cast<size_t>(nodes_), 0);
  if (node_ != root) {
    // Staged: the caller's buffer may go before a failed request is abandoned.
    sizes_[node_] = bytes;
    send_bytes_.assign(p, p + bytes);
    bytes_sent_ += bytes + 8;
    post(ps, false, &sizes_[node_], sizeof(int64_t), root, kTagSize, "gather");
    post(ps, false, send_bytes_.data(), static_cast<size_t>(bytes), root, kTagGather, "gather");
    wait_all(ps, "gather");
    return {};
  }
  for (int k = 0; k < nodes_; ++k) {
    if (k != root) post(ps, true, &sizes_[k], sizeof(int64_t), k, kTagSize, "gather");
  }
  wait_all(ps, "gather");
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(nodes_));
  stage_.resize(static_cast<size_t>(nodes_));
  for (int k = 0; k < nodes_; ++k) {
    if (k == root) continue;
    if (sizes_[k] < 0) {
      broken_ = fmt::format("gather: node {} announced {} bytes", k, sizes_[k]);
      throw transport::TransportError(RING_TRANSPORT_ERR_INTERNAL, "daemons: " + broken_);
    }
    stage_[k].resize(static_cast<size_t>((sizes_[k] + 3) / 4));
    post(ps, true, stage_[k].data(), static_cast<size_t>(sizes_[k]), k, kTagGather, "gather");
  }
  wait_all(ps, "gather");
  for (int k = 0; k < nodes_; ++k) {
    if (k == root) {
      out[k].assign(p, p + bytes);
    } else {
      const auto* q = reinterpret_cast<const uint8_t*>(stage_[k].data());
      out[k].assign(q, q + sizes_[k]);
    }
  }
  return out;
}

void TransportExchange::allgather_spans(float* x, const std::vector<int64_t>& offsets) {
  usable("weight all-gather");
  if (offsets.size() != static_cast<size_t>(nodes_) + 1) {
    throw transport::TransportError(
        RING_TRANSPORT_ERR_INVALID_ARGUMENT,
        fmt::format("daemons: weight all-gather: {} offsets for {} nodes", offsets.size(), nodes_));
  }
  if (nodes_ == 1) return;
  std::vector<Pending> ps;
  const int64_t mine = offsets[node_ + 1] - offsets[node_];
  for (int k = 0; k < nodes_; ++k) {
    const int64_t len = offsets[k + 1] - offsets[k];
    if (k == node_ || len <= 0) continue;
    post(ps, true, x + offsets[k], static_cast<size_t>(len) * sizeof(float), k, kTagSpan,
         "weight all-gather");
  }
  if (mine > 0) {
    for (int k = 0; k < nodes_; ++k) {
      if (k == node_) continue;
      bytes_sent_ += mine * 4;
      post(ps, false, x + offsets[node_], static_cast<size_t>(mine) * sizeof(float), k, kTagSpan,
           "weight all-gather");
    }
  }
  wait_all(ps, "weight all-gather");
}

TransportExchange::TransportExchange(const std::string& transport, int node, int nodes,
                                     const std::string& rendezvous, int bootstrap_timeout_ms,
                                     int op_timeout_ms)
    : node_(node),
      nodes_(nodes),
      timeout_ms_(op_timeout_ms),
      reduce_window_(plan::reduce_window_floats(nodes)),
      plugin_(transport::TransportPlugin::load(transport)) {
  ring_transport_config_t cfg{};
  cfg.rank = node;
  cfg.world_size = nodes;
  cfg.rendezvous = rendezvous.c_str();
  cfg.bootstrap_timeout_ms = bootstrap_timeout_ms;
  cfg.op_timeout_ms = op_timeout_ms;
  cfg.device = -1;
  comm_ = std::make_unique<transport::TransportComm>(plugin_, cfg);
}

TransportExchange::~TransportExchange() = default;

void TransportExchange::allreduce_sum(float* x, int64_t n) {
  usable("all_reduce_sum_f32");
  if (nodes_ == 1 || n == 0) return;
  bytes_sent_ += n * 4;
  comm_->check(comm_->api().all_reduce_sum_f32(comm_->get(), x, x, static_cast<size_t>(n),
                                               timeout_ms_),
               "daemons: all_reduce_sum_f32");
}

void TransportExchange::allreduce_sum(double* x, int64_t n) {
  usable("all_gather (double sum)");
  if (nodes_ == 1 || n == 0) return;
  std::vector<double> all(static_cast<size_t>(n) * nodes_);
  bytes_sent_ += n * 8;
  comm_->check(comm_->api().all_gather(comm_->get(), x, all.data(), n * sizeof(double),
                                       timeout_ms_),
               "daemons: all_gather (double sum)");
  for (int64_t i = 0; i < n; ++i) {
    double s = all[i];
    for (int r = 1; r < nodes_; ++r) s += all[r * n + i];
    x[i] = s;
  }
}

std::vector<std::vector<uint8_t>> TransportExchange::allgather(const void* data, int64_t bytes) {
  usable("all_gather");
  const auto* p = static_cast<const uint8_t*>(data);
  if (nodes_ == 1) return {std::vector<uint8_t>(p, p + bytes)};
  std::vector<int64_t> sizes(nodes_);
  comm_->check(comm_->api().all_gather(comm_->get(), &bytes, sizes.data(), sizeof(int64_t),
                                       timeout_ms_),
               "daemons: all_gather of sizes");
  const int64_t most = std::max<int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  std::vector<uint8_t> mine(static_cast<size_t>(most), 0);
  if (bytes > 0) std::memcpy(mine.data(), p, static_cast<size_t>(bytes));
  std::vector<uint8_t> all(static_cast<size_t>(most) * nodes_);
  bytes_sent_ += bytes + 8;
  comm_->check(comm_->api().all_gather(comm_->get(), mine.data(), all.data(),
                                       static_cast<size_t>(most), timeout_ms_),
               "daemons: all_gather");
  std::vector<std::vector<uint8_t>> out(nodes_);
  for (int r = 0; r < nodes_; ++r)
    out[r].assign(all.begin() + r * most, all.begin() + r * most + sizes[r]);
  return out;
}

}  // namespace ring::ringd
