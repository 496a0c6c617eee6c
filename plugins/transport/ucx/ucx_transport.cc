// UCX transport: the CPU data plane. Point-to-point over UCP tag matching; collectives are ring
// algorithms over the same point-to-point layer so their float sums follow one documented order
// (transport.h, reduce_scatter_sum_f32) and every rank gets identical bits.
//
// Transport choice: when UCX_TLS is unset and every rank is on this host, the context uses
// self,posix (shared memory; about twice the bandwidth of UCX's default set here) with
// UCX_NET_DEVICES=lo; otherwise UCX picks (tcp across plain hosts, rc/ud/dc on InfiniBand).
//
// Failure detection, so nothing hangs: endpoints use UCP_ERR_HANDLING_MODE_PEER (UCX reports
// transport errors and keepalive failures through an error callback); peers on this host are
// also checked directly (pid, start time) every kLivenessPeriod while a call waits, because a
// killed process on shared memory is otherwise noticed only by UCX keepalive, late; and every
// wait has a deadline.
//
// Waiting without spinning: the worker is created with UCP_FEATURE_WAKEUP (unless
// RING_UCX_WAKEUP=0), so a thread with nothing to do arms it (ucp_worker_arm) and sleeps in
// poll(2) on its event fd until a message or completion arrives, bounded by kWakeBound for the
// failure checks. arm_wakeup hands that to the caller's progress thread; the plugin's own waits
// (wait, collectives, finalize) do the same. UCX then selects only transports that can wake a
// sleeper (tcp, posix/sysv, cma, InfiniBand; not `self`, whose loop-back then goes through shared
// memory).
#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "plugins/transport/common/plugin_base.h"

using namespace ring::transport;  // NOLINT: this file is one plugin of that namespace

namespace {

// Bound on the graceful endpoint flush at finalize; force-close after it.
constexpr int kCloseFlushMs = 2000;
// Longest sleep on the worker's event fd before progress runs again anyway (failure checks).
constexpr auto kWakeBound = std::chrono::milliseconds(1);

// 64-bit UCP tag: [63:62] kind, [61:40] source rank, [39:32] zero, [31:0] user tag or, for
// collectives, (sequence << 16 | step); group all-to-alls use kind kGroup with low bits 0 (their
// members call them in the same order, and messages of one tag between two ranks keep their
// order, so no sequence is needed and groups of one comm never share a counter). Receives match all 64 bits, so user traffic and
// collectives never steal each other's messages.
enum TagKind : uint64_t { kUser = 0, kCollective = 1, kHello = 2, kGroup = 3 };
constexpr int kMaxRanks = 1 << 22;

uint64_t make_tag(TagKind kind, int src, uint32_t low) {
  return (static_cast<uint64_t>(kind) << 62) | (static_cast<uint64_t>(src) << 40) | low;
}

ring_transport_status_t map_ucs(ucs_status_t s) {
  switch (s) {
    case UCS_OK: return RING_TRANSPORT_OK;
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_INVALID_PARAM: return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
    case UCS_ERR_TIMED_OUT: return RING_TRANSPORT_ERR_TIMEOUT;
    case UCS_ERR_UNSUPPORTED: return RING_TRANSPORT_ERR_UNSUPPORTED;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:  // tcp: the peer's socket closed (it died) before our send
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:  // we cancel only requests of a failed peer or at finalize
    case UCS_ERR_IO_ERROR: return RING_TRANSPORT_ERR_PEER_FAILED;
    default: return RING_TRANSPORT_ERR_INTERNAL;
  }
}

struct EpContext {
  ring_transport_comm* comm;
  int peer;
};

}  // namespace

struct ring_transport_request {
  ring_transport_comm* comm = nullptr;
  void* ucp_req = nullptr;  // NULL when the operation completed at once
  ucs_status_t status = UCS_INPROGRESS;
  bool done = false;
  bool abandoned = false;  // the caller was told it failed; free when UCX lets go of it
  bool is_recv = false;
  int peer = -1;
  uint32_t tag = 0;
  size_t size = 0;    // posted size (send) or capacity (recv)
  size_t length = 0;  // bytes transferred
};

struct ring_transport_comm : CommBase {
  std::vector<std::string> addresses;
  bool all_local = false;
  std::string tls;  // what the context was created with, for messages

  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd (UCP_FEATURE_WAKEUP); -1: no wake-up, poll instead
  std::vector<ucp_ep_h> eps;
  std::vector<std::unique_ptr<EpContext>> ep_contexts;
  std::vector<std::string> failed;   // per peer: empty, or why it is considered failed
  std::vector<int> to_close;         // eps whose peer failed: close (force) after progress
  std::vector<void*> closing;        // ucp close requests in flight
  std::unordered_set<ring_transport_request*> live;

  bool destroying = false;
  uint32_t coll_seq = 0;
  Result coll_broken;  // a collective failed part-way: later collectives return this
  std::vector<char> scratch[2];
};

