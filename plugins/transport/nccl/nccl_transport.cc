// NCCL transport: the GPU data plane. Buffers are device pointers on the comm's device; all
// NCCL work runs on one stream the plugin owns. Links libnccl and libcudart only - never libcuda
// (the driver), so the plugin loads and probes on machines without a GPU and says why it cannot
// run there.
//
// Point-to-point: isend/irecv are queued and submitted together in one ncclGroupStart/End at the
// next test/wait (like torch's batch_isend_irecv). Ring attention posts "send to next, receive
// from prev" and then waits; submitting the pair as a group is what keeps NCCL from
// deadlocking, since a lone ncclSend blocks its stream until the peer posts the receive. NCCL
// matches by order per peer, not by tag, and a receive must be posted with the exact size sent.
//
// Nothing hangs: the communicator is created non-blocking (config.blocking = 0), so init,
// group submission and finalize are polled against deadlines; waits poll a CUDA event, NCCL's
// async error and the liveness of peers on this host. A comm that timed out or saw a failure is
// aborted (ncclCommAbort) at finalize instead of destroyed.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plugins/transport/common/plugin_base.h"

using namespace ring::transport;  // NOLINT: this file is one plugin of that namespace

namespace {


// The completion of one submitted group: every request of the group shares its event.
struct Batch {
  cudaEvent_t event = nullptr;
  ~Batch() {
    if (event) cudaEventDestroy(event);
  }
};

}  // namespace

struct ring_transport_request {
  std::shared_ptr<Batch> batch;  // null until submitted
  bool is_recv = false;
  int peer = -1;
  uint32_t tag = 0;
  void* buf = nullptr;
  size_t size = 0;
};

struct ring_transport_comm : CommBase {
  int device = 0;
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;
  float* barrier_buf = nullptr;  // one device float for barrier
  std::vector<ring_transport_request*> queued;  // posted, not yet submitted
  int outstanding = 0;                          // submitted, not yet released
  Result failed;  // set once the comm can no longer be trusted (failure, timeout mid-collective)
};

namespace {

using Comm = ring_transport_comm;
using Req = ring_transport_request;

Result cuda_error(const Comm* c, const char* what, cudaError_t e) {
  return error(RING_TRANSPORT_ERR_INTERNAL, (c ? c->who() + ": " : std::string("nccl: ")) + what +
                                                ": " + cudaGetErrorString(e));
}

Result nccl_error(Comm* c, const char* what, ncclResult_t r) {
  ring_transport_status_t s = RING_TRANSPORT_ERR_INTERNAL;
  if (r == ncclRemoteError || r == ncclSystemError) s = RING_TRANSPORT_ERR_PEER_FAILED;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) s = RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  std::string detail = c && c->nccl ? ncclGetLastError(c->nccl) : ncclGetLastError(nullptr);
  Result res = error(s, (c ? c->who() + ": " : std::string("nccl: ")) + what + ": " +
                            ncclGetErrorString(r) + (detail.empty() ? "" : " (" + detail + ")"));
  if (c && s != RING_TRANSPORT_ERR_INVALID_ARGUMENT) c->failed = res;
  return res;
}

// Local pids first (fast on one host), then NCCL's own view.
Result health(Comm* c) {
  if (!c->failed.ok()) return c->failed;
  Clock::time_point now = Clock::now();
  if (now >= c->next_liveness) {
    c->next_liveness = now + kLivenessPeriod;
    for (int p = 0; p < c->world; ++p)
      if (p != c->rank && !local_peer_alive(c->rdv.self(), c->peers[p])) {
        c->failed = error(RING_TRANSPORT_ERR_PEER_FAILED,
                          c->who() + ": rank " + std::to_string(p) + " (process " +
                              std::to_string(c->peers[p].pid) + " on " + c->peers[p].host +
                              ") is no longer running");
        return c->failed;
      }
  }
  if (c->nccl) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->nccl, &async);
    if (r != ncclSuccess) return nccl_error(c, "ncclCommGetAsyncError", r);
    if (async != ncclSuccess && async != ncclInProgress) return nccl_error(c, "NCCL", async);
  }
  return ok_result();
}

void idle(unsigned* spins) {
  if (++*spins > 2000)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  else if (*spins > 32)
    sched_yield();
}

