// The Exchange's default shard collectives, LocalExchange and InProcessExchange (see
// node_optimizer.h).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "daemon/optim/node_optimizer.h"

namespace ring::optim {

namespace {

void check_root(const Exchange& ex, int root, const char* what) {
  if (root < 0 || root >= ex.nodes()) {
    throw OptimError(std::string(what) + ": node " + std::to_string(ex.node()) + ": root " +
                     std::to_string(root) + " out of range [0, " + std::to_string(ex.nodes()) +
                     ")");
  }
}

void check_offsets(const Exchange& ex, const std::vector<int64_t>& offsets, const char* what) {
  bool ok = offsets.size() == static_cast<size_t>(ex.nodes()) + 1;
  for (size_t i = 1; ok && i < offsets.size(); ++i) ok = offsets[i] >= offsets[i - 1];
  if (!ok || offsets[0] < 0) {
    throw OptimError(std::string(what) + ": node " + std::to_string(ex.node()) +
                     ": offsets must be nodes() + 1 ascending entries >= 0");
  }
}

}  // namespace

void Exchange::reduce_sum(float* x, int64_t n, int root) {
  check_root(*this, root, "Exchange::reduce_sum");
  allreduce_sum(x, n);
}

std::vector<std::vector<uint8_t>> Exchange::gather(const void* data, int64_t bytes, int root) {
  check_root(*this, root, "Exchange::gather");
  std::vector<std::vector<uint8_t>> all = allgather(data, bytes);
  if (node() != root) all.clear();
  return all;
}

void Exchange::allgather_spans(float* x, const std::vector<int64_t>& offsets) {
  check_offsets(*this, offsets, "Exchange::allgather_spans");
  const int me = node();
  const int64_t mine = offsets[me + 1] - offsets[me];
  std::vector<std::vector<uint8_t>> all = allgather(x + offsets[me], 4 * mine);
  for (int k = 0; k < nodes(); ++k) {
    if (k == me) continue;
    const int64_t len = offsets[k + 1] - offsets[k];
    if (all[k].size() != static_cast<size_t>(4 * len)) {
      throw OptimError("Exchange::allgather_spans: node " + std::to_string(k) + " sent " +
                       std::to_string(all[k].size()) + " bytes for a span of " +
                       std::to_string(len) + " floats");
    }
    if (len > 0) std::memcpy(x + offsets[k], all[k].data(), all[k].size());
  }
}

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
  // Every node deposits its x; only the root folds them (node order, as allreduce_sum does).
  void reduce_sum(float* x, int64_t n, int root) override {
    if (root < 0 || root >= shared_->n) {
      throw OptimError("InProcessExchange::reduce_sum: node " + std::to_string(node_) + ": root " +
                       std::to_string(root) + " out of range");
    }
    if (n < 0 || (n > 0 && x == nullptr)) {
      throw OptimError("InProcessExchange::reduce_sum: n must be >= 0 with a non-null buffer");
    }
    auto all = shared_->gather(node_, x, n * static_cast<int64_t>(sizeof(float)));
    if (node_ != root) return;
    fold(x, n, all);
  }

 private:
  template <class T>
  void reduce(T* x, int64_t n) {
    if (n < 0 || (n > 0 && x == nullptr)) {
      throw OptimError("InProcessExchange::allreduce_sum: n must be >= 0 with a non-null buffer");
    }
    auto all = shared_->gather(node_, x, n * static_cast<int64_t>(sizeof(T)));
    fold(x, n, all);
  }

  template <class T>
  void fold(T* x, int64_t n, const std::vector<std::vector<uint8_t>>& all) {
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