namespace {

using Comm = ring_transport_comm;
using Req = ring_transport_request;

void release(Req* r) {
  if (r->ucp_req) ucp_request_free(r->ucp_req);
  r->comm->live.erase(r);
  delete r;
}

void on_complete(Req* r, ucs_status_t status) {
  r->status = status;
  r->done = true;
  // While the worker is destroyed UCX may purge requests: finalize frees them afterwards.
  if (r->abandoned && !r->comm->destroying) release(r);
}

void send_cb(void* /*request*/, ucs_status_t status, void* user_data) {
  on_complete(static_cast<Req*>(user_data), status);
}

void recv_cb(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
             void* user_data) {
  Req* r = static_cast<Req*>(user_data);
  if (info) r->length = info->length;
  on_complete(r, status);
}

void mark_failed(Comm* c, int peer, const std::string& why) {
  if (!c->failed[peer].empty()) return;
  c->failed[peer] = why;
  c->to_close.push_back(peer);
}

std::string gone(const Comm* c, int peer) {
  return "process " + std::to_string(c->peers[peer].pid) + " on " + c->peers[peer].host +
         " is no longer running";
}

// The result of any request to a peer marked failed.
Result peer_failed(const Comm* c, int peer) {
  return error(RING_TRANSPORT_ERR_PEER_FAILED,
               c->who() + ": peer " + std::to_string(peer) + " failed: " + c->failed[peer]);
}

void ep_error_cb(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* ctx = static_cast<EpContext*>(arg);
  mark_failed(ctx->comm, ctx->peer,
              std::string("UCX reported endpoint failure: ") + ucs_status_string(status));
}

// Force-close endpoints of failed peers: outstanding sends to them complete with an error.
// Done outside UCX callbacks, which must not close endpoints themselves.
void close_failed_eps(Comm* c) {
  while (!c->to_close.empty()) {
    int p = c->to_close.back();
    c->to_close.pop_back();
    ucp_ep_h ep = c->eps[p];
    if (!ep) continue;
    c->eps[p] = nullptr;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(sp)) c->closing.push_back(sp);
  }
  // Cancel receives from failed peers: UCX does not tie a tag receive to an endpoint, so it
  // would otherwise wait for a message that can no longer come.
  for (Req* r : std::vector<Req*>(c->live.begin(), c->live.end())) {
    if (r->is_recv && !r->done && r->ucp_req && !c->failed[r->peer].empty())
      ucp_request_cancel(c->worker, r->ucp_req);
  }
}

void check_liveness(Comm* c) {
  Clock::time_point now = Clock::now();
  if (now < c->next_liveness) return;
  c->next_liveness = now + kLivenessPeriod;
  std::vector<int> dead;
  for (int p = 0; p < c->world; ++p) {
    if (p == c->rank || !c->failed[p].empty()) continue;
    if (!local_peer_alive(c->rdv.self(), c->peers[p])) dead.push_back(p);
  }
  if (dead.empty()) return;
  // A peer that finished its part and exited may have left messages we have not polled yet
  // (in our shared-memory FIFO or socket). It can send nothing more, so drain what is there
  // before its receives are cancelled: only what never came fails.
  for (int idle_rounds = 0, i = 0; idle_rounds < 16 && i < 100000; ++i)
    idle_rounds = ucp_worker_progress(c->worker) ? 0 : idle_rounds + 1;
  for (int p : dead)
    mark_failed(c, p, gone(c, p));
}

// One round of progress plus failure bookkeeping. Returns the number of UCX events.
unsigned progress(Comm* c) {
  unsigned n = ucp_worker_progress(c->worker);
  check_liveness(c);
  if (!c->to_close.empty()) close_failed_eps(c);
  return n;
}

// Arms the worker for a wake-up: true with *fd set when a sleeper may poll it, true with
// *fd == -1 when events are pending (progress again now), false when this comm cannot wake one.
bool arm(Comm* c, int* fd, ucs_status_t* status) {
  *fd = -1;
  *status = UCS_OK;
  if (c->efd < 0) return false;
  if (!c->to_close.empty()) return true;  // bookkeeping left for progress()
  *status = ucp_worker_arm(c->worker);
  if (*status == UCS_ERR_BUSY) return true;
  if (*status != UCS_OK) return false;
  *fd = c->efd;
  return true;
}

// Backs off while nothing happens, so ranks oversubscribing a few cores (tests, CPU workers)
// leave the core to the peer they wait for: a few rounds of sched_yield, then sleep on the
// worker's event fd (or, without wake-up, 50 us sleeps) until `deadline` at most.
struct Idle {
  unsigned empty = 0;
  void step(Comm* c, unsigned events, Clock::time_point deadline) {
    if (events) {
      empty = 0;
      return;
    }
    ++empty;
    if (empty <= 32) return;
    int fd = -1;
    ucs_status_t st;
    // Armed: sleep. Events pending (a send waiting for room in a shared-memory FIFO keeps the
    // worker busy until the peer drains it) or no wake-up: back off on a timer as before.
    if (empty > 64 && arm(c, &fd, &st) && fd >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::clamp<long long>(left.count(), 0, kWakeBound.count())));
    } else if (empty > 2000) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      sched_yield();
    }
  }
};

