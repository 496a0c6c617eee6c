/*
 * ring_slurmstepd.c - remote context (slurmstepd, one per step and node). Re-checks the
 * forwarded options, then exports the ringmaster environment to each task just before exec:
 *
 *   RING_JOB_ID      --ring-job
 *   RING_COORD       --ring-coord, else plugstack.conf default_coord
 *   RING_RING_ORDER  canonical --ring-order (topology when not given)
 *   RING_RING_POS    this node's position in the ring (slurm, natural, list; unset for
 *                    topology, where ring-coord decides)
 *   RING_NODE_RANK   SLURM_NODEID of this node in the step (0..RING_NUM_NODES-1)
 *   RING_NUM_NODES   nodes in the step
 *   RING_LOCAL_RANK  task index on this node (SLURM_LOCALID)
 *   RING_GPU         the task's GPU from CUDA_VISIBLE_DEVICES, or "none"
 *   RING_GPU_ORDINAL its index within CUDA_VISIBLE_DEVICES (what cudaSetDevice takes), or -1
 *   RING_GPUS        all GPUs the task may see (CUDA_VISIBLE_DEVICES), or ""
 *
 * Nothing is exported when --ring-job was not given: other jobs are untouched.
 *
 * Where this context refuses: Slurm 22.05 drains the node ("batch job complete failure") when
 * a required plugin fails in slurmstepd's init or init_post_opt, or when an option callback
 * fails there. So init, post_opt and the callbacks only log here (srun and sbatch have already
 * refused the same values on the submitting side), and a ringmaster step with anything wrong
 * is refused in task_init: each task exits before exec, the step fails, the node stays up.
 * Steps without --ring-job run normally even when plugstack.conf arguments are bad on this
 * node (srun/sbatch with the same plugstack.conf refuse them anyway).
 */
#include <stdio.h>
#include <string.h>

#include "ring_spank.h"

int ring_slurmstepd_init(spank_t sp, int ac, char **av) {
  if (ring_config_parse(&ring_config, ac, av) < 0) {
    ring_config.invalid = 1;
    slurm_error(RING_LOG_PREFIX
                "plugstack.conf arguments are invalid (above): ringmaster steps "
                "(--ring-job) are refused on this node until they are fixed");
  }
  return ring_args_register(sp);
}

int ring_slurmstepd_post_opt(spank_t sp, int ac, char **av) {
  (void)sp, (void)ac, (void)av;
  return 0; /* checked in task_init, see above */
}

/* Everything a ringmaster step needs; logs the first problem and returns -1. */
static int step_ok(spank_t sp) {
  char err[RING_ERR_MAX];
  uint32_t nnodes = 0;

  if (ring_config.invalid) {
    slurm_error(RING_LOG_PREFIX
                "refusing the step: plugstack.conf arguments on this node are invalid: %s",
                ring_config.error);
    return -1;
  }
  if (ring_args.deferred_error) {
    slurm_error(RING_LOG_PREFIX "refusing the step: %s", ring_args.error);
    return -1;
  }
  if (ring_args_check() < 0) return -1;
  if (ring_args.order.kind == RING_ORDER_LIST) {
    if (spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS) {
      slurm_error(RING_LOG_PREFIX "cannot get the step's node count");
      return -1;
    }
    if (ring_check_order_nodes(&ring_args.order, nnodes, err, sizeof(err)) != RING_OK) {
      slurm_error(RING_LOG_PREFIX "--ring-order: %s", err);
      return -1;
    }
  }
  return 0;
}

static int set(spank_t sp, const char *var, const char *val) {
  spank_err_t rc = spank_setenv(sp, var, val, 1);

  if (rc != ESPANK_SUCCESS) {
    slurm_error(RING_LOG_PREFIX "cannot set %s: %s", var, spank_strerror(rc));
    return -1;
  }
  return 0;
}

static int set_u(spank_t sp, const char *var, long long v) {
  char buf[24];

  snprintf(buf, sizeof(buf), "%lld", v);
  return set(sp, var, buf);
}

int ring_slurmstepd_task_init(spank_t sp, int ac, char **av) {
  /* sized by ring_validate.h limits; static: slurmstepd runs this once per forked task */
  static char order[5 + RING_ORDER_MAX_NODES * 5 + 1];
  static char visible[4097];
  char gpu[RING_GPU_MAX + 1], err[RING_ERR_MAX];
  uint32_t nodeid = 0, nnodes = 0;
  int local = -1, ordinal = -1;
  const char *coord = ring_args_coord();
  spank_err_t rc;
  int64_t pos;

  (void)ac, (void)av;
  if (!ring_args.job_set && !ring_args.deferred_error) return 0;
  if (step_ok(sp) < 0) return -1;
  if (spank_get_item(sp, S_JOB_NODEID, &nodeid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_TASK_ID, &local) != ESPANK_SUCCESS || local < 0) {
    slurm_error(RING_LOG_PREFIX "cannot get the node id, node count or local task id");
    return -1;
  }
  rc = spank_getenv(sp, "CUDA_VISIBLE_DEVICES", visible, sizeof(visible));
  if (rc == ESPANK_ENV_NOEXIST) {
    visible[0] = '\0';
  } else if (rc != ESPANK_SUCCESS) {
    slurm_error(RING_LOG_PREFIX "cannot read CUDA_VISIBLE_DEVICES: %s", spank_strerror(rc));
    return -1;
  }
  if (ring_pick_gpu(visible, (uint32_t)local, gpu, sizeof(gpu), &ordinal, err, sizeof(err)) !=
      RING_OK) {
    slurm_error(RING_LOG_PREFIX "%s", err);
    return -1;
  }
  if (ring_format_order(&ring_args.order, order, sizeof(order)) < 0) {
    slurm_error(RING_LOG_PREFIX "internal: ring order does not fit its buffer");
    return -1;
  }
  pos = ring_order_position(&ring_args.order, nodeid);

  if (set(sp, "RING_JOB_ID", ring_args.job) || set(sp, "RING_COORD", coord) ||
      set(sp, "RING_RING_ORDER", order) || set_u(sp, "RING_NODE_RANK", nodeid) ||
      set_u(sp, "RING_NUM_NODES", nnodes) || set_u(sp, "RING_LOCAL_RANK", local) ||
      set(sp, "RING_GPU", gpu) || set_u(sp, "RING_GPU_ORDINAL", ordinal) ||
      set(sp, "RING_GPUS", strcmp(gpu, "none") == 0 ? "" : visible))
    return -1;
  if (pos >= 0) {
    if (set_u(sp, "RING_RING_POS", pos)) return -1;
  } else {
    spank_unsetenv(sp, "RING_RING_POS"); /* not inherited from a batch script's environment */
  }
  return 0;
}
