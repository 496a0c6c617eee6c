/* ringmaster transport ABI, version 1.
 *
 * A transport moves byte buffers between the P processes ("ranks") of one communicator and runs
 * the few collectives a training step needs. Ring attention, the gradient path and the daemons
 * talk only to this struct; plugins fill it. The ABI is C so a plugin can be built by anyone with
 * any compiler; implementations may be C++ but no exception may cross it.
 *
 * Plugins are shared libraries named libring_transport_<name>.so exporting one symbol,
 * `ring_transport_plugin`, of type ring_transport_t.
 *
 * Versioning rule (safe across versions in both directions):
 *  - Both structs that cross the ABI, ring_transport_t (plugin -> caller) and
 *    ring_transport_config_t (caller -> plugin), start with their own size, struct_size, set by
 *    whoever fills them to the sizeof it was compiled with (RING_TRANSPORT_HEADER does it for
 *    the plugin struct).
 *  - A compatible change only appends members at the end of a struct. It does not change
 *    RING_TRANSPORT_ABI_VERSION. A reader reads a member only when it lies wholly inside the
 *    writer's struct_size; a member beyond it is absent (the loader copies the plugin's
 *    struct_size bytes into a zeroed struct, so absent members read as NULL / 0). Every appended
 *    member therefore documents what its absence means, and callers check for NULL.
 *  - The members up to and including last_error are the first layout and are required:
 *    a plugin whose struct_size does not cover them (RING_TRANSPORT_MIN_SIZE) is refused.
 *  - Anything else (a member removed, reordered, retyped or given a new meaning) is
 *    incompatible and bumps RING_TRANSPORT_ABI_VERSION; the loader refuses a plugin whose
 *    abi_version is not its own, naming both numbers.
 *  - For the config, struct_size == 0 means the first layout (everything up to `device`), so
 *    callers that zero-initialise and set only what they need keep working; plugins read it
 *    through a helper that applies this rule (plugins/transport/common/plugin_base.h).
 *
 * Conventions for every member below:
 *  - Return a ring_transport_status_t. On anything but RING_TRANSPORT_OK, last_error(comm) holds
 *    a message naming the rank, peer, tag and size involved, valid until the next call on comm.
 *  - A comm is used by one thread at a time (the caller serialises); different comms are
 *    independent.
 *  - No member lets a C++ exception (or any other unwinding) out: a plugin written in C++
 *    catches everything at the boundary and returns RING_TRANSPORT_ERR_INTERNAL instead.
 *  - Timeouts are in milliseconds; a timeout of 0 means "the comm's op_timeout_ms". Nothing in
 *    this ABI blocks without a bound: blocking members return RING_TRANSPORT_ERR_TIMEOUT.
 *  - A peer that dies or is unreachable is reported as RING_TRANSPORT_ERR_PEER_FAILED by every
 *    operation that depends on it (collectives depend on every rank), never as a hang.
 *  - Memory: a plugin with RING_TRANSPORT_CAP_HOST_MEMORY takes host pointers; with
 *    RING_TRANSPORT_CAP_DEVICE_MEMORY it takes device pointers of the comm's device.
 */
#ifndef RING_PLUGINS_TRANSPORT_TRANSPORT_H_
#define RING_PLUGINS_TRANSPORT_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Changes only on an incompatible change (see the versioning rule above). */
#define RING_TRANSPORT_ABI_VERSION 1
/* The symbol every plugin exports: a const ring_transport_t. */
#define RING_TRANSPORT_SYMBOL "ring_transport_plugin"

/* Status categories. Values are stable (they cross process and version boundaries in logs). */
typedef enum ring_transport_status {
  RING_TRANSPORT_OK = 0,
  /* The caller broke the contract: bad rank, NULL buffer with size > 0, a message longer than the
   * receive buffer, a call on a finalized comm. Retrying the same call cannot succeed. */
  RING_TRANSPORT_ERR_INVALID_ARGUMENT = 1,
  /* A bound expired (bootstrap, connect, wait, collective). The operation may still complete
   * later: a request that timed out stays valid. */
  RING_TRANSPORT_ERR_TIMEOUT = 2,
  /* A peer died, closed its side, or reported an error: the comm cannot complete operations
   * that involve it. The job must roll back; the comm may only be finalized. A peer that
   * finalizes or exits while others still wait for its messages counts as failed too. */
  RING_TRANSPORT_ERR_PEER_FAILED = 3,
  /* A bug or a resource failure inside the plugin or its library (UCX, NCCL, CUDA). */
  RING_TRANSPORT_ERR_INTERNAL = 4,
  /* The plugin cannot do this here: no GPU for NCCL, an operation it does not implement, a
   * bootstrap scheme it does not know. */
  RING_TRANSPORT_ERR_UNSUPPORTED = 5,
} ring_transport_status_t;