Result get_ep(Comm* c, int peer, ucp_ep_h* ep) {
  if (!c->failed[peer].empty())
    return peer_failed(c, peer);
  if (c->eps[peer]) {
    *ep = c->eps[peer];
    return ok_result();
  }
  auto ctx = std::make_unique<EpContext>(EpContext{c, peer});
  ucp_ep_params_t prm{};
  prm.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
  prm.address = reinterpret_cast<const ucp_address_t*>(c->addresses[peer].data());
  prm.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  prm.err_handler.cb = ep_error_cb;
  prm.err_handler.arg = ctx.get();
  // UCX 1.13's shared-memory transports (posix, sysv, self) refuse UCP_ERR_HANDLING_MODE_PEER
  // ("no peer failure handler"). A peer in this host's pid space is watched by check_liveness
  // (pid and start time) instead, so its endpoint runs without UCX error handling and keeps
  // shared memory; peers on other hosts get PEER mode (transport errors, keepalive).
  if (same_pid_space(c->rdv.self(), c->peers[peer])) {
    prm.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
  }
  ucs_status_t s = ucp_ep_create(c->worker, &prm, &c->eps[peer]);
  if (s != UCS_OK) {
    c->eps[peer] = nullptr;
    // A first message to a peer that has already died fails here (its shared memory or socket
    // is gone): that is the peer's failure, like any later request to it.
    if (!local_peer_alive(c->rdv.self(), c->peers[peer])) {
      mark_failed(c, peer, gone(c, peer));
      return peer_failed(c, peer);
    }
    return error(map_ucs(s) == RING_TRANSPORT_ERR_PEER_FAILED ? RING_TRANSPORT_ERR_PEER_FAILED
                                                              : RING_TRANSPORT_ERR_INTERNAL,
                 c->who() + ": ucp_ep_create to rank " + std::to_string(peer) + " (" +
                     c->peers[peer].host + ", UCX_TLS " + c->tls + "): " + ucs_status_string(s));
  }
  c->ep_contexts.push_back(std::move(ctx));
  *ep = c->eps[peer];
  return ok_result();
}

Result post_send(Comm* c, const void* buf, size_t size, int peer, uint64_t tag, uint32_t user_tag,
                 Req** out) {
  ucp_ep_h ep = nullptr;
  Result res = get_ep(c, peer, &ep);
  if (!res.ok()) return res;
  auto* r = new Req;
  r->comm = c;
  r->peer = peer;
  r->tag = user_tag;
  r->size = size;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = send_cb;
  prm.user_data = r;
  ucs_status_ptr_t sp = ucp_tag_send_nbx(ep, buf, size, tag, &prm);
  if (UCS_PTR_IS_ERR(sp)) {
    r->done = true;
    r->status = UCS_PTR_STATUS(sp);
  } else if (sp == nullptr) {
    r->done = true;
    r->status = UCS_OK;
    r->length = size;
  } else {
    r->ucp_req = sp;
    r->length = size;
  }
  c->live.insert(r);
  *out = r;
  return ok_result();
}

Result post_recv(Comm* c, void* buf, size_t size, int peer, uint64_t tag, uint32_t user_tag,
                 Req** out) {
  if (!c->failed[peer].empty())
    return peer_failed(c, peer);
  auto* r = new Req;
  r->comm = c;
  r->peer = peer;
  r->tag = user_tag;
  r->size = size;
  r->is_recv = true;
  ucp_request_param_t prm{};
  // No immediate completion: the callback always runs, so the received length is always known.
  prm.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.cb.recv = recv_cb;
  prm.user_data = r;
  ucs_status_ptr_t sp = ucp_tag_recv_nbx(c->worker, buf, size, tag, ~uint64_t{0}, &prm);
  if (UCS_PTR_IS_ERR(sp)) {
    delete r;
    return error(RING_TRANSPORT_ERR_INTERNAL,
                 c->who() + ": ucp_tag_recv_nbx: " + ucs_status_string(UCS_PTR_STATUS(sp)));
  }
  r->ucp_req = sp;
  c->live.insert(r);
  *out = r;
  return ok_result();
}

std::string describe(const Comm* c, const Req* r) {
  return c->who() + ": " + (r->is_recv ? "receive from " : "send to ") + "rank " +
         std::to_string(r->peer) + " (tag " + std::to_string(r->tag) + ", " +
         std::to_string(r->size) + " bytes)";
}

// The outcome of a finished request; releases it.
Result finish(Comm* c, Req* r, size_t* bytes) {
  Result res;
  if (r->status != UCS_OK) {
    res.status = map_ucs(r->status);
    // Whatever error UCX chose for it, a request to a peer that is gone failed because the
    // peer is gone: look now rather than at the next liveness round.
    if (res.status != RING_TRANSPORT_ERR_PEER_FAILED && res.status !=
        RING_TRANSPORT_ERR_INVALID_ARGUMENT && c->failed[r->peer].empty() &&
        !local_peer_alive(c->rdv.self(), c->peers[r->peer]))
      mark_failed(c, r->peer, gone(c, r->peer));
    if (!c->failed[r->peer].empty()) res.status = RING_TRANSPORT_ERR_PEER_FAILED;
    res.message = describe(c, r) + ": " + ucs_status_string(r->status);
    if (r->status == UCS_ERR_MESSAGE_TRUNCATED)
      res.message += " (the message is longer than the receive buffer)";
    if (res.status == RING_TRANSPORT_ERR_PEER_FAILED && !c->failed[r->peer].empty())
      res.message += " - " + c->failed[r->peer];
  }
  if (bytes) *bytes = r->length;
  release(r);
  return res;
}