// Non-blocking NCCL calls return ncclInProgress; this waits until the comm is ready.
Result wait_ready(Comm* c, const char* what, Clock::time_point deadline) {
  unsigned spins = 0;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->nccl, &async);
    if (r != ncclSuccess) return nccl_error(c, what, r);
    if (async == ncclSuccess) return ok_result();
    if (async != ncclInProgress) return nccl_error(c, what, async);
    Result h = health(c);
    if (!h.ok()) return h;
    if (Clock::now() >= deadline) {
      c->failed = error(RING_TRANSPORT_ERR_TIMEOUT, c->who() + ": " + what + ": not done in time");
      return c->failed;
    }
    idle(&spins);
  }
}

Result check_enqueue(Comm* c, const char* what, ncclResult_t r, Clock::time_point deadline) {
  if (r == ncclInProgress) return wait_ready(c, what, deadline);
  if (r != ncclSuccess) return nccl_error(c, what, r);
  return ok_result();
}

// Submits queued sends and receives as one group.
Result submit(Comm* c, Clock::time_point deadline) {
  if (c->queued.empty()) return ok_result();
  auto batch = std::make_shared<Batch>();
  cudaError_t e = cudaEventCreateWithFlags(&batch->event, cudaEventDisableTiming);
  if (e != cudaSuccess) return cuda_error(c, "cudaEventCreate", e);
  ncclGroupStart();
  ncclResult_t r = ncclSuccess;
  for (Req* q : c->queued) {
    if (q->is_recv)
      r = ncclRecv(q->buf, q->size, ncclUint8, q->peer, c->nccl, c->stream);
    else
      r = ncclSend(q->buf, q->size, ncclUint8, q->peer, c->nccl, c->stream);
    if (r != ncclSuccess && r != ncclInProgress) break;
  }
  ncclResult_t g = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) return nccl_error(c, "ncclSend/ncclRecv", r);
  Result res = check_enqueue(c, "ncclGroupEnd", g, deadline);
  if (!res.ok()) return res;
  e = cudaEventRecord(batch->event, c->stream);
  if (e != cudaSuccess) return cuda_error(c, "cudaEventRecord", e);
  for (Req* q : c->queued) q->batch = batch;
  c->queued.clear();
  return ok_result();
}

// 1: done, 0: pending; errors through res.
int poll(Comm* c, Req* r, Result* res) {
  if (!r->batch) {
    *res = submit(c, deadline_after_ms(c->op_timeout_ms));
    if (!res->ok()) return 1;
  }
  cudaError_t e = cudaEventQuery(r->batch->event);
  if (e == cudaSuccess) return 1;
  if (e != cudaErrorNotReady) {
    *res = cuda_error(c, "cudaEventQuery", e);
    c->failed = *res;
    return 1;
  }
  *res = health(c);
  // A peer that exited after its part of this batch completed is not a failure of the batch.
  if (!res->ok() && cudaEventQuery(r->batch->event) == cudaSuccess) *res = ok_result();
  return res->ok() ? 0 : 1;
}

