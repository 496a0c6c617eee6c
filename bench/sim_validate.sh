#!/usr/bin/env bash
# `ringctl simulate` against real ringd runs on emulated links. Needs root (network namespaces).
#
# bench/emulated_cluster.py builds the cluster: one network namespace per node, veth links
# through bridges, a tc token bucket (tbf) on both ends of every link; `fat-tree` puts nodes in
# leaves of 2 with an oversubscribed uplink to the root, `ring` links each node straight to the
# next. (This kernel has no netem, so links keep veth's own latency, LAT_US in the graph.) One
# ringd per node (one worker, UCX over TCP) trains STEPS steps of a tiny-like spec (tiny's model,
# 2,048 tokens per rank, a ring over all nodes); the median step after the first is compared with
# `ringctl simulate` on the same links (--graph-out) with the rates bench/sim_calibrate measures
# just before each case.
#   sudo bench/sim_validate.sh [NODES...]    (default: 2 4 8)
#   TOPOLOGIES="fat-tree ring" NODE_MBIT=400 UPLINK_MBIT=200 LAT_US=20 STEPS=6 BUILD=build
# Everything the cluster script creates is its own and removed on exit; nothing leaves the machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
ringctl=$build/cli/ringctl
node_mbit=${NODE_MBIT:-400}
uplink_mbit=${UPLINK_MBIT:-200}
lat=${LAT_US:-20}
steps=${STEPS:-6}
topologies=${TOPOLOGIES:-fat-tree ring}
[[ $(id -u) == 0 ]] || { echo "sim_validate: needs root for network namespaces" >&2; exit 2; }
for b in "$build/daemon/ringd/ringd" "$build/worker/ring-worker" "$ringctl" "$build/bench/sim_calibrate"; do
  [[ -x $b ]] || { echo "sim_validate: $b not built" >&2; exit 2; }
done
work=$(mktemp -d /tmp/sim-validate-XXXXXX)
trap 'rm -rf "$work"' EXIT
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2 4 8)

printf '%-9s %-6s %-12s %-12s %-8s %s\n' topology nodes predicted measured error "measured steps (s)"
for topo in $topologies; do
  for nodes in "${sizes[@]}"; do
    spec=$work/spec-$nodes.yaml
    sed -e "s/seq_len: 16384/seq_len: $((2048 * nodes))/" -e "s/context_ranks: 4/context_ranks: $nodes/" \
        -e "s/nodes: 1/nodes: $nodes/" -e 's/workers_per_node: 4/workers_per_node: 1/' \
        -e 's/log_every: 10/log_every: 1/' -e "s|dir: checkpoints.*|dir: $work/ck-$nodes|" \
        -e 's/every_steps: 50/every_steps: 1000/' "$root/configs/examples/tiny.yaml" > "$spec"
    cal=$work/calibration.json
    "$build/bench/sim_calibrate" --reps 3 -o "$cal" > /dev/null
    rec=$work/$topo-$nodes.json
    graph=$work/$topo-$nodes.yaml
    /usr/bin/python3 "$root/bench/emulated_cluster.py" --build "$build" --topology "$topo" \
      --nodes "$nodes" --node-mbit "$node_mbit" --uplink-mbit "$uplink_mbit" \
      --delay-ms "$(awk -v l="$lat" 'BEGIN {print l / 1000}')" --spec "$spec" --steps "$steps" \
      --out "$rec" --graph-out "$graph" > /dev/null
    predicted=$("$ringctl" simulate "$spec" --topology "$graph" --gpu cpu --calibration "$cal" \
      --json 2> /dev/null | python3 -c 'import json, sys; print("%.3f" % json.load(sys.stdin)["step_s"])')
    python3 - "$rec" "$predicted" "$topo" "$nodes" <<'PY'
import json, statistics, sys
rec, pred = json.load(open(sys.argv[1])), float(sys.argv[2])
ms = [s["step_ms"] / 1e3 for s in rec["steps"][1:]]
med = statistics.median(ms)
print(f"{sys.argv[3]:<9} {sys.argv[4]:<6} {pred:<10.3f} s {med:<10.3f} s {100 * (pred - med) / med:+5.0f} %  "
      + " ".join(f"{x:.3f}" for x in ms))
PY
  done
done
