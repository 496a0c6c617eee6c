/*
 * ring_validate.c - see ring_validate.h. Bounded loops over bounded inputs only: this code runs
 * inside srun, sbatch, slurmd and slurmstepd, which must never crash or block because of a
 * user's option value.
 */
/* strnlen */
#define _POSIX_C_SOURCE 200809L

#include "ring_validate.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static ring_status_t fail(ring_status_t st, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static ring_status_t fail(ring_status_t st, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;

  if (err && errlen > 0) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return st;
}

static int is_digit(char c) {
  return c >= '0' && c <= '9';
}
static int is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static int is_alnum(char c) {
  return is_digit(c) || is_alpha(c);
}
static int is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Parses a decimal of 1..maxdigits digits without sign or leading zeros; -1 if malformed. */
static long parse_dec(const char *s, size_t len, size_t maxdigits) {
  long v = 0;

  if (len == 0 || len > maxdigits || (len > 1 && s[0] == '0')) return -1;
  for (size_t i = 0; i < len; i++) {
    if (!is_digit(s[i])) return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

ring_status_t ring_validate_job_id(const char *s, char *err, size_t errlen) {
  size_t n;

  if (!s || !*s)
    return fail(
        RING_E_INVALID, err, errlen,
        "must not be empty (1-%d characters from [A-Za-z0-9._-], starting with a letter or digit)",
        RING_JOB_ID_MAX);
  n = strnlen(s, RING_JOB_ID_MAX + 1);
  if (n > RING_JOB_ID_MAX)
    return fail(RING_E_TOO_LONG, err, errlen, "is longer than %d characters", RING_JOB_ID_MAX);
  if (!is_alnum(s[0]))
    return fail(RING_E_INVALID, err, errlen,
                "must start with a letter or digit (1-%d characters from [A-Za-z0-9._-])",
                RING_JOB_ID_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!is_alnum(c) && c != '.' && c != '_' && c != '-')
      return fail(RING_E_INVALID, err, errlen, "character %zu is not one of [A-Za-z0-9._-]", i + 1);
  }
  return RING_OK;
}

#define ORDER_RULE \
  "must be topology, slurm, natural or list:I,J,... (a permutation of the node ranks 0..N-1)"

ring_status_t ring_parse_order(const char *s, ring_order_t *out, char *err, size_t errlen) {
  /* "list:" + up to RING_ORDER_MAX_NODES entries of at most 4 digits and a comma */
  const size_t max_text = 5 + (size_t)RING_ORDER_MAX_NODES * 5;
  unsigned char seen[RING_ORDER_MAX_NODES];
  const char *p;
  size_t n;

  if (!s || !*s) return fail(RING_E_INVALID, err, errlen, "is empty: " ORDER_RULE);
  n = strnlen(s, max_text + 1);
  if (n > max_text)
    return fail(RING_E_TOO_LONG, err, errlen, "is longer than %zu characters", max_text);
  memset(out, 0, sizeof(*out));
  if (strcmp(s, "topology") == 0) {
    out->kind = RING_ORDER_TOPOLOGY;
    return RING_OK;
  }
  if (strcmp(s, "slurm") == 0) {
    out->kind = RING_ORDER_SLURM;
    return RING_OK;
  }
  if (strcmp(s, "natural") == 0) {
    out->kind = RING_ORDER_NATURAL;
    return RING_OK;
  }
  if (strncmp(s, "list:", 5) != 0) return fail(RING_E_INVALID, err, errlen, ORDER_RULE);

  out->kind = RING_ORDER_LIST;
  p = s + 5;
  if (!*p) return fail(RING_E_INVALID, err, errlen, "list: names no node: " ORDER_RULE);
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    long v;

    if (out->n == RING_ORDER_MAX_NODES)
      return fail(RING_E_TOO_LONG, err, errlen, "list: names more than %d nodes",
                  RING_ORDER_MAX_NODES);
    if (len == 0)
      return fail(RING_E_INVALID, err, errlen, "list: entry %u is empty: " ORDER_RULE, out->n + 1);
    v = parse_dec(p, len, 4);
    if (v < 0)
      return fail(
          RING_E_INVALID, err, errlen,
          "list: entry %u ('%.*s') is not a node rank (a decimal without sign or leading zeros)",
          out->n + 1, (int)(len > 16 ? 16 : len), p);
    if (v >= RING_ORDER_MAX_NODES)
      return fail(RING_E_RANGE, err, errlen,
                  "list: entry %u (%ld) is above the largest node rank %d", out->n + 1, v,
                  RING_ORDER_MAX_NODES - 1);
    out->list[out->n++] = (uint16_t)v;
    if (!end) break;
    p = end + 1;
  }
  /* a permutation of 0..n-1: every rank below n, none twice */
  memset(seen, 0, sizeof(seen));
  for (uint32_t i = 0; i < out->n; i++) {
    uint16_t v = out->list[i];
    if (v >= out->n)
      return fail(RING_E_RANGE, err, errlen,
                  "list: entry %u (%u) is out of range: a list of %u nodes holds each rank 0..%u "
                  "exactly once",
                  i + 1, v, out->n, out->n - 1);
    if (seen[v])
      return fail(
          RING_E_RANGE, err, errlen,
          "list: rank %u appears twice: a list of %u nodes holds each rank 0..%u exactly once", v,
          out->n, out->n - 1);
    seen[v] = 1;
  }
  return RING_OK;
}

