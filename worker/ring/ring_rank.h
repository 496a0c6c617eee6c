// One rank of a context-parallel ring: the communicator, its progress thread, the ring topology,
// and the pieces of a training step that cross ranks besides attention - the global valid-label
// count, and the sum of weight gradients and losses (so every rank applies the identical AdamW
// update and the parameters stay bit-identical across ranks).
//
// Data replicas: the job's W = C x D ranks form D rings of C ranks (context_ranks C,
// data_replicas D). Global rank g is ring position c = g % C of replica d = g / C. The K/V ring
// runs on a communicator of the replica's C ranks (rendezvous <dir>/replica-<d>, rank c of C);
// what spans the job - the valid-label count, the gradient and loss sums, gathers, the clean
// shutdown - runs on a second communicator of all W ranks (<dir>/world). With D = 1 there is one
// communicator on <dir> itself, used for both.
//
//   RingRank rr(spec, {.rank = g, .world = W, .replicas = D, .rendezvous = dir});
//   RingAttention attention(backend, &rr.progress(), rr.ring(), {.stagger_us = ...});
//   Trainer trainer(spec, backend, &attention, steps);
//   trainer.set_grad_reduce(rr.grad_reducer());
//   SequenceShard shard = shard_sequence(seq, C, rr.ring().rank, spec.parallel.causal_balance);
//   trainer.train_step(shard_batch(shard), rr.global_count(local_valid));
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/spec/spec.h"
#include "plugins/transport/loader.h"
#include "worker/data/split.h"
#include "worker/model/model.h"
#include "worker/ring/progress.h"
#include "worker/ring/ring_attention.h"
#include "worker/train/trainer.h"

namespace ring::cp {

struct RankOptions {
  int rank = 0;            // global rank g
  int world = 1;           // W: every rank of the job (context_ranks x replicas)
  int replicas = 1;        // D: data replicas, each a ring of W / D ranks
  std::string rendezvous;  // directory unique to this ring attempt
  std::string transport = "ucx";
  int bootstrap_timeout_ms = 60000;
  int op_timeout_ms = 60000;  // bound on every transfer and collective
};

// Runs body() and returns what it returns. An exception out of body ends the process at once
// (message "<who>: <error>" on stderr, stdio flushed, _exit(exit_code)) instead of unwinding:
// transfers may still be in flight into buffers the caller's frames own (K/V blocks, gradients),
// and destroying them under the transport corrupts the heap. A transport error (a peer died) is
// the usual case; a lost ringd or a data error in the middle of a step are the same hazard.
// Callers declare the RingRank, the RingAttention and the model before calling this, so that
// nothing owning such a buffer is destroyed when something is thrown inside body.
[[noreturn]] void exit_now(const std::string& who, const char* message, int exit_code);
template <typename Body>
int run_then_exit_on_error(const std::string& who, int exit_code, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    exit_now(who, e.what(), exit_code);
  }
}

class RingRank {
 public:
  // Loads the transport, runs the bootstrap(s), connects to the ring neighbours and starts the
  // progress thread(s). Throws transport::TransportError (with the plugin's message) or
  // std::invalid_argument (a bad ring order, a world that is not a multiple of replicas).
  RingRank(const spec::JobSpec& spec, const RankOptions& options);
  ~RingRank();

  // The ring of this rank's replica: rank c of C (ring().rank, ring().world).
  const RingTopology& ring() const { return ring_; }
  ProgressEngine& progress() { return *progress_; }
  transport::TransportComm& comm() { return *comm_; }
  // The progress engine of the communicator of all W ranks (rank g there): the ring's with D = 1.
  // Point-to-point traffic on it may run during the ring's transfers (other tags), never during
  // a collective (all_gather, global_count, reduce).
  ProgressEngine& world_progress() { return world_engine(); }
  const std::string& note() const { return note_; }  // e.g. how ring_order was interpreted
  int replica() const { return replica_; }           // d
  int replicas() const { return replicas_; }         // D
  int world_rank() const { return world_rank_; }     // g
  int world_size() const { return world_size_; }     // W

  // Every rank's `bytes` at `send` into recv (W x bytes, in global rank order), over all W ranks.
  // No ring transfer may be in flight.
  void all_gather(const void* send, void* recv, size_t bytes, int timeout_ms, const char* what);

  // Sum over all W ranks of a count (all_gather, summed in rank order: identical on every rank).
  int64_t global_count(int64_t local);
  // Sums the gradient buffer (all_reduce_sum_f32 over the whole flat buffer: one bucket) and the
  // loss (loss_sum, valid: all_gather, summed in rank order) in place, over all W ranks.
  void reduce(float* grads, int64_t n, model::LossResult* loss);
  train::Trainer::GradReduceFn grad_reducer() {
    return [this](float* g, int64_t n, model::LossResult* r) { reduce(g, n, r); };
  }
  double reduce_seconds() const { return reduce_s_; }  // time in reduce() since construction

  // Clean exit: returns once every rank (all W) has called it, so no rank leaves while another
  // still waits in a collective (the transport fails a collective when any rank is gone, even one
  // that already did its part). Point-to-point only - every rank sends "done" to rank 0, which
  // answers "release" to each - because a p2p wait fails only on the death of its own peer, and
  // a message sent just before its sender exits is still delivered.
  void shutdown();

 private:
  // The engine of the all-rank communicator: the world one with D > 1, else the ring's.
  ProgressEngine& world_engine() { return world_progress_ ? *world_progress_ : *progress_; }

  transport::TransportPlugin plugin_;
  std::unique_ptr<transport::TransportComm> comm_;  // the replica's ring (C ranks)
  std::unique_ptr<ProgressEngine> progress_;
  std::unique_ptr<transport::TransportComm> world_comm_;  // all W ranks; only with D > 1
  std::unique_ptr<ProgressEngine> world_progress_;
  RingTopology ring_;
  int replica_ = 0, replicas_ = 1, world_rank_ = 0, world_size_ = 1;
  std::string note_;
  int timeout_ms_;
  double reduce_s_ = 0;
};

// This rank's tokens as a model batch (pointers into shard).
model::Batch shard_batch(const data::SequenceShard& shard);

// Labels of this rank's shard that count toward the loss (not data::kIgnoreLabel).
int64_t valid_labels(const data::SequenceShard& shard);

// Peak resident memory of this process (VmHWM), bytes; 0 when unknown.
int64_t peak_rss_bytes();

}  // namespace ring::cp