/* Static capabilities, in ring_transport_t.caps. */
#define RING_TRANSPORT_CAP_HOST_MEMORY (1ull << 0)   /* buffers are host pointers */
#define RING_TRANSPORT_CAP_DEVICE_MEMORY (1ull << 1) /* buffers are CUDA device pointers */
/* isend/irecv match on (peer, tag); without it (NCCL) messages between a pair match in posting
 * order, tags are ignored, and a receive must be posted with exactly the size sent. */
#define RING_TRANSPORT_CAP_TAG_MATCHING (1ull << 2)
/* Float sums follow the documented ring order (see reduce_scatter_sum_f32), so a test can
 * compute the bit-exact reference; without it, results are identical across ranks but the
 * order is the library's. */
#define RING_TRANSPORT_CAP_RING_SUM_ORDER (1ull << 3)

/* Opaque per-communicator state, created by init. */
typedef struct ring_transport_comm ring_transport_comm_t;
/* Opaque in-flight operation, created by isend/irecv, released by test/wait (see there). */
typedef struct ring_transport_request ring_transport_request_t;

/* Parameters of init. Zero-initialise and set what you need (designated initialisers), so that
 * fields appended later keep their defaults. */
typedef struct ring_transport_config {
  /* sizeof(ring_transport_config_t) as the caller was compiled; 0: the first layout (up to
   * and including device). A plugin ignores members beyond it (they keep their defaults). */
  uint32_t struct_size;
  int rank;       /* 0 <= rank < world_size */
  int world_size; /* >= 1 */
  /* Where ranks meet before they can talk. This ABI knows one scheme: a directory, given as a
   * path or "file:<path>", on a file system every rank sees (local disk on one host; NFS/Lustre
   * across hosts). Each rank writes its address as <dir>/<kind>-<rank> atomically (write a temporary
   * name, then rename) and polls for the others, so ranks may start in any order. The directory
   * must be unique to one communicator of one attempt (stale files from an earlier attempt would
   * be read as live) and is created if missing; its owner (the launcher) deletes it afterwards. */
  const char* rendezvous;
  int bootstrap_timeout_ms; /* bound on init waiting for the other ranks; 0: 60000 */
  int op_timeout_ms;        /* default bound for waits, connect, collectives; 0: 60000 */
  int device;               /* CUDA device for device-memory plugins; -1: rank % device count */
} ring_transport_config_t;