Result wait_stream(Comm* c, const char* what, Clock::time_point deadline) {
  Batch b;
  cudaError_t e = cudaEventCreateWithFlags(&b.event, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(b.event, c->stream);
  if (e != cudaSuccess) return cuda_error(c, "cudaEventRecord", e);
  unsigned spins = 0;
  for (;;) {
    e = cudaEventQuery(b.event);
    if (e == cudaSuccess) return ok_result();
    if (e != cudaErrorNotReady) return c->failed = cuda_error(c, what, e);
    Result h = health(c);
    if (!h.ok()) return cudaEventQuery(b.event) == cudaSuccess ? ok_result() : h;
    if (Clock::now() >= deadline) {
      // The collective stays enqueued on the GPU and cannot be cancelled: the comm is done.
      c->failed = error(RING_TRANSPORT_ERR_TIMEOUT, c->who() + ": " + what + ": not done in time");
      return c->failed;
    }
    idle(&spins);
  }
}

// ---- ABI members ------------------------------------------------------------------------------

ring_transport_status_t nccl_probe(char* reason, size_t reason_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  std::string why;
  if (e != cudaSuccess)
    why = std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  else if (n == 0)
    why = "no CUDA device";
  if (reason && reason_len) {
    std::strncpy(reason, why.c_str(), reason_len - 1);
    reason[reason_len - 1] = '\0';
  }
  if (why.empty()) return RING_TRANSPORT_OK;
  set_thread_error(why);
  return RING_TRANSPORT_ERR_UNSUPPORTED;
}

ring_transport_status_t nccl_finalize(ring_transport_comm_t* c);

ring_transport_status_t nccl_init(const ring_transport_config_t* caller_config,
                                  ring_transport_comm_t** out) {
  ring_transport_config_t cfg;
  std::unique_ptr<Comm> c;
  ring_transport_status_t s0 = start_init("nccl", caller_config, INT_MAX, out, &cfg, &c);
  if (s0 != RING_TRANSPORT_OK) return s0;
  char why[256];
  if (nccl_probe(why, sizeof(why)) != RING_TRANSPORT_OK) return RING_TRANSPORT_ERR_UNSUPPORTED;
  auto fail = [&](const Result& r) { return abandon_init<nccl_finalize>(c, r); };
  int n = 0;
  cudaGetDeviceCount(&n);
  c->device = cfg.device >= 0 ? cfg.device : c->rank % n;
  if (c->device >= n)
    return fail(error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                      c->who() + ": device " + std::to_string(c->device) + " of " +
                          std::to_string(n)));
  cudaError_t e = cudaSetDevice(c->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&c->barrier_buf, sizeof(float));
  if (e != cudaSuccess) return fail(cuda_error(c.get(), "device setup", e));

  Result res = c->rdv.open(cfg.rendezvous, c->rank, c->world);
  if (!res.ok()) return fail(res);
  Clock::time_point deadline = deadline_after_ms(c->bootstrap_timeout_ms);
  // Rank 0 makes the unique id; everyone publishes its identity for liveness checks.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return fail(nccl_error(c.get(), "ncclGetUniqueId", r));
    res = c->rdv.publish("nccl-id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    if (!res.ok()) return fail(res);
  }
  std::vector<std::string> payloads;
  if (!(res = c->rdv.publish("host", "")).ok()) return fail(res);
  if (!(res = c->rdv.gather("host", {}, deadline, &c->peers, &payloads)).ok()) return fail(res);
  if (c->rank != 0) {
    std::vector<PeerIdentity> ids;
    if (!(res = c->rdv.gather("nccl-id", {0}, deadline, &ids, &payloads)).ok()) return fail(res);
    if (payloads[0].size() != sizeof(id))
      return fail(error(RING_TRANSPORT_ERR_INTERNAL, c->who() + ": malformed nccl-id record"));
    std::memcpy(&id, payloads[0].data(), sizeof(id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c->nccl, c->world, id, c->rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return fail(nccl_error(c.get(), "ncclCommInit", r));
  if (!(res = wait_ready(c.get(), "ncclCommInitRankConfig", deadline)).ok()) return fail(res);
  *out = c.release();
  return RING_TRANSPORT_OK;
}

ring_transport_status_t nccl_finalize(ring_transport_comm_t* c) {
  if (!c) return RING_TRANSPORT_OK;
  for (Req* q : c->queued) delete q;
  c->queued.clear();
  if (c->nccl) {
    bool clean = c->failed.ok() && c->outstanding == 0;
    if (clean) {
      ncclResult_t r = ncclCommFinalize(c->nccl);
      clean = (r == ncclSuccess || r == ncclInProgress) &&
              wait_ready(c, "ncclCommFinalize", deadline_after_ms(c->op_timeout_ms)).ok();
    }
    if (clean)
      ncclCommDestroy(c->nccl);
    else
      ncclCommAbort(c->nccl);  // bounded: aborts in-flight kernels and proxy threads
  }
  if (c->barrier_buf) cudaFree(c->barrier_buf);
  if (c->stream) cudaStreamDestroy(c->stream);
  delete c;
  return RING_TRANSPORT_OK;
}

ring_transport_status_t nccl_connect(ring_transport_comm_t* c, const int* peers, int n_peers,
                                     int timeout_ms) {
  if (!c) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  std::vector<int> list;
  if (Result r = c->connect_list(peers, n_peers, &list); !r.ok()) return c->fail(r);
  // NCCL connects p2p channels lazily on first use; a zero-byte exchange with each listed peer
  // forces it now, symmetric like the contract asks.
  std::vector<Req*> reqs;
  for (int p : list) {
    if (p == c->rank) continue;
    for (bool recv : {true, false}) {
      Req* q = new Req;
      q->is_recv = recv;
      q->peer = p;
      q->buf = c->barrier_buf;
      c->queued.push_back(q);
      reqs.push_back(q);
      ++c->outstanding;
    }
  }
  Clock::time_point deadline = deadline_after_ms(c->timeout(timeout_ms));
  Result res = submit(c, deadline);
  if (res.ok() && !reqs.empty()) res = wait_stream(c, "connect", deadline);
  for (Req* q : reqs) {
    --c->outstanding;
    delete q;
  }
  return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
}

ring_transport_status_t post(Comm* c, bool recv, void* buf, size_t size, int peer, uint32_t tag,
                             Req** out) {
  if (!c || !out) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  if (peer < 0 || peer >= c->world || (!buf && size))
    return c->fail(error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                         c->who() + ": bad peer " + std::to_string(peer) + " or NULL buffer"));
  if (!c->failed.ok()) return c->fail(c->failed);
  Req* q = new Req;
  q->is_recv = recv;
  q->peer = peer;
  q->tag = tag;
  q->buf = buf;
  q->size = size;
  c->queued.push_back(q);
  ++c->outstanding;
  *out = q;
  return RING_TRANSPORT_OK;
}

ring_transport_status_t nccl_isend(ring_transport_comm_t* c, const void* buf, size_t size,
                                   int peer, uint32_t tag, ring_transport_request_t** out) {
  return post(c, false, const_cast<void*>(buf), size, peer, tag, out);
}

ring_transport_status_t nccl_irecv(ring_transport_comm_t* c, void* buf, size_t size, int peer,
                                   uint32_t tag, ring_transport_request_t** out) {
  return post(c, true, buf, size, peer, tag, out);
}

ring_transport_status_t release(Comm* c, Req* r, const Result& res, size_t* bytes) {
  if (bytes) *bytes = res.ok() ? r->size : 0;
  --c->outstanding;
  delete r;
  return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
}

ring_transport_status_t nccl_test(ring_transport_comm_t* c, ring_transport_request_t* r,
                                  int* done, size_t* bytes) {
  if (!c || !r || !done) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  Result res;
  *done = poll(c, r, &res);
  if (!*done) return RING_TRANSPORT_OK;
  return release(c, r, res, bytes);
}

ring_transport_status_t nccl_wait(ring_transport_comm_t* c, ring_transport_request_t* r,
                                  int timeout_ms, size_t* bytes) {
  if (!c || !r) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  Clock::time_point deadline = deadline_after_ms(c->timeout(timeout_ms));
  unsigned spins = 0;
  for (;;) {
    Result res;
    if (poll(c, r, &res)) return release(c, r, res, bytes);
    if (Clock::now() >= deadline)
      return c->fail(error(RING_TRANSPORT_ERR_TIMEOUT,
                           c->who() + ": " + (r->is_recv ? "receive from" : "send to") +
                               " rank " + std::to_string(r->peer) + " (" +
                               std::to_string(r->size) + " bytes): not complete in time"));
    idle(&spins);
  }
}

template <typename F>
ring_transport_status_t collective(Comm* c, const char* what, int timeout_ms, F enqueue) {
  if (!c->failed.ok()) return c->fail(c->failed);
  Clock::time_point deadline = deadline_after_ms(c->timeout(timeout_ms));
  Result res = submit(c, deadline);  // p2p posted earlier keeps its place in the stream order
  if (res.ok()) res = check_enqueue(c, what, enqueue(), deadline);
  if (res.ok()) res = wait_stream(c, what, deadline);
  return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
}

ring_transport_status_t nccl_all_reduce(ring_transport_comm_t* c, const float* send, float* recv,
                                        size_t count, int timeout_ms) {
  if (!c || (count && (!send || !recv))) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  return collective(c, "ncclAllReduce", timeout_ms, [&] {
    return ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, c->nccl, c->stream);
  });
}

ring_transport_status_t nccl_reduce_scatter(ring_transport_comm_t* c, const float* send,
                                            float* recv, size_t n, int timeout_ms) {
  if (!c || (n && (!send || !recv))) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  return collective(c, "ncclReduceScatter", timeout_ms, [&] {
    return ncclReduceScatter(send, recv, n, ncclFloat32, ncclSum, c->nccl, c->stream);
  });
}

ring_transport_status_t nccl_all_gather(ring_transport_comm_t* c, const void* send, void* recv,
                                        size_t bytes, int timeout_ms) {
  if (!c || (bytes && (!send || !recv))) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  return collective(c, "ncclAllGather", timeout_ms, [&] {
    return ncclAllGather(send, recv, bytes, ncclUint8, c->nccl, c->stream);
  });
}

// One group of ncclSend/ncclRecv with every other member (NCCL matches by order per peer, so
// the sizes must agree: the receiver's recv_bytes is the sender's send_bytes), and the own
// block copied on the stream. Device pointers, like every buffer of this plugin.
ring_transport_status_t nccl_all_to_all(ring_transport_comm_t* c, const int* group, int n,
                                        const void* send, const size_t* send_offsets,
                                        const size_t* send_bytes, void* recv,
                                        const size_t* recv_offsets, const size_t* recv_bytes,
                                        int timeout_ms) {
  if (!c || !group || n < 1 || !send_offsets || !send_bytes || !recv_offsets || !recv_bytes)
    return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  int self = -1;
  std::vector<char> seen(static_cast<size_t>(c->world), 0);
  for (int i = 0; i < n; ++i) {
    if (group[i] < 0 || group[i] >= c->world || seen[group[i]]++)
      return c->fail(error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                           c->who() + ": all_to_all: group member " + std::to_string(group[i]) +
                               " is out of range or listed twice"));
    if (group[i] == c->rank) self = i;
  }
  if (self < 0 || send_bytes[self] != recv_bytes[self])
    return c->fail(error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                         c->who() + ": all_to_all: the caller is not in the group, or its own "
                                    "block's send and receive sizes differ"));
  const char* sbuf = static_cast<const char*>(send);
  char* rbuf = static_cast<char*>(recv);
  return collective(c, "all_to_all (ncclSend/ncclRecv group)", timeout_ms, [&] {
    if (send_bytes[self]) {
      cudaError_t e = cudaMemcpyAsync(rbuf + recv_offsets[self], sbuf + send_offsets[self],
                                      send_bytes[self], cudaMemcpyDeviceToDevice, c->stream);
      if (e != cudaSuccess) return ncclUnhandledCudaError;
    }
    ncclGroupStart();
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); ++i) {
      if (i == self) continue;
      r = ncclRecv(rbuf + recv_offsets[i], recv_bytes[i], ncclUint8, group[i], c->nccl,
                   c->stream);
      if (r == ncclSuccess || r == ncclInProgress)
        r = ncclSend(sbuf + send_offsets[i], send_bytes[i], ncclUint8, group[i], c->nccl,
                     c->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    return (r == ncclSuccess || r == ncclInProgress) ? g : r;
  });
}