// The caller gives up on r after an error: cancel what can be cancelled, and let the completion
// callback free it (UCX may still hold the request).
void abandon(Comm* c, Req* r) {
  if (r->done) {
    release(r);
    return;
  }
  r->abandoned = true;
  if (r->is_recv) ucp_request_cancel(c->worker, r->ucp_req);
}

// Waits for r until the deadline. all_peers: a collective, which fails when any rank failed.
Result wait_until(Comm* c, Req* r, Clock::time_point deadline, bool all_peers, size_t* bytes) {
  Idle idle;
  for (;;) {
    unsigned n = progress(c);
    if (r->done) return finish(c, r, bytes);
    int dead = -1;
    if (!c->failed[r->peer].empty()) {
      dead = r->peer;
    } else if (all_peers) {
      for (int p = 0; p < c->world && dead < 0; ++p)
        if (!c->failed[p].empty()) dead = p;
    }
    if (dead >= 0) {
      // Give a cancelled receive one more round so its own completion is reported if it came.
      progress(c);
      if (r->done) return finish(c, r, bytes);
      std::string msg = describe(c, r) + ": peer " + std::to_string(dead) +
                        " failed: " + c->failed[dead];
      abandon(c, r);
      return error(RING_TRANSPORT_ERR_PEER_FAILED, msg);
    }
    if (Clock::now() >= deadline)
      return error(RING_TRANSPORT_ERR_TIMEOUT, describe(c, r) + ": not complete in time");
    idle.step(c, n, deadline);
  }
}

// ---- ABI members ------------------------------------------------------------------------------

ring_transport_status_t ucx_probe(char* reason, size_t reason_len) {
  if (reason && reason_len) reason[0] = '\0';
  return RING_TRANSPORT_OK;
}

ring_transport_status_t ucx_finalize(ring_transport_comm_t* c);

ring_transport_status_t ucx_init(const ring_transport_config_t* config,
                                 ring_transport_comm_t** out) {
  ring_transport_config_t cfg;
  std::unique_ptr<Comm> c;
  ring_transport_status_t s0 = start_init("ucx", config, kMaxRanks, out, &cfg, &c);
  if (s0 != RING_TRANSPORT_OK) return s0;
  auto fail = [&](const Result& r) { return abandon_init<ucx_finalize>(c, r); };
  const char* wake_env = std::getenv("RING_UCX_WAKEUP");
  if (wake_env && std::string(wake_env) != "0" && std::string(wake_env) != "1")
    return fail(error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                      std::string("RING_UCX_WAKEUP=") + wake_env +
                          ": must be 0 (poll on a timer) or 1 (sleep on the worker's event fd)"));
  const bool wakeup = !(wake_env && std::string(wake_env) == "0");
  Result res = c->rdv.open(cfg.rendezvous, c->rank, c->world);
  if (!res.ok()) return fail(res);
  Clock::time_point deadline = deadline_after_ms(c->bootstrap_timeout_ms);

  // Round 1: identities, to learn whether every rank is on this host before choosing transports.
  std::vector<std::string> unused;
  if (!(res = c->rdv.publish("host", "")).ok()) return fail(res);
  if (!(res = c->rdv.gather("host", {}, deadline, &c->peers, &unused)).ok()) return fail(res);
  c->all_local = true;
  for (const PeerIdentity& p : c->peers)
    c->all_local = c->all_local && same_pid_space(c->rdv.self(), p);

  ucp_config_t* ucfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &ucfg);
  if (s != UCS_OK)
    return fail(error(RING_TRANSPORT_ERR_INTERNAL,
                      std::string("ucp_config_read: ") + ucs_status_string(s)));
  const char* env_tls = std::getenv("UCX_TLS");
  if (env_tls) {
    c->tls = env_tls;
  } else if (c->all_local) {
    c->tls = "self,posix";
    ucp_config_modify(ucfg, "TLS", "self,posix");
    if (!std::getenv("UCX_NET_DEVICES")) ucp_config_modify(ucfg, "NET_DEVICES", "lo");
  } else {
    c->tls = "UCX default";
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  s = ucp_init(&params, ucfg, &c->context);
  ucp_config_release(ucfg);
  if (s != UCS_OK)
    return fail(error(RING_TRANSPORT_ERR_INTERNAL, "ucp_init (UCX_TLS " + c->tls +
                                                       "): " + ucs_status_string(s)));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(c->context, &wp, &c->worker);
  if (s != UCS_OK)
    return fail(error(RING_TRANSPORT_ERR_INTERNAL,
                      std::string("ucp_worker_create: ") + ucs_status_string(s)));
  if (wakeup && ucp_worker_get_efd(c->worker, &c->efd) != UCS_OK) c->efd = -1;
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(c->worker, &addr, &addr_len);
  if (s != UCS_OK)
    return fail(error(RING_TRANSPORT_ERR_INTERNAL,
                      std::string("ucp_worker_get_address: ") + ucs_status_string(s)));
  std::string payload(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(c->worker, addr);

  // Round 2: worker addresses.
  std::vector<PeerIdentity> ids;
  if (!(res = c->rdv.publish("ucx", payload)).ok()) return fail(res);
  if (!(res = c->rdv.gather("ucx", {}, deadline, &ids, &c->addresses)).ok()) return fail(res);
  for (int p = 0; p < c->world; ++p) {
    if (ids[p].pid != c->peers[p].pid || ids[p].host != c->peers[p].host)
      return fail(error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                        "rendezvous " + c->rdv.dir() + ": rank " + std::to_string(p) +
                            " changed process between rounds (two jobs share the directory?)"));
  }
  c->eps.assign(c->world, nullptr);
  c->failed.assign(c->world, std::string());
  *out = c.release();
  return RING_TRANSPORT_OK;
}

