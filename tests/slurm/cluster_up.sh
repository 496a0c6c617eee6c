#!/usr/bin/env bash
# Fixture setup (slurm_cluster_up): a 3-node local cluster with 2 fake GPUs per node in
# $RING_SLURM_STATE, ports chosen free, the SPANK plugin in plugstack.conf when it was built.
source "$(dirname "$0")/common.bash"
skip_unless_cluster_possible
# a cluster left by an interrupted run of this build's tests
"$CLUSTER" down --state-dir "$RING_SLURM_STATE" --purge --quiet || true
args=(up --nodes 3 --gpus-per-node 2 --port-base auto --state-dir "$RING_SLURM_STATE")
if [ -n "${RING_SPANK_SO:-}" ]; then
  args+=(--spank "$RING_SPANK_SO")
fi
run "$CLUSTER" "${args[@]}"
echo "$output"
assert_succeeds "cluster.sh up --nodes 3"
run "$CLUSTER" status --state-dir "$RING_SLURM_STATE"
assert_succeeds "cluster.sh status: every daemon running"
finish
