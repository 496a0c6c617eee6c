/*
 * ring_alloc.c - allocator context (sbatch, salloc). The options are checked at submission;
 * sbatch forwards them to the job, where every srun and slurmstepd checks them again.
 */
#include "ring_spank.h"

int ring_alloc_init(spank_t sp, int ac, char **av) {
  if (ring_config_parse(&ring_config, ac, av) < 0) return -1;
  return ring_args_register(sp);
}

int ring_alloc_post_opt(spank_t sp, int ac, char **av) {
  (void)sp, (void)ac, (void)av;
  return ring_args_check();
}
