// LocalExchange and InProcessExchange (see node_optimizer.h).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "daemon/optim/node_optimizer.h"

namespace ring::optim {

std::vector<std::vector<uint8_t>> LocalExchange::allgather(const void* data, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && data == nullptr)) {
    throw OptimError("LocalExchange::allgather: bytes must be >= 0 with a non-null buffer");
  }
  const auto* p = static_cast<const uint8_t*>(data);
  return {std::vector<uint8_t>(p, p + bytes)};
}

// One collective at a time: every node deposits its bytes, the last one to arrive publishes the
// round, every node copies the result and the round closes when all have left.
struct InProcessExchange::Shared {
  int n = 0;
  double timeout_s = 60;
  std::mutex mu;
  std::condition_variable cv;
  int64_t round = 0;       // completed rounds
  bool draining = false;   // result published, not every node has taken it yet
  int arrived = 0, departed = 0;
  std::vector<std::vector<uint8_t>> slots, result;
  std::vector<bool> here;
  std::string broken;      // set after a timeout: every later collective fails with it

  std::vector<std::vector<uint8_t>> gather(int node, const void* data, int64_t bytes) {
    if (bytes < 0 || (bytes > 0 && data == nullptr)) {
      throw OptimError("InProcessExchange: node " + std::to_string(node) +
                       ": bytes must be >= 0 with a non-null buffer");
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_until(lock, deadline, [&] { return !draining || !broken.empty(); })) {
      broken = "InProcessExchange: node " + std::to_string(node) +
               " timed out waiting for the previous collective to drain";
    }
    if (!broken.empty()) throw OptimError(broken);
    const auto* p = static_cast<const uint8_t*>(data);
    slots[node].assign(p, p + bytes);
    here[node] = true;
    const int64_t my_round = round;
    if (++arrived == n) {
      result.swap(slots);
      slots.assign(n, {});
      draining = true;
      departed = 0;
      ++round;
      cv.notify_all();
    } else if (!cv.wait_until(lock, deadline,
                              [&] { return round != my_round || !broken.empty(); })) {
      std::string missing;
      for (int i = 0; i < n; ++i) {
        if (here[i]) continue;
        if (!missing.empty()) missing += ',';
        missing += std::to_string(i);
      }
      broken = "InProcessExchange: node " + std::to_string(node) + " waited " +
               std::to_string(timeout_s) + " s for node(s) " + missing + " in a collective";
      cv.notify_all();
      throw OptimError(broken);
    }
    if (!broken.empty() && round == my_round) throw OptimError(broken);
    std::vector<std::vector<uint8_t>> out = result;
    if (++departed == n) {
      draining = false;
      arrived = 0;
      here.assign(n, false);
      result.clear();
      cv.notify_all();
    }
    return out;
  }
};

class InProcessExchange::Endpoint final : public Exchange {
 public:
  Endpoint(std::shared_ptr<Shared> shared, int node) : shared_(std::move(shared)), node_(node) {}
  int node() const override { return node_; }
  int nodes() const override { return shared_->n; }
  void allreduce_sum(float* x, int64_t n) override { reduce(x, n); }
  void allreduce_sum(double* x, int64_t n) override { reduce(x, n); }
  std::vector<std::vector<uint8_t>> allgather(const void* data, int64_t bytes) override {
    return shared_->gather(node_, data, bytes);
  }

 private:
  template <class T>
  void reduce(T* x, int64_t n) {
    if (n < 0 || (n > 0 && x == nullptr)) {
      throw OptimError("InProcessExchange::allreduce_sum: n must be >= 0 with a non-null buffer");
    }
    auto all = shared_->gather(node_, x, n * static_cast<int64_t>(sizeof(T)));
    for (size_t j = 0; j < all.size(); ++j) {
      if (all[j].size() != static_cast<size_t>(n) * sizeof(T)) {
        throw OptimError("InProcessExchange::allreduce_sum: node " + std::to_string(j) +
                         " sent " + std::to_string(all[j].size()) + " bytes, node " +
                         std::to_string(node_) + " " + std::to_string(n * sizeof(T)));
      }
    }
    // Left fold in node order, the same on every node.
    std::memcpy(x, all[0].data(), all[0].size());
    for (size_t j = 1; j < all.size(); ++j) {
      const T* y = reinterpret_cast<const T*>(all[j].data());
      for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    }
  }

  std::shared_ptr<Shared> shared_;
  int node_;
};

InProcessExchange::InProcessExchange(int nodes, double timeout_s) {
  if (nodes < 1) throw OptimError("InProcessExchange: nodes must be >= 1, got " +
                                  std::to_string(nodes));
  if (!(timeout_s > 0)) throw OptimError("InProcessExchange: timeout_s must be > 0");
  shared_ = std::make_shared<Shared>();
  shared_->n = nodes;
  shared_->timeout_s = timeout_s;
  shared_->slots.assign(nodes, {});
  shared_->here.assign(nodes, false);
  for (int i = 0; i < nodes; ++i) endpoints_.push_back(std::make_unique<Endpoint>(shared_, i));
}

InProcessExchange::~InProcessExchange() = default;

Exchange* InProcessExchange::endpoint(int node) {
  if (node < 0 || node >= nodes()) {
    throw OptimError("InProcessExchange::endpoint: node " + std::to_string(node) +
                     " out of range [0, " + std::to_string(nodes()) + ")");
  }
  return endpoints_[node].get();
}

int InProcessExchange::nodes() const {
  return shared_->n;
}

}  // namespace ring::optim
