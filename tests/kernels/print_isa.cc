// Prints the kernel ISA chosen at start-up ("ACTIVE_ISA=avx2"); RING_CPU_ISA overrides the
// choice. The tool IsaSelection.EnvironmentOverrideIsHonouredAtStartup runs in a fresh process.
#include <cstdio>

#include "kernels/cpu/ops.h"

int main() {
  std::printf("ACTIVE_ISA=%s\n", ring::kernels::cpu::isa_name(ring::kernels::cpu::active_isa()));
  return 0;
}
