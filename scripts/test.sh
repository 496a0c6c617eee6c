#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest), then a short fuzz run of every
# fuzz target (50 s in all, split between them, fixed seed). Exit status 0 only if all passed.
#
#   ./scripts/test.sh                 # everything
#   ./scripts/test.sh -L unit         # extra arguments go to ctest (labels: unit, integration,
#                                     # slurm, gpu, package)
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$RING_ROOT"

start=$(date +%s)
./scripts/install-deps.sh
# Tests, benchmarks and CUDA (when nvcc is there) on, also in a build that scripts/demo.sh
# configured without them.
if grep -qE '^RING_BUILD_(TESTS|BENCH):BOOL=OFF' "$RING_BUILD/CMakeCache.txt" 2>/dev/null; then
  export RING_RECONFIGURE=1
fi
ring_build -DRING_BUILD_TESTS=ON -DRING_BUILD_BENCH=ON -DRING_WITH_CUDA=AUTO

echo "== tests"
ctest --test-dir "$RING_BUILD" --output-on-failure -j "$RING_JOBS" --timeout 1200 "$@"

if [ $# -eq 0 ]; then
  echo "== fuzz (short run of every target; scripts/fuzz.sh for longer)"
  ./scripts/fuzz.sh --seconds "${RING_FUZZ_SECONDS:-50}" --seed "${RING_FUZZ_SEED:-1}"
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
