#include "worker/ring/progress.h"

#include <sched.h>

namespace ring::cp {

ProgressEngine::ProgressEngine(transport::TransportComm* comm) : comm_(comm), ops_(16) {
  thread_ = std::thread([this] { loop(); });
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  thread_.join();
}

int ProgressEngine::alloc_op() {
  for (size_t i = 0; i < ops_.size(); ++i)
    if (!ops_[i].used) {
      ops_[i] = Op{};
      ops_[i].used = true;
      ops_[i].created = Clock::now();
      return static_cast<int>(i);
    }
  ops_.emplace_back();
  ops_.back().used = true;
  ops_.back().created = Clock::now();
  return static_cast<int>(ops_.size() - 1);
}

void ProgressEngine::post_locked(Op& op) {
  const ring_transport_t& api = comm_->api();
  ring_transport_status_t s =
      op.send ? api.isend(comm_->get(), op.sbuf, op.size, op.peer, op.tag, &op.req)
              : api.irecv(comm_->get(), op.rbuf, op.size, op.peer, op.tag, &op.req);
  op.posted = true;
  op.posted_at = Clock::now();
  if (s != RING_TRANSPORT_OK) {
    op.done = true;
    op.req = nullptr;
    op.result.status = s;
    op.result.error = api.last_error(comm_->get());
    op.result.done_at = op.posted_at;
  }
}

int ProgressEngine::post_send(const void* buf, size_t bytes, int peer, uint32_t tag,
                              Clock::time_point not_before) {
  int h;
  {
    std::lock_guard<std::mutex> lk(mu_);
    h = alloc_op();
    Op& op = ops_[h];
    op.send = true;
    op.sbuf = buf;
    op.size = bytes;
    op.peer = peer;
    op.tag = tag;
    op.not_before = not_before;
    if (not_before <= op.created) post_locked(op);
  }
  cv_work_.notify_all();
  return h;
}

int ProgressEngine::post_recv(void* buf, size_t bytes, int peer, uint32_t tag) {
  int h;
  {
    std::lock_guard<std::mutex> lk(mu_);
    h = alloc_op();
    Op& op = ops_[h];
    op.rbuf = buf;
    op.size = bytes;
    op.peer = peer;
    op.tag = tag;
    post_locked(op);
  }
  cv_work_.notify_all();
  return h;
}

ProgressEngine::Result ProgressEngine::wait(int handle, int timeout_ms) {
  // The waiting thread has nothing else to do: it drives progress itself, yielding between
  // rounds (the background thread only sleeps meanwhile).
  std::unique_lock<std::mutex> lk(mu_);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  ++waiting_;
  int idle = 0;
  while (!ops_[handle].done) {
    if (Clock::now() >= deadline) {
      --waiting_;
      Result r;
      r.status = RING_TRANSPORT_ERR_TIMEOUT;
      r.error = std::string("no completion within ") + std::to_string(timeout_ms) + " ms";
      // The request stays with the comm (finalize releases it); the slot is not reused.
      return r;
    }
    if (progress_round_locked()) {
      idle = 0;
      continue;
    }
    // Yield a few rounds, then sleep briefly: ranks that share cores (CPU workers, or several
    // ringd "nodes" on one machine) must leave the core to the peer whose data they wait for;
    // pure sched_yield spinning starves it under CFS (seen as 60 s stalls with 2 nodes x 2
    // workers on 2 cores).
    lk.unlock();
    if (++idle > 16)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else
      sched_yield();
    lk.lock();
  }
  --waiting_;
  Op& op = ops_[handle];
  Result r = op.result;
  if (op.send && op.not_before > op.created)
    r.held_back_s = std::chrono::duration<double>(op.posted_at - op.created).count();
  op.used = false;
  return r;
}

void ProgressEngine::collective(const std::function<void(transport::TransportComm&)>& fn) {
  std::lock_guard<std::mutex> lk(mu_);
  fn(*comm_);
}

bool ProgressEngine::has_work_locked() const {
  for (const Op& op : ops_)
    if (op.used && !op.done) return true;
  return false;
}

bool ProgressEngine::progress_round_locked() {
  const ring_transport_t& api = comm_->api();
  bool completed = false;
  const Clock::time_point now = Clock::now();
  for (Op& op : ops_) {
    if (!op.used || op.done) continue;
    if (!op.posted) {
      if (now < op.not_before) continue;
      post_locked(op);
      if (op.done) {
        completed = true;
        continue;
      }
    }
    int done = 0;
    size_t bytes = 0;
    ring_transport_status_t s = api.test(comm_->get(), op.req, &done, &bytes);
    if (done || s != RING_TRANSPORT_OK) {  // a failure without completion counts as done
      op.done = true;
      op.req = done ? nullptr : op.req;
      op.result.status = s;
      op.result.bytes = bytes;
      op.result.done_at = now;
      if (s != RING_TRANSPORT_OK) op.result.error = api.last_error(comm_->get());
      completed = true;
    }
  }
  return completed;
}

void ProgressEngine::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  unsigned idle = 0;
  while (true) {
    cv_work_.wait(lk, [&] { return stop_ || has_work_locked(); });
    if (stop_) return;
    if (waiting_ > 0) {  // the caller drives progress in wait()
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lk.lock();
      continue;
    }
    if (progress_round_locked()) idle = 0;
    // Let the caller in (posts, waits), then back off while nothing completes: the caller is
    // computing on this core's neighbour, so yield a few times, then sleep.
    lk.unlock();
    if (++idle > 8)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else
      sched_yield();
    lk.lock();
  }
}

}  // namespace ring::cp
