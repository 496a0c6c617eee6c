/*
 * ring_srun.c - local context (srun). Everything that can be checked before a step exists is
 * checked here, so a bad value stops srun with a message on the user's terminal instead of
 * failing on the nodes.
 */
#include "ring_spank.h"

int ring_srun_init(spank_t sp, int ac, char **av) {
  if (ring_config_parse(&ring_config, ac, av) < 0) return -1;
  return ring_args_register(sp);
}

int ring_srun_post_opt(spank_t sp, int ac, char **av) {
  (void)sp, (void)ac, (void)av;
  return ring_args_check();
}

/* After the allocation: the step's node count is known, so a list order can be checked. */
int ring_srun_local_user_init(spank_t sp, int ac, char **av) {
  char err[RING_ERR_MAX];
  uint32_t nnodes = 0;

  (void)ac, (void)av;
  if (!ring_args.job_set || ring_args.order.kind != RING_ORDER_LIST) return 0;
  if (spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS || nnodes == 0)
    return 0; /* unknown here: slurmstepd checks it */
  if (ring_check_order_nodes(&ring_args.order, nnodes, err, sizeof(err)) != RING_OK) {
    slurm_error(RING_LOG_PREFIX "--ring-order: %s", err);
    return -1;
  }
  return 0;
}