int ring_format_order(const ring_order_t *o, char *buf, size_t len) {
  static const char *const names[] = {"topology", "slurm", "natural", "list"};
  size_t used;
  int w;

  if (!buf || len == 0 || (unsigned)o->kind > RING_ORDER_LIST) return -1;
  w = snprintf(buf, len, "%s", names[o->kind]);
  if (w < 0 || (size_t)w >= len) return -1;
  used = (size_t)w;
  for (uint32_t i = 0; o->kind == RING_ORDER_LIST && i < o->n; i++) {
    w = snprintf(buf + used, len - used, "%c%u", i == 0 ? ':' : ',', o->list[i]);
    if (w < 0 || (size_t)w >= len - used) return -1;
    used += (size_t)w;
  }
  return 0;
}

ring_status_t ring_check_order_nodes(const ring_order_t *o, uint32_t nnodes, char *err,
                                     size_t errlen) {
  if (o->kind != RING_ORDER_LIST || o->n == nnodes) return RING_OK;
  return fail(
      RING_E_RANGE, err, errlen,
      "list: names %u node(s) but the step runs on %u: give each node rank 0..%u exactly once",
      o->n, nnodes, nnodes ? nnodes - 1 : 0);
}

int64_t ring_order_position(const ring_order_t *o, uint32_t node_rank) {
  switch (o->kind) {
    case RING_ORDER_SLURM:
    case RING_ORDER_NATURAL:
      return node_rank;
    case RING_ORDER_LIST:
      for (uint32_t i = 0; i < o->n; i++)
        if (o->list[i] == node_rank) return i;
      return -1;
    default:
      return -1;
  }
}

static ring_status_t check_hostname(const char *h, size_t len, char *err, size_t errlen) {
  size_t label = 0;
  int all_numeric = 1;

  if (len == 0) return fail(RING_E_INVALID, err, errlen, "tcp:// needs a host before ':port'");
  if (len > 253) return fail(RING_E_TOO_LONG, err, errlen, "host is longer than 253 characters");
  for (size_t i = 0; i < len; i++) {
    char c = h[i];
    if (c == '.') {
      if (label == 0 || h[i - 1] == '-')
        return fail(RING_E_INVALID, err, errlen,
                    "host '%.*s' has an empty label or one ending in '-'", (int)len, h);
      label = 0;
      continue;
    }
    if (!is_alnum(c) && c != '-')
      return fail(
          RING_E_INVALID, err, errlen,
          "host '%.*s': character '%c' is not allowed (a DNS name, an IPv4 address or [IPv6])",
          (int)len, h, c);
    if (c == '-' && label == 0)
      return fail(RING_E_INVALID, err, errlen, "host '%.*s' has a label starting with '-'",
                  (int)len, h);
    if (!is_digit(c)) all_numeric = 0;
    if (++label > 63)
      return fail(RING_E_TOO_LONG, err, errlen, "host has a label longer than 63 characters");
  }
  if (label == 0 || h[len - 1] == '-')
    return fail(RING_E_INVALID, err, errlen, "host '%.*s' ends with '.' or '-'", (int)len, h);
  if (all_numeric) {
    /* looks like IPv4: exactly four octets 0-255 */
    const char *p = h, *end = h + len;
    for (int k = 0; k < 4; k++) {
      const char *dot = memchr(p, '.', (size_t)(end - p));
      size_t l = dot ? (size_t)(dot - p) : (size_t)(end - p);
      long v = parse_dec(p, l, 3);
      if (v < 0 || v > 255 || (k < 3 && !dot) || (k == 3 && dot))
        return fail(RING_E_INVALID, err, errlen,
                    "host '%.*s' is not an IPv4 address (four numbers 0-255)", (int)len, h);
      p = dot ? dot + 1 : end;
    }
  }
  return RING_OK;
}

#define ENDPOINT_RULE "must be ipc:///absolute/path or tcp://host:port"