typedef struct ring_transport {
  /* RING_TRANSPORT_ABI_VERSION of the transport.h the plugin was compiled with. */
  uint32_t abi_version;
  /* sizeof(ring_transport_t) as the plugin was compiled: which members it has. */
  uint32_t struct_size;
  /* Short name, the <name> of libring_transport_<name>.so; used in logs and errors. */
  const char* name;
  /* RING_TRANSPORT_CAP_* bits. */
  uint64_t caps;

  /* Can this plugin run on this machine? Cheap, no communication, callable before init and
   * without a comm. Returns OK, or UNSUPPORTED with the reason written to reason (NUL-terminated,
   * truncated to reason_len) - e.g. "no CUDA device: cudaGetDeviceCount: no CUDA-capable device".
   * Never blocks. */
  ring_transport_status_t (*probe)(char* reason, size_t reason_len);

  /* Create a communicator for config->rank of config->world_size and run the bootstrap.
   * Blocking, collective over all ranks: returns when every rank's address is known, or
   * TIMEOUT after bootstrap_timeout_ms naming the missing ranks. *comm is owned by the caller
   * and released by finalize; on failure *comm is NULL and last_error(NULL) tells why (a
   * thread-local message). config and its strings are copied: the caller may free them. */
  ring_transport_status_t (*init)(const ring_transport_config_t* config,
                                  ring_transport_comm_t** comm);

  /* Release comm and everything it holds. Never blocks longer than op_timeout_ms: requests
   * still in flight are cancelled or abandoned (their buffers may be touched until finalize
   * returns, never after). Local only: other ranks are not waited for, so finalizing after a
   * peer failure is fine. comm may be NULL (no-op). Always returns OK or INTERNAL. */
  ring_transport_status_t (*finalize)(ring_transport_comm_t* comm);

  /* Establish connections to the listed peers now instead of on first use, and check each is
   * alive with a handshake, so a broken peer is found at startup rather than mid-step. Ring
   * attention passes {prev, next}; peers == NULL with n_peers == 0 means every rank. Blocking,
   * and symmetric: each listed peer must call connect listing this rank, within timeout_ms.
   * Listing yourself is allowed (self-connections). Sends/receives to peers not connected here
   * connect lazily. Errors: INVALID_ARGUMENT (bad rank), TIMEOUT, PEER_FAILED. */
  ring_transport_status_t (*connect)(ring_transport_comm_t* comm, const int* peers, int n_peers,
                                     int timeout_ms);

  /* Start sending size bytes at buf to rank peer with a user tag. Non-blocking: returns at once
   * with *request set (never NULL on OK). buf is borrowed: the caller must neither free nor
   * write it until test/wait reports the request complete (or finalize returns). size may be 0
   * (buf may then be NULL). Messages from one sender to one receiver with the same tag are
   * received in the order they were sent. Errors are usually reported by test/wait; isend
   * itself fails only for INVALID_ARGUMENT, a peer already known failed (PEER_FAILED) or
   * INTERNAL, and then *request is NULL. */
  ring_transport_status_t (*isend)(ring_transport_comm_t* comm, const void* buf, size_t size,
                                   int peer, uint32_t tag, ring_transport_request_t** request);

  /* Start receiving the next message from peer with tag into buf (capacity size bytes). Same
   * ownership and error rules as isend; buf must not be read until completion. A message
   * longer than size completes the request with INVALID_ARGUMENT (truncation). Shorter messages
   * are fine: test/wait report the received length. */
  ring_transport_status_t (*irecv)(ring_transport_comm_t* comm, void* buf, size_t size, int peer,
                                   uint32_t tag, ring_transport_request_t** request);

  /* Non-blocking completion check; drives progress. *done = 1 when the request has finished -
   * then the request is released (do not use it again) and the return value is its outcome, and
   * *bytes (if not NULL) the bytes transferred. *done = 0 with OK: still in flight. */
  ring_transport_status_t (*test)(ring_transport_comm_t* comm, ring_transport_request_t* request,
                                  int* done, size_t* bytes);

  /* Block until the request finishes or timeout_ms passes (0: op_timeout_ms). On completion
   * (successful or not) the request is released and *bytes set (if not NULL). On TIMEOUT the
   * request stays valid: wait again, or finalize. */
  ring_transport_status_t (*wait)(ring_transport_comm_t* comm, ring_transport_request_t* request,
                                  int timeout_ms, size_t* bytes);

  /* Collectives. All blocking with the bound timeout_ms (0: op_timeout_ms), collective over all
   * ranks, called by every rank in the same order with the same counts. No other operation on
   * the comm may be in flight concurrently (p2p requests may be outstanding, but their tags are
   * separate and they make no progress guarantees during a collective). Results are identical
   * bit for bit on every rank. */

  /* recv[i] = sum over ranks of send[i], i < count, fp32. send == recv is allowed (in place).
   * Ring plugins: reduce-scatter then all-gather, so element i's order is the one given for its
   * block below. */
  ring_transport_status_t (*all_reduce_sum_f32)(ring_transport_comm_t* comm, const float* send,
                                                float* recv, size_t count, int timeout_ms);

  /* send holds world_size blocks of recv_count floats; rank r gets recv[i] = sum over ranks q of
   * block r of q's send, i.e. send_q[r * recv_count + i]. send and recv must not overlap.
   * With RING_TRANSPORT_CAP_RING_SUM_ORDER the sum for block b is the left fold starting at
   * rank b+1: ((x[b+1] + x[b+2]) + ...) + x[b], ranks mod world_size. (For all_reduce the blocks
   * are the balanced split: block b spans [b*count/P, (b+1)*count/P).) */
  ring_transport_status_t (*reduce_scatter_sum_f32)(ring_transport_comm_t* comm,
                                                    const float* send, float* recv,
                                                    size_t recv_count, int timeout_ms);

  /* recv (world_size * bytes_per_rank bytes) gets every rank's send (bytes_per_rank bytes) in
   * rank order. send may alias recv + rank * bytes_per_rank (in place). */
  ring_transport_status_t (*all_gather)(ring_transport_comm_t* comm, const void* send, void* recv,
                                        size_t bytes_per_rank, int timeout_ms);

  /* Returns once every rank has entered the barrier, or fails. */
  ring_transport_status_t (*barrier)(ring_transport_comm_t* comm, int timeout_ms);

  /* The message of the last failure on comm (or, with comm == NULL, the calling thread's last
   * failure in probe/init). Never NULL; "" when there was none. Owned by the plugin. */
  const char* (*last_error)(const ring_transport_comm_t* comm);

  /* Members appended later go here, each optional (NULL when the plugin's struct_size does not
   * reach it) with its absence documented. */

  /* Optional (appended after the first layout). Prepares the caller to sleep until comm may make
   * progress, instead of polling test() on a timer: a progress thread that sleeps in the kernel
   * costs the computing threads beside it nothing, one that wakes every few microseconds costs
   * them a context switch each time.
   * Returns OK with *fd >= 0: armed. The caller may poll(2) fd for POLLIN (it must not read it
   * or change it; the plugin owns it) and calls test() when it is readable: a message arrived
   * or a send can move. Events from calls made after arming (isend, irecv, test by another
   * thread of the caller) may not wake it, so the caller also wakes itself when it posts, and
   * bounds the sleep by a timeout of its own choosing (the plugin's failure checks run inside
   * test()).
   * Returns OK with *fd == -1: not armed, events are pending: call test() again now.
   * Returns UNSUPPORTED: this comm cannot wake a sleeper (its transports have no wake-up);
   * poll test() instead, for the comm's lifetime.
   * Absent (NULL): as UNSUPPORTED. The comm is used by one thread at a time, as for every
   * member; the poll(2) itself is not a call on the comm. */
  ring_transport_status_t (*arm_wakeup)(ring_transport_comm_t* comm, int* fd);

  /* Optional (appended after arm_wakeup). All-to-all inside a group of ranks - the GPUs of one
   * node in head-parallel attention (parallel.head_ranks): group lists n_group distinct ranks of
   * the comm, the caller among them, in the same order on every member. The caller sends
   * send_bytes[i] bytes at send + send_offsets[i] to group[i] and receives exactly recv_bytes[i]
   * bytes from group[i] into recv + recv_offsets[i] (its own entry is copied locally); a message
   * of another length completes it with INVALID_ARGUMENT. Sizes may differ per peer and may be
   * 0. Blocking with the bound timeout_ms (0: op_timeout_ms), collective over the group only:
   * ranks outside it take no part, and disjoint groups of one comm may run theirs at the same
   * time. The members call it in the same order. Point-to-point requests posted before it may be
   * outstanding (as for the other collectives); receive regions must not overlap each other or
   * the send regions. Errors: INVALID_ARGUMENT (the caller not in the group, a rank twice or out
   * of range, a length mismatch), TIMEOUT, PEER_FAILED naming the group member.
   * Absent (NULL): the plugin has no all-to-all, and head-parallel attention cannot run on it
   * (ring-worker refuses parallel.head_ranks > 1 before the first step, naming the transport). */
  ring_transport_status_t (*all_to_all)(ring_transport_comm_t* comm, const int* group,
                                        int n_group, const void* send,
                                        const size_t* send_offsets, const size_t* send_bytes,
                                        void* recv, const size_t* recv_offsets,
                                        const size_t* recv_bytes, int timeout_ms);
} ring_transport_t;

