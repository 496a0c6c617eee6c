#!/usr/bin/env bash
# Installs what is missing, builds, and shows ringmaster on the example job specs:
# validates every example, shows what an invalid spec looks like, and plans the jobs
# (memory, communication, fit) from the specs alone.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$RING_ROOT"

./scripts/install-deps.sh
ring_build >/dev/null
ringctl="$RING_BUILD/cli/ringctl"

echo
echo "== ringctl validate configs/examples/*.yaml"
"$ringctl" validate configs/examples/*.yaml

echo
echo "== an invalid spec: ringctl validate configs/invalid/heads-not-multiple-of-kv.yaml"
"$ringctl" validate configs/invalid/heads-not-multiple-of-kv.yaml || echo "(exit $?: invalid, as expected)"

echo
echo "== ringctl plan configs/examples/tiny.yaml"
"$ringctl" plan configs/examples/tiny.yaml

echo
echo "== ringctl plan configs/examples/llama7b-1m-64x8-h100.yaml"
"$ringctl" plan configs/examples/llama7b-1m-64x8-h100.yaml

echo
echo "== ringctl plan --check configs/examples/270b-1.2m-64x8-h200.yaml"
"$ringctl" plan --check configs/examples/270b-1.2m-64x8-h200.yaml || echo "(exit $?: does not fit, as the plan explains)"
