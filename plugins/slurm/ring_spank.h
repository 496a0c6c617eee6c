/*
 * ring_spank.h - shared state of spank_ringmaster.so and the per-context entry points that
 * ring_dispatch.c calls. One file per SPANK context:
 *   ring_srun.c        local context (srun): options, cross-checks, node count of a list order
 *   ring_alloc.c       allocator context (sbatch, salloc): options, cross-checks
 *   ring_slurmd.c      slurmd context: checks plugstack.conf, never fails (slurmd must start)
 *   ring_slurmstepd.c  remote context (slurmstepd): options again, then the task environment
 * ring_args.c holds the option table, ring_config.c the plugstack.conf arguments,
 * ring_validate.c the value rules.
 *
 * Return convention (SPANK): 0 = go on, -1 = refuse (for a `required` plugin the command or
 * step does not start). Every -1 is preceded by one slurm_error() that names the option or
 * argument and the rule.
 */
#ifndef RING_PLUGINS_SLURM_RING_SPANK_H
#define RING_PLUGINS_SLURM_RING_SPANK_H

#include <slurm/spank.h>

#include "ring_validate.h"

#define RING_LOG_PREFIX "ringmaster: "

/* plugstack.conf arguments: `required /path/spank_ringmaster.so [default_coord=E] [allow_tcp=0|1]`
 */
struct ring_config {
  int invalid;   /* slurmstepd: parse failed, error logged */
  int allow_tcp; /* 1 (default): tcp:// endpoints accepted */
  int has_default_coord;
  char default_coord[RING_ENDPOINT_MAX + 1]; /* used when --ring-coord is not given */
  char error[RING_ERR_MAX + 160];            /* the last parse error, as logged */
};

/* Values of the --ring-* options, as validated by their callbacks. */
struct ring_args {
  int job_set;
  char job[RING_JOB_ID_MAX + 1];
  int order_set;
  ring_order_t order; /* topology unless --ring-order */
  int coord_set;
  char coord[RING_ENDPOINT_MAX + 1];
  /* slurmstepd only: a forwarded value that failed its check (the error is logged at once,
   * the step is refused in task_init; see ring_slurmstepd.c for why not earlier) */
  int deferred_error;
  char error[RING_ERR_MAX + 240]; /* its message, repeated in task_init */
};

extern struct ring_config ring_config;
extern struct ring_args ring_args;

/* ring_config.c: parses and checks the plugstack arguments; logs and returns -1 on error. */
int ring_config_parse(struct ring_config *cfg, int ac, char **av);

/* ring_args.c. In slurmstepd (remote) a bad value is deferred: logged, then refused in
 * task_init, because a failure during slurmstepd's init drains the node. */
int ring_args_register(spank_t sp); /* spank_option_register for each option */
int ring_args_check(void);          /* cross-option rules, after all options */
const char *ring_args_coord(void);  /* --ring-coord, else default_coord, else NULL */

/* ring_dispatch.c calls these. */
int ring_srun_init(spank_t sp, int ac, char **av);
int ring_srun_post_opt(spank_t sp, int ac, char **av);
int ring_srun_local_user_init(spank_t sp, int ac, char **av);
int ring_alloc_init(spank_t sp, int ac, char **av);
int ring_alloc_post_opt(spank_t sp, int ac, char **av);
int ring_slurmd_init(spank_t sp, int ac, char **av);
int ring_slurmstepd_init(spank_t sp, int ac, char **av);
int ring_slurmstepd_post_opt(spank_t sp, int ac, char **av);
int ring_slurmstepd_task_init(spank_t sp, int ac, char **av);

#endif
