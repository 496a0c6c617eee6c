#!/usr/bin/env bash
# Measures this machine for `ringctl simulate --gpu cpu --calibration FILE` (bench/sim_calibrate.cc:
# GEMM, attention forward/backward, shared-memory copy, AdamW, checkpoint write, with the CPU
# backend at a spec's shapes).
#   bench/sim_calibrate.sh [OUT.json] [SPEC]     (defaults: sim-calibration.json, tiny.yaml)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
out=${1:-sim-calibration.json}
spec=${2:-$root/configs/examples/tiny.yaml}
cmake --build "$build" --target sim_calibrate >/dev/null
"$build/bench/sim_calibrate" --spec "$spec" --reps "${REPS:-5}" -o "$out"
