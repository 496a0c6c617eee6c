#include "worker/ring/progress.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>

namespace ring::cp {

namespace {

void wake(int fd) {
  if (fd < 0) return;
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof one);  // EAGAIN: the counter is already set, enough
  (void)n;
}

}  // namespace

ProgressEngine::ProgressEngine(transport::TransportComm* comm) : comm_(comm), ops_(16) {
  if (comm_->api().arm_wakeup) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    can_arm_ = wake_fd_ >= 0;
  }
  thread_ = std::thread([this] { loop(); });
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  wake(wake_fd_);
  thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
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
    if (thread_asleep_) wake(wake_fd_);
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
    if (thread_asleep_) wake(wake_fd_);
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
  auto leave = [&] {  // the progress thread takes over again when no caller drives progress
    if (--waiting_ == 0) cv_work_.notify_all();
  };
  int idle = 0;
  while (!ops_[handle].done) {
    if (Clock::now() >= deadline) {
      leave();
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
    // Yield a few rounds, then sleep: ranks that share cores (CPU workers, or several ringd
    // "nodes" on one machine) must leave the core to the peer whose data they wait for; pure
    // sched_yield spinning starves it under CFS (seen as 60 s stalls with 2 nodes x 2 workers
    // on 2 cores). Sleep on the comm's event fd where it has one, else 20 us at a time.
    back_off(lk, ++idle <= 16, std::chrono::microseconds(20),
             std::min(deadline, next_due_locked()), false);
  }
  leave();
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

ProgressEngine::Clock::time_point ProgressEngine::next_due_locked() const {
  Clock::time_point due = Clock::time_point::max();
  for (const Op& op : ops_)
    if (op.used && !op.done && !op.posted) due = std::min(due, op.not_before);
  return due;
}

bool ProgressEngine::sleep_on_comm(std::unique_lock<std::mutex>& lk, Clock::time_point until,
                                   bool own_wake) {
  if (!can_arm_) return false;
  int fd = -1;
  ring_transport_status_t s = comm_->api().arm_wakeup(comm_->get(), &fd);
  if (s != RING_TRANSPORT_OK) {  // UNSUPPORTED, or arming failed: back off on a timer from now on
    can_arm_ = false;
    return false;
  }
  // Events pending: not armed (a send waiting for room in a shared-memory FIFO keeps it so
  // until the peer drains it). Give the core away once and go round again.
  if (fd < 0) {
    lk.unlock();
    sched_yield();
    lk.lock();
    return true;
  }
  const Clock::time_point now = Clock::now();
  const auto span = std::clamp<Clock::duration>(until - now, Clock::duration::zero(),
                                                kSleepBound);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(span).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  if (own_wake) thread_asleep_ = true;
  lk.unlock();
  ::ppoll(p, own_wake ? 2 : 1, &ts, nullptr);
  if (own_wake && (p[1].revents & POLLIN)) {
    uint64_t v;
    ssize_t n = ::read(wake_fd_, &v, sizeof v);
    (void)n;
  }
  lk.lock();
  if (own_wake) thread_asleep_ = false;
  return true;
}

void ProgressEngine::back_off(std::unique_lock<std::mutex>& lk, bool yielding,
                              std::chrono::microseconds timer, Clock::time_point until,
                              bool own_wake) {
  if (!yielding && sleep_on_comm(lk, until, own_wake)) return;
  lk.unlock();
  if (yielding)
    sched_yield();
  else
    std::this_thread::sleep_for(timer);
  lk.lock();
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
    // Idle while nothing is posted, and while a caller drives progress itself in wait().
    cv_work_.wait(lk, [&] { return stop_ || (waiting_ == 0 && has_work_locked()); });
    if (stop_) return;
    if (progress_round_locked()) idle = 0;
    // Let the caller in (posts, waits), then back off while nothing completes: the caller is
    // computing on this core's neighbour, so yield a few times, then sleep until the comm has
    // an event (or, without wake-up, 50 us at a time).
    back_off(lk, ++idle <= 8, std::chrono::microseconds(50), next_due_locked(), true);
  }
}

}  // namespace ring::cp
