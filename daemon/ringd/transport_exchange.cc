#include "daemon/ringd/transport_exchange.h"

#include <algorithm>
#include <cstring>

namespace ring::ringd {

TransportExchange::TransportExchange(const std::string& transport, int node, int nodes,
                                     const std::string& rendezvous, int bootstrap_timeout_ms,
                                     int op_timeout_ms)
    : node_(node),
      nodes_(nodes),
      timeout_ms_(op_timeout_ms),
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
  if (nodes_ == 1 || n == 0) return;
  bytes_sent_ += n * 4;
  comm_->check(comm_->api().all_reduce_sum_f32(comm_->get(), x, x, static_cast<size_t>(n),
                                               timeout_ms_),
               "daemons: all_reduce_sum_f32");
}

void TransportExchange::allreduce_sum(double* x, int64_t n) {
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
