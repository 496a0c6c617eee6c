#!/usr/bin/env bash
# `ringctl simulate` against real ringd runs on emulated links: bench/sim_validate.py (its
# docstring says what is measured and compared). Needs root (network namespaces).
#   sudo bench/sim_validate.sh [--nodes 2 4 8] [--topologies fat-tree ring] [--reps 3] [--order-stagger]
exec /usr/bin/python3 "$(dirname "$0")/sim_validate.py" "$@"
