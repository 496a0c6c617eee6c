// The worker side of ringd's control channel: a unix stream socket carrying small JSON lines
// (hello, heartbeat, "bucket b of step s is in your slot", step done) and, from ringd, the
// welcome (the shm segment, the step to start at, the loader cursor), "params for step s are in
// shm" and stop. Tensors go through the shm segment (common/contract/shm.h), never through
// the socket.
//
//   RingdClient c(socket, {.rank = r, .local = l, .n = layout.total()});
//   if (c.welcome().need_init) c.send_init(model.params());    // local rank 0, fresh start
//   while (true) {
//     Command cmd = c.next(model.params());                    // weights for the next step
//     if (cmd.stop) break;
//     model.forward_backward(batch, gv, [&](const GradBucket& b) {
//       c.bucket(cmd.step, b, model.grads()); });              // as each bucket completes
//     c.done(contract::control::Done{...});
//   }
//
// A heartbeat thread writes {"t":"hb"} every heartbeat_ms so ringd sees a hung process (for
// example a stopped one) as silence. When ringd goes away, every call throws RingdGone.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/contract/control.h"
#include "common/contract/layout.h"
#include "common/contract/shm.h"

namespace ring::offload {

struct RingdGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ClientOptions {
  int rank = 0;       // global rank
  int local = 0;      // local rank on this node (the gradient slot)
  int64_t n = 0;      // floats in the model's flat layout
  int heartbeat_ms = 250;
};

struct Welcome {
  std::string shm;
  int64_t start_step = 0;  // steps already done (resume); the first step run is start_step + 1
  bool need_init = false;  // this worker's initial weights become ringd's master weights
  nlohmann::json cursor;   // loader cursor to seek to (null: start of the data)
};

struct Command {
  bool stop = false;
  int64_t step = 0;        // the step to run with these weights
  int64_t changed = -1;    // -1: every weight was copied; else the number of changed coordinates
  std::string reason;      // stop: why
  // params: this node's ringd has a stop request. Every rank passes it on in the step's loss
  // all_gather, so all nodes learn it in the same step and stop after it (docs: daemon/INTERFACE.md).
  bool stop_requested = false;
};

class RingdClient {
 public:
  // Connects, says hello and waits for the welcome (bounded by timeout_ms). Throws RingdGone.
  RingdClient(const std::string& socket_path, const ClientOptions& options, int timeout_ms = 60000);
  ~RingdClient();
  RingdClient(const RingdClient&) = delete;
  RingdClient& operator=(const RingdClient&) = delete;

  const Welcome& welcome() const { return welcome_; }
  contract::ShmRegion& shm() { return shm_; }

  // Fresh start, the worker ringd named: copies params [n] (the segment's part of them:
  // shm().params_begin(), params_n()) into the shm and tells ringd.
  void send_init(const float* params);
  // The same when the caller wrote the segment's part of the initial weights into shm().params()
  // itself.
  void send_init_written();
  // Blocks until ringd sends the weights for the next step (copied into params [n]: all of them,
  // or only the changed coordinates in lazy mode) or stop. params == shm().params(): nothing is
  // copied (a device backend copies the whole vector from there to the device itself).
  Command next(float* params);
  // Copies grads[bucket.begin, bucket.end) into this worker's slot and notifies ringd.
  void bucket(int64_t step, const contract::GradBucket& b, const float* grads);
  // This worker's gradient slot in the shm ([n], or with shard full its shard [slot_n], slot()[0]
  // being the shard's first float): write a bucket's range there yourself (e.g. from the
  // device), then call bucket_written.
  float* slot() { return shm_.grads(opt_.local); }
  void bucket_written(int64_t step, const contract::GradBucket& b);
  // End of the step: the step's figures (loss_sum, valid, tokens, step_ms, cursor, stop, ...).
  void done(const contract::control::Done& d);

 private:
  // One line, written by the control messages' field table.
  void send(const contract::control::WorkerMessage& m);
  contract::control::RingdMessage recv();

  ClientOptions opt_;
  int fd_ = -1;
  std::string inbuf_;
  std::mutex write_mu_;
  Welcome welcome_;
  contract::ShmRegion shm_;
  std::atomic<bool> stop_hb_{false};
  std::thread hb_;
};

}  // namespace ring::offload
