/*
 * ring_args.c - the --ring-* options of srun, sbatch and salloc. Registered with
 * spank_option_register() from slurm_spank_init (a static spank_options[] table would not show
 * in sbatch). Each callback validates its value at once, so `srun --ring-order=bogus` fails in
 * srun, before any allocation or step exists; slurmstepd runs the same callbacks again on the
 * values forwarded to it.
 */
#include <stdio.h>
#include <string.h>

#include "ring_spank.h"

struct ring_config ring_config = {.allow_tcp = 1};
struct ring_args ring_args;

enum { OPT_JOB = 1, OPT_ORDER = 2, OPT_COORD = 3 };

static int option_cb(int val, const char *optarg, int remote);

static struct spank_option ring_option_table[] = {
    {"ring-job", "ID",
     "ringmaster job id (1-64 characters from [A-Za-z0-9._-], starting with a letter or digit). "
     "Turns on the ringmaster task environment (RING_JOB_ID, RING_NODE_RANK, RING_GPU, ...).",
     1, OPT_JOB, option_cb},
    {"ring-order", "ORDER",
     "ringmaster ring order of the nodes: topology (default, chosen by ring-coord), slurm, "
     "natural, or list:I,J,... (a permutation of the node ranks 0..N-1). Needs --ring-job.",
     1, OPT_ORDER, option_cb},
    {"ring-coord", "ENDPOINT",
     "ringmaster coordinator endpoint: ipc:///absolute/path or tcp://host:port (default: "
     "default_coord in plugstack.conf). Needs --ring-job.",
     1, OPT_COORD, option_cb},
    SPANK_OPTIONS_TABLE_END};

static int option_cb(int val, const char *optarg, int remote) {
  /* parsed into a static: a ring_order_t is 8 KiB, kept off slurmstepd's stack */
  static ring_order_t order;
  char err[RING_ERR_MAX];
  const char *arg = optarg ? optarg : "";

  switch (val) {
    case OPT_JOB:
      if (ring_validate_job_id(arg, err, sizeof(err)) != RING_OK) goto bad;
      snprintf(ring_args.job, sizeof(ring_args.job), "%s", arg);
      ring_args.job_set = 1;
      return 0;
    case OPT_ORDER:
      if (ring_parse_order(arg, &order, err, sizeof(err)) != RING_OK) goto bad;
      ring_args.order = order;
      ring_args.order_set = 1;
      return 0;
    case OPT_COORD:
      if (ring_validate_endpoint(arg, ring_config.allow_tcp, err, sizeof(err)) != RING_OK) goto bad;
      snprintf(ring_args.coord, sizeof(ring_args.coord), "%s", arg);
      ring_args.coord_set = 1;
      return 0;
    default:
      slurm_error(RING_LOG_PREFIX "internal: unknown option value %d", val);
      return -1;
  }
bad:
  snprintf(ring_args.error, sizeof(ring_args.error), "--%s=%.200s%s: %s",
           ring_option_table[val - 1].name, arg, strlen(arg) > 200 ? "..." : "", err);
  slurm_error(RING_LOG_PREFIX "%s", ring_args.error);
  if (remote) {
    ring_args.deferred_error = 1;
    return 0;
  }
  return -1;
}

int ring_args_register(spank_t sp) {
  for (struct spank_option *o = ring_option_table; o->name; o++) {
    spank_err_t rc = spank_option_register(sp, o);
    if (rc != ESPANK_SUCCESS) {
      slurm_error(RING_LOG_PREFIX "cannot register --%s: %s", o->name, spank_strerror(rc));
      return -1;
    }
  }
  return 0;
}

const char *ring_args_coord(void) {
  if (ring_args.coord_set) return ring_args.coord;
  if (ring_config.has_default_coord) return ring_config.default_coord;
  return NULL;
}

int ring_args_check(void) {
  if (!ring_args.job_set) {
    if (ring_args.order_set || ring_args.coord_set) {
      slurm_error(RING_LOG_PREFIX "--%s needs --ring-job=ID (it describes a ringmaster job)",
                  ring_args.order_set ? "ring-order" : "ring-coord");
      return -1;
    }
    return 0;
  }
  if (!ring_args_coord()) {
    slurm_error(RING_LOG_PREFIX
                "--ring-job=%s needs a coordinator: give --ring-coord=ENDPOINT "
                "(ipc:///path or tcp://host:port), or set default_coord= in plugstack.conf",
                ring_args.job);
    return -1;
  }
  return 0;
}
