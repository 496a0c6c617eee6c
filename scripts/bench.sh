#!/usr/bin/env bash
# Builds and runs the benchmarks in bench/. Each prints its figure as a ratio against a baseline
# measured in the same run (median and spread); docs/performance.md records the results.
#
#   ./scripts/bench.sh                  # all
#   ./scripts/bench.sh attention adamw  # some: attention gemm adamw topk transport train_step
#                                       # tokenize decode generate_ranks timeline
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$RING_ROOT"
./scripts/install-deps.sh
ring_build >/dev/null

all=(attention gemm adamw topk transport train_step tokenize decode generate_ranks timeline)
[ $# -gt 0 ] && all=("$@")
for b in "${all[@]}"; do
  if [ "$b" = timeline ]; then  # a script: ringd runs with the timeline off and on
    echo "== $b  ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
    bench/timeline_overhead.sh "$RING_BUILD"
    continue
  fi
  exe="$RING_BUILD/bench/${b}_bench"
  if [ ! -x "$exe" ]; then
    echo "bench: unknown benchmark '$b' (have: attention gemm adamw topk transport train_step tokenize decode generate_ranks timeline)" >&2
    exit 2
  fi
  echo "== $b  ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$exe"
done
