// A progress thread for a transport communicator, so that ring transfers move while the caller
// computes.
//
// Why: the UCX plugin (like most host transports) only moves data inside its calls (test, wait):
// on shared memory a large message crosses in ~100-200 KiB per progress round, so a 100 MiB K/V
// block posted before a 1 s attention call would not move at all during that call. A second
// thread calls test() on the posted requests.
//
// Between rounds it sleeps in the kernel: while nothing completes it yields a few times, then
// arms the comm (transport.h arm_wakeup) and sleeps in poll(2) on the comm's event fd and its
// own eventfd (written when a request is posted and it sleeps, or at stop), for kSleepBound at
// most and never past a staggered send's due time. So it wakes when data moves, not on a
// timer: a thread that woke every 50 us preempted the computing thread on its core 20,000
// times a second (about a quarter of the core with 8 ranks on 2 cores, in the emulated
// cluster's profile). A plugin without arm_wakeup gets the old back-off (yield, then 50 us
// sleeps). A caller blocked in wait() sleeps the same way on the comm's fd.
//
// Contract with transport.h: a comm is used by one thread at a time. Every call into the comm -
// from the progress thread or from the caller (post_*, collective()) - holds one mutex, and the
// progress thread idles (no calls) while no request is posted. A caller blocked in wait() drives
// progress itself (test() rounds with sched_yield between them) and the thread stands back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plugins/transport/loader.h"

namespace ring::cp {

class ProgressEngine {
 public:
  using Clock = std::chrono::steady_clock;
  // The longest sleep on the comm's event fd before a progress round runs anyway.
  static constexpr std::chrono::microseconds kSleepBound{1000};

  // comm must outlive the engine. The thread starts here and stops in the destructor.
  explicit ProgressEngine(transport::TransportComm* comm);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Posts a send of bytes at buf to rank peer (posted by the progress thread at not_before when
  // that is in the future: a staggered send). buf is borrowed until wait() returns. Returns a
  // handle for wait().
  int post_send(const void* buf, size_t bytes, int peer, uint32_t tag,
                Clock::time_point not_before = {});
  int post_recv(void* buf, size_t bytes, int peer, uint32_t tag);

  struct Result {
    ring_transport_status_t status = RING_TRANSPORT_OK;
    size_t bytes = 0;
    std::string error;      // the plugin's last_error when status is not OK
    double held_back_s = 0; // time a staggered send was held before it was posted
    Clock::time_point done_at{};  // when the request was seen complete (a test or post)
  };
  // Blocks until the request finishes or timeout_ms passes (then status TIMEOUT; the request is
  // left to the comm's finalize). The handle is released.
  Result wait(int handle, int timeout_ms);

  // Runs fn(comm) with the comm to itself (collectives). No request may be in flight.
  void collective(const std::function<void(transport::TransportComm&)>& fn);

  transport::TransportComm& comm() { return *comm_; }

 private:
  struct Op {
    bool used = false;
    bool posted = false;
    bool done = false;
    bool send = false;
    const void* sbuf = nullptr;
    void* rbuf = nullptr;
    size_t size = 0;
    int peer = -1;
    uint32_t tag = 0;
    Clock::time_point not_before{}, created{}, posted_at{};
    ring_transport_request_t* req = nullptr;
    Result result;
  };
  int alloc_op();
  void post_locked(Op& op);
  bool has_work_locked() const;
  // The earliest due time of a staggered send not yet posted (time_point::max() when none).
  Clock::time_point next_due_locked() const;
  // Sleeps (lk released meanwhile) until the comm has an event, until `until`, or kSleepBound,
  // and, for the progress thread (own_wake), until wake_fd_ is written; with events pending
  // it only yields the core once. false when the comm cannot wake a sleeper: the caller backs
  // off on a timer instead.
  bool sleep_on_comm(std::unique_lock<std::mutex>& lk, Clock::time_point until, bool own_wake);
  // One step of back-off after a round that completed nothing: while `yielding` (the first
  // rounds), give the core away once; after, sleep_on_comm, or `timer` when the comm cannot
  // wake a sleeper.
  void back_off(std::unique_lock<std::mutex>& lk, bool yielding, std::chrono::microseconds timer,
                Clock::time_point until, bool own_wake);
  // Posts due deferred sends and tests every posted request; true when one completed.
  bool progress_round_locked();
  void loop();

  transport::TransportComm* comm_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  std::vector<Op> ops_;
  bool stop_ = false;
  int waiting_ = 0;  // callers inside wait(), driving progress themselves
  bool can_arm_ = false;   // the plugin has arm_wakeup and it has not said UNSUPPORTED
  int wake_fd_ = -1;       // eventfd: wakes the progress thread from its poll
  bool thread_asleep_ = false;  // the progress thread is in (or about to enter) its poll
  std::thread thread_;
};

}  // namespace ring::cp
