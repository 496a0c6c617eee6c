/*
 * ring_dispatch.c - the SPANK entry points of spank_ringmaster.so. Each one only routes to the
 * file of the current context (ring_spank.h); the linker version script
 * (spank_ringmaster.lds) exports these and plugin_name/plugin_type/plugin_version, nothing else.
 */
#include <slurm/spank.h>

#include "ring_spank.h"

SPANK_PLUGIN(ringmaster, 1)

int slurm_spank_init(spank_t sp, int ac, char **av) {
  switch (spank_context()) {
    case S_CTX_LOCAL:
      return ring_srun_init(sp, ac, av);
    case S_CTX_ALLOCATOR:
      return ring_alloc_init(sp, ac, av);
    case S_CTX_SLURMD:
      return ring_slurmd_init(sp, ac, av);
    case S_CTX_REMOTE:
      return ring_slurmstepd_init(sp, ac, av);
    default:
      return 0;
  }
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  switch (spank_context()) {
    case S_CTX_LOCAL:
      return ring_srun_post_opt(sp, ac, av);
    case S_CTX_ALLOCATOR:
      return ring_alloc_post_opt(sp, ac, av);
    case S_CTX_REMOTE:
      return ring_slurmstepd_post_opt(sp, ac, av);
    default:
      return 0;
  }
}

int slurm_spank_local_user_init(spank_t sp, int ac, char **av) {
  if (spank_context() == S_CTX_LOCAL) return ring_srun_local_user_init(sp, ac, av);
  return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  if (spank_context() == S_CTX_REMOTE) return ring_slurmstepd_task_init(sp, ac, av);
  return 0;
}