/* The first fields of a plugin's exported struct:
 *   const ring_transport_t ring_transport_plugin = {RING_TRANSPORT_HEADER, .name = ...}; */
#define RING_TRANSPORT_HEADER \
  .abi_version = RING_TRANSPORT_ABI_VERSION, .struct_size = sizeof(ring_transport_t)

/* The bytes every plugin must provide: the required members of the first layout. */
#define RING_TRANSPORT_MIN_SIZE \
  (offsetof(ring_transport_t, last_error) + sizeof(((ring_transport_t*)0)->last_error))
/* The first config layout, what struct_size == 0 stands for. */
#define RING_TRANSPORT_CONFIG_MIN_SIZE \
  (offsetof(ring_transport_config_t, device) + sizeof(((ring_transport_config_t*)0)->device))

/* A stable name for a status, for messages. */
static inline const char* ring_transport_status_name(ring_transport_status_t s) {
  switch (s) {
    case RING_TRANSPORT_OK: return "ok";
    case RING_TRANSPORT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case RING_TRANSPORT_ERR_TIMEOUT: return "timeout";
    case RING_TRANSPORT_ERR_PEER_FAILED: return "peer failed";
    case RING_TRANSPORT_ERR_INTERNAL: return "internal error";
    case RING_TRANSPORT_ERR_UNSUPPORTED: return "unsupported";
  }
  return "unknown status";
}

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // RING_PLUGINS_TRANSPORT_TRANSPORT_H_