ring_status_t ring_validate_endpoint(const char *s, int allow_tcp, char *err, size_t errlen) {
  size_t n;

  if (!s || !*s) return fail(RING_E_INVALID, err, errlen, "is empty: " ENDPOINT_RULE);
  n = strnlen(s, RING_ENDPOINT_MAX + 1);
  if (n > RING_ENDPOINT_MAX)
    return fail(RING_E_TOO_LONG, err, errlen, "is longer than %d characters", RING_ENDPOINT_MAX);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f)
      return fail(RING_E_INVALID, err, errlen,
                  "contains a space or control character at position %zu", i + 1);

  if (strncmp(s, "ipc://", 6) == 0) {
    const char *path = s + 6;
    size_t plen = n - 6;
    if (path[0] != '/')
      return fail(RING_E_INVALID, err, errlen,
                  "ipc:// needs an absolute path (ipc:///run/ring/coord.sock)");
    if (plen > RING_IPC_PATH_MAX)
      return fail(RING_E_TOO_LONG, err, errlen,
                  "ipc:// path is %zu bytes, a unix socket path holds at most %d", plen,
                  RING_IPC_PATH_MAX);
    if (path[plen - 1] == '/')
      return fail(RING_E_INVALID, err, errlen, "ipc:// path names a directory, not a socket");
    return RING_OK;
  }
  if (strncmp(s, "tcp://", 6) == 0) {
    const char *hp = s + 6, *colon, *host;
    size_t hlen;
    long port;
    ring_status_t st;

    if (hp[0] == '[') {
      const char *close = strchr(hp, ']');
      if (!close || close == hp + 1)
        return fail(RING_E_INVALID, err, errlen, "tcp://[ needs an IPv6 address and a closing ']'");
      for (const char *c = hp + 1; c < close; c++)
        if (!is_hex(*c) && *c != ':' && *c != '.')
          return fail(RING_E_INVALID, err, errlen, "'%.*s' is not an IPv6 address",
                      (int)(close - hp - 1), hp + 1);
      if (!memchr(hp + 1, ':', (size_t)(close - hp - 1)))
        return fail(RING_E_INVALID, err, errlen, "'%.*s' is not an IPv6 address",
                    (int)(close - hp - 1), hp + 1);
      if (close[1] != ':')
        return fail(RING_E_INVALID, err, errlen, "tcp:// needs ':port' after the host");
      colon = close + 1;
    } else {
      colon = strrchr(hp, ':');
      if (!colon) return fail(RING_E_INVALID, err, errlen, "tcp:// needs host:port");
      host = hp;
      hlen = (size_t)(colon - hp);
      if (memchr(host, ':', hlen))
        return fail(RING_E_INVALID, err, errlen,
                    "write an IPv6 host in brackets: tcp://[::1]:port");
      if (hlen == 1 && host[0] == '*')
        return fail(RING_E_INVALID, err, errlen,
                    "host '*' binds, it does not connect: name the coordinator's host");
      st = check_hostname(host, hlen, err, errlen);
      if (st != RING_OK) return st;
    }
    port = parse_dec(colon + 1, strlen(colon + 1), 5);
    if (port < 0)
      return fail(RING_E_INVALID, err, errlen, "port '%.8s' is not a decimal number", colon + 1);
    if (port < 1 || port > 65535)
      return fail(RING_E_RANGE, err, errlen, "port %ld is outside 1-65535", port);
    if (!allow_tcp)
      return fail(
          RING_E_REFUSED, err, errlen,
          "tcp:// endpoints are disabled on this cluster (plugstack.conf allow_tcp=0): use ipc://");
    return RING_OK;
  }
  return fail(RING_E_INVALID, err, errlen, ENDPOINT_RULE);
}

ring_status_t ring_parse_bool01(const char *s, int *out, char *err, size_t errlen) {
  if (s && strcmp(s, "0") == 0) {
    *out = 0;
    return RING_OK;
  }
  if (s && strcmp(s, "1") == 0) {
    *out = 1;
    return RING_OK;
  }
  return fail(RING_E_INVALID, err, errlen, "must be 0 or 1");
}

ring_status_t ring_pick_gpu(const char *cuda_visible, uint32_t local_rank, char *gpu, size_t gpulen,
                            int *ordinal, char *err, size_t errlen) {
  const size_t max_text = 4096;
  uint32_t count = 0, want;
  const char *p;

  *ordinal = -1;
  if (gpulen < RING_GPU_MAX + 1)
    return fail(RING_E_TOO_LONG, err, errlen, "internal: GPU buffer too small");
  snprintf(gpu, gpulen, "none");
  if (!cuda_visible || !*cuda_visible || strcmp(cuda_visible, "NoDevFiles") == 0) return RING_OK;
  if (strnlen(cuda_visible, max_text + 1) > (size_t)max_text)
    return fail(RING_E_TOO_LONG, err, errlen, "CUDA_VISIBLE_DEVICES is longer than %zu characters",
                max_text);

  /* count and check the entries */
  p = cuda_visible;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == 0 || len > RING_GPU_MAX)
      return fail(RING_E_INVALID, err, errlen,
                  "CUDA_VISIBLE_DEVICES='%.64s' has an empty or over-long entry", cuda_visible);
    for (size_t i = 0; i < len; i++)
      if (!is_alnum(p[i]) && p[i] != '-')
        return fail(RING_E_INVALID, err, errlen,
                    "CUDA_VISIBLE_DEVICES='%.64s': entries are GPU indices or UUIDs", cuda_visible);
    count++;
    if (!end) break;
    p = end + 1;
  }

  want = local_rank % count;
  p = cuda_visible;
  for (uint32_t k = 0; k < want; k++) p = strchr(p, ',') + 1;
  {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    memcpy(gpu, p, len);
    gpu[len] = '\0';
  }
  *ordinal = (int)want;
  return RING_OK;
}
