// ringd: the node daemon. See daemon/INTERFACE.md.
#include "daemon/ringd/ringd.h"

int main(int argc, char** argv) {
  return ring::ringd::run(ring::ringd::parse_options(argc, argv));
}
