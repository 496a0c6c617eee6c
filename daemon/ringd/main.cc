// ringd: the node daemon. See daemon/INTERFACE.md.
#include "daemon/ringd/ringd.h"

int main(int argc, char** argv) {
  const ring::ringd::ParsedOptions p = ring::ringd::parse_options(argc, argv);
  if (p.exit_code) return *p.exit_code;
  return ring::ringd::run(p.options);
}