ring_transport_status_t ucx_finalize(ring_transport_comm_t* c) {
  if (!c) return RING_TRANSPORT_OK;
  if (c->worker) {
    // Cancel receives still posted; sends finish with the endpoint flush/close below.
    std::vector<Req*> pending(c->live.begin(), c->live.end());
    for (Req* r : pending) {
      if (r->done) {
        release(r);
        continue;
      }
      r->abandoned = true;
      if (r->is_recv) ucp_request_cancel(c->worker, r->ucp_req);
    }
    close_failed_eps(c);
    // Flush-close live endpoints so eager messages already sent reach peers still running;
    // bounded, then force.
    std::vector<std::pair<int, void*>> flushing;
    for (int p = 0; p < c->world; ++p) {
      if (!c->eps[p]) continue;
      ucp_request_param_t prm{};
      ucs_status_ptr_t sp = ucp_ep_close_nbx(c->eps[p], &prm);
      if (UCS_PTR_IS_PTR(sp)) flushing.push_back({p, sp});
      c->eps[p] = nullptr;
    }
    Clock::time_point deadline = deadline_after_ms(std::min(kCloseFlushMs, c->op_timeout_ms));
    Idle idle;
    auto busy = [&] {
      for (auto& [p, sp] : flushing)
        if (sp && ucp_request_check_status(sp) != UCS_INPROGRESS) {
          ucp_request_free(sp);
          sp = nullptr;
        }
      for (void*& sp : c->closing)
        if (sp && ucp_request_check_status(sp) != UCS_INPROGRESS) {
          ucp_request_free(sp);
          sp = nullptr;
        }
      bool any = false;
      for (auto& f : flushing) any = any || f.second;
      for (void* sp : c->closing) any = any || sp;
      return any || !c->live.empty();
    };
    while (busy() && Clock::now() < deadline) idle.step(c, ucp_worker_progress(c->worker), deadline);
    // Whatever is left is dropped with the worker.
    for (auto& f : flushing)
      if (f.second) ucp_request_free(f.second);
    for (void* sp : c->closing)
      if (sp) ucp_request_free(sp);
    c->destroying = true;
    ucp_worker_destroy(c->worker);
    for (Req* r : c->live) delete r;
    c->live.clear();
  }
  if (c->context) ucp_cleanup(c->context);
  delete c;
  return RING_TRANSPORT_OK;
}

ring_transport_status_t ucx_isend(ring_transport_comm_t* c, const void* buf, size_t size, int peer,
                                  uint32_t tag, ring_transport_request_t** request) {
  if (!c || !request) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  *request = nullptr;
  if (c->bad_peer(peer) || (!buf && size))
    return c->fail(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                   c->who() + ": isend to rank " + std::to_string(peer) + " of " +
                       std::to_string(c->world) + (buf || !size ? "" : " with a NULL buffer"));
  Result res = post_send(c, buf, size, peer, make_tag(kUser, c->rank, tag), tag, request);
  return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
}

ring_transport_status_t ucx_irecv(ring_transport_comm_t* c, void* buf, size_t size, int peer,
                                  uint32_t tag, ring_transport_request_t** request) {
  if (!c || !request) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  *request = nullptr;
  if (c->bad_peer(peer) || (!buf && size))
    return c->fail(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                   c->who() + ": irecv from rank " + std::to_string(peer) + " of " +
                       std::to_string(c->world) + (buf || !size ? "" : " with a NULL buffer"));
  Result res = post_recv(c, buf, size, peer, make_tag(kUser, peer, tag), tag, request);
  return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
}

ring_transport_status_t ucx_test(ring_transport_comm_t* c, ring_transport_request_t* r,
                                 int* done, size_t* bytes) {
  if (!c || !r || !done) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  progress(c);
  *done = 0;
  if (r->done) {
    *done = 1;
    Result res = finish(c, r, bytes);
    return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
  }
  if (!c->failed[r->peer].empty()) {
    *done = 1;
    std::string msg = describe(c, r) + ": peer failed: " + c->failed[r->peer];
    abandon(c, r);
    return c->fail(RING_TRANSPORT_ERR_PEER_FAILED, msg);
  }
  return RING_TRANSPORT_OK;
}

ring_transport_status_t ucx_wait(ring_transport_comm_t* c, ring_transport_request_t* r,
                                 int timeout_ms, size_t* bytes) {
  if (!c || !r) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  Result res = wait_until(c, r, deadline_after_ms(c->timeout(timeout_ms)), false, bytes);
  return res.ok() ? RING_TRANSPORT_OK : c->fail(res);
}

