#!/usr/bin/env bash
# Installs what is missing, builds, and shows ringmaster on the example job specs:
# validates the runnable examples, shows what an invalid spec looks like, plans the jobs (memory,
# communication, fit) from the specs alone, then trains the tiny example for a few steps with
# 4 local worker processes (ring attention across processes).
#
# Installs only what the demo needs (scripts/install-deps.sh --demo: compilers and the libraries
# ringmaster links; no Slurm, no database server, no PyTorch, no test frameworks) and, in a fresh
# build directory, configures without tests, benchmarks and the CUDA backend (the demo trains on
# the CPU). An existing build is reused as it is.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$RING_ROOT"

start=$(date +%s)
./scripts/install-deps.sh --demo
ring_build -DRING_BUILD_TESTS=OFF -DRING_BUILD_BENCH=OFF -DRING_WITH_CUDA=OFF >/dev/null
ringctl="$RING_BUILD/cli/ringctl"

echo
echo "== ringctl validate configs/examples/{tiny,passkey,slurm-2node}.yaml"
"$ringctl" validate configs/examples/tiny.yaml configs/examples/passkey.yaml \
  configs/examples/slurm-2node.yaml

echo
echo "== design specs beyond this build (bf16): ringctl validate names the limits"
"$ringctl" validate configs/examples/llama7b-1m-64x8-h100.yaml || \
  echo "(exit $?: refused, as run and submit would; --what-if below plans the design anyway)"

echo
echo "== an invalid spec: ringctl validate configs/invalid/heads-not-multiple-of-kv.yaml"
"$ringctl" validate configs/invalid/heads-not-multiple-of-kv.yaml || echo "(exit $?: invalid, as expected)"

echo
echo "== ringctl plan configs/examples/tiny.yaml"
"$ringctl" plan configs/examples/tiny.yaml

echo
echo "== ringctl plan --what-if configs/examples/llama7b-1m-64x8-h100.yaml"
"$ringctl" plan --what-if configs/examples/llama7b-1m-64x8-h100.yaml

echo
echo "== ringctl plan --what-if --check configs/examples/270b-1.2m-64x8-h200.yaml"
"$ringctl" plan --what-if --check configs/examples/270b-1.2m-64x8-h200.yaml || echo "(exit $?: does not fit, as the plan explains)"

echo
echo "== training: ringctl run configs/examples/tiny.yaml --steps 5"
echo "   (ring-coord, reused when one answers at the default endpoint, else started for the run;"
echo "    ringd runs 4 worker processes that share one 16K-token sequence through ring attention"
echo "    over UCX, with AdamW offloaded to ringd; 'ringctl status' works from another terminal)"
export UCX_TLS="${UCX_TLS:-self,posix}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
"$ringctl" run configs/examples/tiny.yaml --steps 5

echo
echo "== training in bf16: ringctl run configs/examples/tiny-bf16.yaml --steps 5"
echo "   (the same job in mixed precision: bf16 GEMMs, attention inputs and ring K/V; fp32"
echo "    accumulation, master weights and AdamW in ringd; docs/precision.md)"
"$ringctl" run configs/examples/tiny-bf16.yaml --steps 5
echo
echo "== demo done in $(( $(date +%s) - start )) s"
