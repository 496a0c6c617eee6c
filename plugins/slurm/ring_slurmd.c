/*
 * ring_slurmd.c - slurmd context. slurmd loads the plugin stack once at start and treats a
 * failing required plugin as fatal, so this context reports a bad plugstack.conf and returns 0:
 * slurmd keeps running, and every step is refused by slurmstepd (remote context), which reads
 * plugstack.conf afresh, until the file is fixed.
 */
#include "ring_spank.h"

int ring_slurmd_init(spank_t sp, int ac, char **av) {
  struct ring_config cfg;

  (void)sp;
  if (ring_config_parse(&cfg, ac, av) < 0)
    slurm_error(RING_LOG_PREFIX
                "plugstack.conf arguments are invalid (see above): steps on this "
                "node will be refused until they are fixed; slurmd keeps running");
  return 0;
}