ring_transport_status_t ucx_arm_wakeup(ring_transport_comm_t* c, int* fd) {
  if (!c || !fd) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  ucs_status_t st;
  if (arm(c, fd, &st)) return RING_TRANSPORT_OK;
  if (c->efd < 0)
    return c->fail(RING_TRANSPORT_ERR_UNSUPPORTED,
                   c->who() + ": no wake-up (RING_UCX_WAKEUP=0, or the worker has no event fd)");
  return c->fail(RING_TRANSPORT_ERR_INTERNAL,
                 c->who() + ": ucp_worker_arm: " + ucs_status_string(st));
}

ring_transport_status_t ucx_connect(ring_transport_comm_t* c, const int* peers, int n_peers,
                                    int timeout_ms) {
  if (!c) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  std::vector<int> list;
  if (Result r = c->connect_list(peers, n_peers, &list); !r.ok()) return c->fail(r);
  Clock::time_point deadline = deadline_after_ms(c->timeout(timeout_ms));
  // A one-byte hello each way: it proves the wire-up and that the peer runs this code.
  std::vector<uint8_t> in(list.size(), 0);
  const uint8_t out = 1;
  std::vector<Req*> reqs;
  Result res;
  for (size_t i = 0; i < list.size() && res.ok(); ++i) {
    Req* r = nullptr;
    res = post_recv(c, &in[i], 1, list[i], make_tag(kHello, list[i], 0), 0, &r);
    if (res.ok()) reqs.push_back(r);
  }
  for (size_t i = 0; i < list.size() && res.ok(); ++i) {
    Req* r = nullptr;
    res = post_send(c, &out, 1, list[i], make_tag(kHello, c->rank, 0), 0, &r);
    if (res.ok()) reqs.push_back(r);
  }
  size_t i = 0;
  for (; i < reqs.size() && res.ok(); ++i) res = wait_until(c, reqs[i], deadline, false, nullptr);
  for (; i < reqs.size(); ++i) abandon(c, reqs[i]);
  if (res.ok()) return RING_TRANSPORT_OK;
  res.message = c->who() + ": connect: " + res.message;
  return c->fail(res);
}

// ---- collectives ------------------------------------------------------------------------------

struct Coll {
  Comm* c;
  uint32_t seq;
  Clock::time_point deadline;
  int next, prev;
};

// Starts a collective: refuses when an earlier one broke or a peer failed.
Result coll_begin(Comm* c, int timeout_ms, Coll* k) {
  k->c = c;
  k->seq = c->coll_seq++ & 0xffff;
  k->deadline = deadline_after_ms(c->timeout(timeout_ms));
  k->next = (c->rank + 1) % c->world;
  k->prev = (c->rank + c->world - 1) % c->world;
  if (!c->coll_broken.ok()) return c->coll_broken;
  progress(c);
  for (int p = 0; p < c->world; ++p)
    if (!c->failed[p].empty())
      return error(RING_TRANSPORT_ERR_PEER_FAILED,
                   c->who() + ": rank " + std::to_string(p) + " failed: " + c->failed[p]);
  return ok_result();
}

// Receive rsize bytes from `from` while sending ssize bytes to `to`, both for step `step`.
Result exchange(Coll& k, uint32_t step, const void* sbuf, size_t ssize, int to, void* rbuf,
                size_t rsize, int from) {
  Comm* c = k.c;
  uint32_t low = (k.seq << 16) | (step & 0xffff);
  Req* rr = nullptr;
  Req* sr = nullptr;
  Result res = post_recv(c, rbuf, rsize, from, make_tag(kCollective, from, low), low, &rr);
  if (res.ok()) res = post_send(c, sbuf, ssize, to, make_tag(kCollective, c->rank, low), low, &sr);
  // wait_until releases a request unless it times out; a timed-out one is abandoned here since
  // the collective is over for this rank.
  for (Req** q : {&rr, &sr}) {
    if (!res.ok() || !*q) continue;
    res = wait_until(c, *q, k.deadline, true, nullptr);
    if (res.status != RING_TRANSPORT_ERR_TIMEOUT) *q = nullptr;
  }
  if (rr) abandon(c, rr);
  if (sr) abandon(c, sr);
  return res;
}

ring_transport_status_t coll_end(Comm* c, Result res, const char* what) {
  if (res.ok()) return RING_TRANSPORT_OK;
  res.message = c->who() + ": " + what + ": " + res.message;
  // Some messages of this collective may be in flight: later collectives could match them.
  c->coll_broken = res;
  return c->fail(res);
}

float* scratch(Comm* c, int i, size_t count) {
  if (c->scratch[i].size() < count * sizeof(float)) c->scratch[i].resize(count * sizeof(float));
  return reinterpret_cast<float*>(c->scratch[i].data());
}

// acc[i] = in[i] + acc[i]: the incoming partial sum first, then this rank's value.
void add_into(float* acc, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = in[i] + acc[i];
}
void add_to(float* out, const float* in, const float* own, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = in[i] + own[i];
}

size_t block_begin(size_t count, int world, int b) {
  return static_cast<size_t>((static_cast<unsigned __int128>(count) * b) / world);
}

