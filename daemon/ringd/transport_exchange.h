// The Exchange of daemon/optim (NodeOptimizer's collectives between node daemons) over a
// ring_transport_t communicator of the job's ringd processes (plugins/transport, UCX on CPU):
// one rank per node, bootstrapped in <rendezvous>/attempt-<N>/daemons.
//
// allreduce_sum(float): the transport's ring all-reduce, whose left fold gives every rank the same
// bits. allreduce_sum(double) and allgather: all_gather, then a left fold in node order (node 0
// first) on every node. Variable-size allgather is two all_gathers: the sizes, then every node's
// bytes padded to the largest. Every call is bounded by op_timeout_ms and throws
// transport::TransportError naming the collective.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/optim/node_optimizer.h"
#include "plugins/transport/loader.h"

namespace ring::ringd {

class TransportExchange final : public optim::Exchange {
 public:
  // Loads `transport`, bootstraps rank `node` of `nodes` through `rendezvous` (a directory) and
  // returns once all nodes are there (bounded by bootstrap_timeout_ms).
  TransportExchange(const std::string& transport, int node, int nodes,
                    const std::string& rendezvous, int bootstrap_timeout_ms, int op_timeout_ms);
  ~TransportExchange() override;

  int node() const override { return node_; }
  int nodes() const override { return nodes_; }
  void allreduce_sum(float* x, int64_t n) override;
  void allreduce_sum(double* x, int64_t n) override;
  std::vector<std::vector<uint8_t>> allgather(const void* data, int64_t bytes) override;
  // Bytes this node sent through the exchange since construction (payload, not protocol).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  int node_, nodes_, timeout_ms_;
  transport::TransportPlugin plugin_;
  std::unique_ptr<transport::TransportComm> comm_;
  int64_t bytes_sent_ = 0;
};

}  // namespace ring::ringd
