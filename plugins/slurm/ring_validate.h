/*
 * ring_validate.h - parsing and validation of the values the ringmaster SPANK plugin accepts
 * (option values, plugstack.conf arguments, what Slurm hands to a task). Pure C: no Slurm
 * header, no allocation, no I/O, so it is unit-tested without a cluster
 * (tests/slurm/spank_validate_test.cc).
 *
 * Every function writes the rule that was broken into err (always NUL-terminated, truncated to
 * errlen) and returns a status; callers prefix the option or argument name.
 */
#ifndef RING_PLUGINS_SLURM_RING_VALIDATE_H
#define RING_PLUGINS_SLURM_RING_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ring_status {
  RING_OK = 0,
  RING_E_INVALID = 1,  /* malformed value: wrong syntax or unknown word */
  RING_E_RANGE = 2,    /* well-formed but out of range (port 0, duplicate rank, ...) */
  RING_E_TOO_LONG = 3, /* longer than the limit stated in the message */
  RING_E_REFUSED = 4,  /* valid, but this cluster's configuration refuses it (allow_tcp=0) */
} ring_status_t;

/* Error message buffers: callers use this size. */
#define RING_ERR_MAX 320

/* ringmaster job id: the same rule as job.name in the job spec. */
#define RING_JOB_ID_MAX 64
ring_status_t ring_validate_job_id(const char *s, char *err, size_t errlen);

/* Ring order. list: a permutation of the node ranks 0..n-1 (n <= RING_ORDER_MAX_NODES). */
#define RING_ORDER_MAX_NODES 4096
typedef enum ring_order_kind {
  RING_ORDER_TOPOLOGY = 0, /* chosen by ring-coord from GPU/NUMA and switch topology */
  RING_ORDER_SLURM,        /* Slurm's node list order (SLURM_NODEID) */
  RING_ORDER_NATURAL,      /* node rank order */
  RING_ORDER_LIST,         /* explicit order */
} ring_order_kind_t;

typedef struct ring_order {
  ring_order_kind_t kind;
  uint32_t n;                          /* entries in list (RING_ORDER_LIST only) */
  uint16_t list[RING_ORDER_MAX_NODES]; /* list[i] = node rank at ring position i */
} ring_order_t;

ring_status_t ring_parse_order(const char *s, ring_order_t *out, char *err, size_t errlen);
/* Canonical text ("topology", "list:2,0,1"); returns 0, or -1 when buf is too small. */
int ring_format_order(const ring_order_t *o, char *buf, size_t len);
/* A list must name exactly the step's nnodes nodes. Other kinds fit any count. */
ring_status_t ring_check_order_nodes(const ring_order_t *o, uint32_t nnodes, char *err,
                                     size_t errlen);
/* Position of node_rank in the ring, or -1 when only ring-coord knows it (topology). */
int64_t ring_order_position(const ring_order_t *o, uint32_t node_rank);

/* Coordinator endpoint: ipc:///absolute/path (at most RING_IPC_PATH_MAX bytes, a unix socket
 * path) or tcp://host:port (host: DNS name, IPv4 or [IPv6]; port 1-65535). */
#define RING_ENDPOINT_MAX 255
#define RING_IPC_PATH_MAX 107
ring_status_t ring_validate_endpoint(const char *s, int allow_tcp, char *err, size_t errlen);

/* "0" or "1" only. */
ring_status_t ring_parse_bool01(const char *s, int *out, char *err, size_t errlen);

/* The task's GPU from CUDA_VISIBLE_DEVICES (as Slurm's gres/gpu set it; NULL when unset):
 *  - no GPU (unset, empty, "NoDevFiles"): gpu = "none", ordinal = -1;
 *  - one entry: that entry, ordinal 0;
 *  - several (tasks of a node share them): entry local_rank % count, ordinal = that index.
 * Entries are indices or UUIDs: [A-Za-z0-9-], at most 63 bytes. */
#define RING_GPU_MAX 63
ring_status_t ring_pick_gpu(const char *cuda_visible, uint32_t local_rank, char *gpu, size_t gpulen,
                            int *ordinal, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