ring_transport_status_t ucx_all_reduce(ring_transport_comm_t* c, const float* send, float* recv,
                                       size_t count, int timeout_ms) {
  if (!c || (count && (!send || !recv))) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  Coll k;
  Result res = coll_begin(c, timeout_ms, &k);
  if (!res.ok()) return c->fail(res);
  if (send != recv && count) std::memmove(recv, send, count * sizeof(float));
  const int P = c->world, r = c->rank;
  if (P == 1 || count == 0) return RING_TRANSPORT_OK;
  auto blk = [&](int b) { return ((b % P) + P) % P; };
  size_t max_block = 0;
  for (int b = 0; b < P; ++b)
    max_block = std::max(max_block, block_begin(count, P, b + 1) - block_begin(count, P, b));
  float* tmp = scratch(c, 0, max_block);
  // Reduce-scatter in place: at step s send block r-s-1 (own value at s = 0, then the partial
  // sum made at step s-1), receive block r-s-2 and add own value; rank r ends with block r.
  for (int s = 0; s < P - 1 && res.ok(); ++s) {
    int sb = blk(r - s - 1), rb = blk(r - s - 2);
    size_t so = block_begin(count, P, sb), sn = block_begin(count, P, sb + 1) - so;
    size_t ro = block_begin(count, P, rb), rn = block_begin(count, P, rb + 1) - ro;
    res = exchange(k, s, recv + so, sn * sizeof(float), k.next, tmp, rn * sizeof(float), k.prev);
    if (res.ok()) add_into(recv + ro, tmp, rn);
  }
  // All-gather: pass finished blocks on; block r-s at step s.
  for (int s = 0; s < P - 1 && res.ok(); ++s) {
    int sb = blk(r - s), rb = blk(r - s - 1);
    size_t so = block_begin(count, P, sb), sn = block_begin(count, P, sb + 1) - so;
    size_t ro = block_begin(count, P, rb), rn = block_begin(count, P, rb + 1) - ro;
    res = exchange(k, P + s, recv + so, sn * sizeof(float), k.next, recv + ro, rn * sizeof(float),
                   k.prev);
  }
  return coll_end(c, res, "all_reduce_sum_f32");
}

ring_transport_status_t ucx_reduce_scatter(ring_transport_comm_t* c, const float* send,
                                           float* recv, size_t n, int timeout_ms) {
  if (!c || (n && (!send || !recv))) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  const int P = c->world, r = c->rank;
  if (n && recv + n > send && send + n * P > recv)
    return c->fail(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                   c->who() + ": reduce_scatter_sum_f32: send and recv overlap");
  Coll k;
  Result res = coll_begin(c, timeout_ms, &k);
  if (!res.ok()) return c->fail(res);
  if (n == 0) return RING_TRANSPORT_OK;
  if (P == 1) {
    std::memcpy(recv, send, n * sizeof(float));
    return RING_TRANSPORT_OK;
  }
  auto blk = [&](int b) { return ((b % P) + P) % P; };
  float* buf[2] = {scratch(c, 0, n), scratch(c, 1, n)};
  // Same schedule as all_reduce's first phase; partial sums alternate between two scratch
  // buffers (one is being sent while the other receives), the last lands in recv.
  for (int s = 0; s < P - 1 && res.ok(); ++s) {
    int sb = blk(r - s - 1), rb = blk(r - s - 2);
    const float* out = s == 0 ? send + static_cast<size_t>(sb) * n : buf[(s - 1) % 2];
    float* in = buf[s % 2];
    res = exchange(k, s, out, n * sizeof(float), k.next, in, n * sizeof(float), k.prev);
    if (res.ok()) add_to(s == P - 2 ? recv : in, in, send + static_cast<size_t>(rb) * n, n);
  }
  return coll_end(c, res, "reduce_scatter_sum_f32");
}

ring_transport_status_t ucx_all_gather(ring_transport_comm_t* c, const void* send, void* recv,
                                       size_t bytes, int timeout_ms) {
  if (!c || (bytes && (!send || !recv))) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  Coll k;
  Result res = coll_begin(c, timeout_ms, &k);
  if (!res.ok()) return c->fail(res);
  const int P = c->world, r = c->rank;
  char* out = static_cast<char*>(recv);
  if (bytes && send != out + static_cast<size_t>(r) * bytes)
    std::memmove(out + static_cast<size_t>(r) * bytes, send, bytes);
  auto blk = [&](int b) { return static_cast<size_t>(((b % P) + P) % P); };
  for (int s = 0; s < P - 1 && res.ok(); ++s)
    res = exchange(k, s, out + blk(r - s) * bytes, bytes, k.next, out + blk(r - s - 1) * bytes,
                   bytes, k.prev);
  return coll_end(c, res, "all_gather");
}

// Checks the group of an all-to-all: distinct ranks of the comm, the caller among them. Returns
// the caller's index, or -1 with *why set.
int group_index(const Comm* c, const int* group, int n, std::string* why) {
  if (!group || n < 1) {
    *why = "empty group";
    return -1;
  }
  int self = -1;
  std::vector<char> seen(static_cast<size_t>(c->world), 0);
  for (int i = 0; i < n; ++i) {
    const int r = group[i];
    if (r < 0 || r >= c->world) {
      *why = "group member " + std::to_string(r) + " is not a rank of 0.." +
             std::to_string(c->world - 1);
      return -1;
    }
    if (seen[r]++) {
      *why = "rank " + std::to_string(r) + " appears twice in the group";
      return -1;
    }
    if (r == c->rank) self = i;
  }
  if (self < 0) *why = "the caller (rank " + std::to_string(c->rank) + ") is not in the group";
  return self;
}

