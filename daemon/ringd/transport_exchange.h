// The Exchange of daemon/optim (NodeOptimizer's collectives between node daemons) over a
// ring_transport_t communicator of the job's ringd processes (plugins/transport, UCX on CPU):
// one rank per node, bootstrapped in <rendezvous>/attempt-<N>/daemons.
//
// allreduce_sum(float): the transport's ring all-reduce, whose left fold gives every rank the same
// bits. allreduce_sum(double) and allgather: all_gather, then a left fold in node order (node 0
// first) on every node. Variable-size allgather is two all_gathers: the sizes, then every node's
// bytes padded to the largest. Every call is bounded by op_timeout_ms and throws
// transport::TransportError naming the collective.
//
// The shard collectives are point-to-point (isend/irecv with tags of their own, one per kind;
// messages between a pair with one tag arrive in order, and every node calls the collectives in
// the same order): reduce_sum, every node but the root sends its x to the root, which folds
// them in node order (node 0 first), in windows of plan::reduce_window_floats (two in flight, so
// the root stages at most two windows per node whatever the bucket size); gather, every node but the root sends its byte count, then
// its bytes; allgather_spans, each node sends its span to every other node and receives theirs
// straight into x. All of one call's requests are posted first, then waited for against one
// deadline (op_timeout_ms). After a failure requests may still be in flight (their buffers
// touched until the communicator is finalized): every later call throws at once.
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
  void reduce_sum(float* x, int64_t n, int root) override;
  std::vector<std::vector<uint8_t>> gather(const void* data, int64_t bytes, int root) override;
  void allgather_spans(float* x, const std::vector<int64_t>& offsets) override;
  // The reduce window in floats (default plan::reduce_window_floats(nodes)); every node must
  // use the same. Smaller windows let tests cross window edges with small buckets.
  void set_reduce_window_floats(int64_t w);
  // Bytes this node sent through the exchange since construction (payload, not protocol).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Pending {
    ring_transport_request_t* req;
    int peer;
    bool recv;
    size_t expect;  // recv: the bytes that must arrive
  };
  void post(std::vector<Pending>& ps, bool recv, void* buf, size_t size, int peer, uint32_t tag,
            const char* what);
  void wait_all(std::vector<Pending>& ps, const char* what);
  void usable(const char* what) const;

  int node_, nodes_, timeout_ms_;
  int64_t reduce_window_;
  transport::TransportPlugin plugin_;
  // Receive and send staging of the shard collectives: declared before comm_ so that they outlive
  // it (a request abandoned by a failure may touch them until finalize).
  std::vector<std::vector<float>> stage_;
  std::vector<int64_t> sizes_;
  std::vector<uint8_t> send_bytes_;
  std::unique_ptr<transport::TransportComm> comm_;
  int64_t bytes_sent_ = 0;
  std::string broken_;  // a shard collective failed: requests may be in flight
};

}  // namespace ring::ringd