ring_transport_status_t nccl_barrier(ring_transport_comm_t* c, int timeout_ms) {
  if (!c) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  return collective(c, "barrier (ncclAllReduce)", timeout_ms, [&] {
    return ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclFloat32, ncclSum, c->nccl,
                         c->stream);
  });
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const ring_transport_t ring_transport_plugin = {
    RING_TRANSPORT_HEADER,
    .name = "nccl",
    .caps = RING_TRANSPORT_CAP_DEVICE_MEMORY,
    .probe = guarded<nccl_probe>,
    .init = guarded<nccl_init>,
    .finalize = guarded<nccl_finalize>,
    .connect = guarded<nccl_connect>,
    .isend = guarded<nccl_isend>,
    .irecv = guarded<nccl_irecv>,
    .test = guarded<nccl_test>,
    .wait = guarded<nccl_wait>,
    .all_reduce_sum_f32 = guarded<nccl_all_reduce>,
    .reduce_scatter_sum_f32 = guarded<nccl_reduce_scatter>,
    .all_gather = guarded<nccl_all_gather>,
    .barrier = guarded<nccl_barrier>,
    .last_error = last_error_of<ring_transport_comm>,
    // NCCL completes on CUDA events, not a file descriptor: callers poll test().
    .arm_wakeup = nullptr,
    .all_to_all = guarded<nccl_all_to_all>,
};