ring_transport_status_t ucx_all_to_all(ring_transport_comm_t* c, const int* group, int n,
                                       const void* send, const size_t* send_offsets,
                                       const size_t* send_bytes, void* recv,
                                       const size_t* recv_offsets, const size_t* recv_bytes,
                                       int timeout_ms) {
  if (!c || !send_offsets || !send_bytes || !recv_offsets || !recv_bytes)
    return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  std::string why;
  const int self = group_index(c, group, n, &why);
  if (self < 0)
    return c->fail(RING_TRANSPORT_ERR_INVALID_ARGUMENT, c->who() + ": all_to_all: " + why);
  const Clock::time_point deadline = deadline_after_ms(c->timeout(timeout_ms));
  const char* sbuf = static_cast<const char*>(send);
  char* rbuf = static_cast<char*>(recv);
  if (send_bytes[self] != recv_bytes[self])
    return c->fail(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                   c->who() + ": all_to_all: sends itself " + std::to_string(send_bytes[self]) +
                       " bytes but expects " + std::to_string(recv_bytes[self]));
  if (send_bytes[self]) std::memcpy(rbuf + recv_offsets[self], sbuf + send_offsets[self],
                                    send_bytes[self]);
  // Receives first, then the sends; wait for all of them. A longer message fails as a
  // truncation, a shorter one by its length.
  const uint64_t low = 0;
  std::vector<Req*> recvs(static_cast<size_t>(n), nullptr), sends(static_cast<size_t>(n), nullptr);
  Result res = ok_result();
  for (int i = 0; i < n && res.ok(); ++i) {
    if (i == self) continue;
    res = post_recv(c, rbuf + recv_offsets[i], recv_bytes[i], group[i],
                    make_tag(kGroup, group[i], low), 0, &recvs[i]);
  }
  for (int i = 0; i < n && res.ok(); ++i) {
    if (i == self) continue;
    res = post_send(c, sbuf + send_offsets[i], send_bytes[i], group[i],
                    make_tag(kGroup, c->rank, low), 0, &sends[i]);
  }
  for (int i = 0; i < n; ++i) {
    for (Req** q : {&recvs[i], &sends[i]}) {
      if (!*q) continue;
      if (!res.ok()) {
        abandon(c, *q);
        *q = nullptr;
        continue;
      }
      const bool is_recv = (*q)->is_recv;
      size_t got = 0;
      res = wait_until(c, *q, deadline, false, &got);
      if (res.status != RING_TRANSPORT_ERR_TIMEOUT) *q = nullptr;
      else {
        abandon(c, *q);
        *q = nullptr;
      }
      if (res.ok() && is_recv && got != recv_bytes[i])
        res = error(RING_TRANSPORT_ERR_INVALID_ARGUMENT,
                    "received " + std::to_string(got) + " bytes from rank " +
                        std::to_string(group[i]) + ", expected " + std::to_string(recv_bytes[i]));
    }
  }
  if (res.ok()) return RING_TRANSPORT_OK;
  res.message = c->who() + ": all_to_all (group of " + std::to_string(n) + "): " + res.message;
  return c->fail(res);
}

ring_transport_status_t ucx_barrier(ring_transport_comm_t* c, int timeout_ms) {
  if (!c) return RING_TRANSPORT_ERR_INVALID_ARGUMENT;
  Coll k;
  Result res = coll_begin(c, timeout_ms, &k);
  if (!res.ok()) return c->fail(res);
  // Dissemination: ceil(log2 P) rounds of empty messages to rank + 2^i.
  uint32_t round = 0;
  for (int d = 1; d < c->world && res.ok(); d <<= 1, ++round)
    res = exchange(k, round, nullptr, 0, (c->rank + d) % c->world, nullptr, 0,
                   (c->rank - d + c->world) % c->world);
  return coll_end(c, res, "barrier");
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const ring_transport_t ring_transport_plugin = {
    RING_TRANSPORT_HEADER,
    .name = "ucx",
    .caps = RING_TRANSPORT_CAP_HOST_MEMORY | RING_TRANSPORT_CAP_TAG_MATCHING |
            RING_TRANSPORT_CAP_RING_SUM_ORDER,
    .probe = guarded<ucx_probe>,
    .init = guarded<ucx_init>,
    .finalize = guarded<ucx_finalize>,
    .connect = guarded<ucx_connect>,
    .isend = guarded<ucx_isend>,
    .irecv = guarded<ucx_irecv>,
    .test = guarded<ucx_test>,
    .wait = guarded<ucx_wait>,
    .all_reduce_sum_f32 = guarded<ucx_all_reduce>,
    .reduce_scatter_sum_f32 = guarded<ucx_reduce_scatter>,
    .all_gather = guarded<ucx_all_gather>,
    .barrier = guarded<ucx_barrier>,
    .last_error = last_error_of<ring_transport_comm>,
    .arm_wakeup = guarded<ucx_arm_wakeup>,
    .all_to_all = guarded<ucx_all_to_all>,
};
