#!/usr/bin/env bash
# `ringctl simulate` against real ringd runs on emulated links. Needs root (network namespaces).
#
# Each "node" is a network namespace with one veth into a switch namespace holding a bridge; a tc
# token bucket (tbf) on both ends of every veth limits the rate (a star: NIC -> switch -> NIC).
# (netem, for added delay, is not in every kernel: this machine's lacks it, so the links keep
# the veth's own latency, taken as LAT_US in the simulated graph.) One
# ringd per node (UCX over TCP on its veth) trains a few steps of a tiny-like spec; the median
# step time (steps after the first) is compared with `ringctl simulate` on a YAML graph of the
# same star, with the rates of bench/sim_calibrate.sh measured on this machine.
#   sudo bench/sim_validate.sh [NODES...]      (default: 2 4); RATE_MBIT=1000 LAT_US=25 STEPS=5
# Namespaces and addresses are this script's own (rsv<pid>-*, 10.213.<pid % 250>.0/24) and are
# removed on exit; nothing leaves the machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
ringd=$build/daemon/ringd/ringd
worker=$build/worker/ring-worker
ringctl=$build/cli/ringctl
rate=${RATE_MBIT:-1000}
lat=${LAT_US:-25}
steps=${STEPS:-5}
[[ $(id -u) == 0 ]] || { echo "sim_validate: needs root for network namespaces" >&2; exit 2; }
for b in "$ringd" "$worker" "$ringctl"; do
  [[ -x $b ]] || { echo "sim_validate: $b not built" >&2; exit 2; }
done
work=$(mktemp -d /tmp/sim-validate-XXXXXX)
tag=rsv$$
net=10.213.$(($$ % 250))
sw=$tag-sw
cleanup() {
  for ns in $(ip netns list | awk -v t="$tag-" 'index($1, t) == 1 {print $1}'); do ip netns del "$ns"; done
  rm -rf "$work"
}
trap cleanup EXIT

cal=$work/calibration.json
"$build/bench/sim_calibrate" --reps 3 -o "$cal" >/dev/null

printf '%-6s %-12s %-12s %s\n' nodes predicted measured "error (measured steps)"
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2 4)
for nodes in "${sizes[@]}"; do
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((k = 0; k < nodes; ++k)); do
    ns=$tag-n$k
    ip netns add "$ns"
    ip link add "v$k" netns "$ns" type veth peer name "s$k" netns "$sw"
    ip -n "$sw" link set "s$k" master br0 up
    ip -n "$ns" addr add "$net.$((k + 1))/24" dev "v$k"
    ip -n "$ns" link set "v$k" up
    ip -n "$ns" link set lo up
    ip netns exec "$ns" tc qdisc add dev "v$k" root tbf rate "${rate}mbit" burst 256kb latency 100ms
    ip netns exec "$sw" tc qdisc add dev "s$k" root tbf rate "${rate}mbit" burst 256kb latency 100ms
  done
  # The spec: tiny's model, one worker per node, a ring over all nodes.
  spec=$work/spec-$nodes.yaml
  sed -e "s/seq_len: 16384/seq_len: $((2048 * nodes))/" -e "s/context_ranks: 4/context_ranks: $nodes/" \
      -e "s/nodes: 1/nodes: $nodes/" -e 's/workers_per_node: 4/workers_per_node: 1/' \
      -e 's/log_every: 10/log_every: 1/' -e "s|dir: checkpoints.*|dir: $work/ck-$nodes|" \
      -e 's/every_steps: 50/every_steps: 1000/' "$root/configs/examples/tiny.yaml" > "$spec"
  # The same star as a link graph: node <-> switch at the tc rate.
  graph=$work/star-$nodes.yaml
  {
    echo "nodes: [$(seq -s, -f 'n%02g' 0 $((nodes - 1)))]"
    echo "switches: [sw]"
    echo "links:"
    for ((k = 0; k < nodes; ++k)); do
      printf '  - {from: n%02d, to: sw, gbytes_per_s: %s, latency_us: %s}\n' "$k" "$(awk -v r="$rate" 'BEGIN {print r / 8000}')" "$lat"
    done
  } > "$graph"
  pids=()
  for ((k = 0; k < nodes; ++k)); do
    ip netns exec "$tag-n$k" env UCX_TLS=tcp UCX_NET_DEVICES="v$k" \
      "$ringd" --spec "$spec" --job-dir "$work/job-$nodes" --worker-bin "$worker" \
      --worker-threads 1 --threads 1 --json --steps "$steps" --nodes "$nodes" --node-rank "$k" \
      --rendezvous "$work/rdv-$nodes" > "$work/out-$nodes-$k.json" 2> "$work/err-$nodes-$k.txt" &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if [[ $ok != 1 ]]; then
    echo "sim_validate: ringd on $nodes nodes failed:" >&2
    tail -5 "$work"/err-"$nodes"-*.txt >&2
    exit 1
  fi
  measured=$(python3 - "$work/out-$nodes-0.json" <<'PY'
import json, sys, statistics
ms = []
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "step_ms" in j:
        ms.append(j["step_ms"] / 1e3)
ms = ms[1:]  # the first step warms up
print(f"{statistics.median(ms):.3f} {' '.join(f'{x:.3f}' for x in ms)}")
PY
)
  predicted=$("$ringctl" simulate "$spec" --topology "$graph" --gpu cpu --calibration "$cal" --json \
    | python3 -c 'import json, sys; print("%.3f" % json.load(sys.stdin)["step_s"])')
  read -r med rest <<< "$measured"
  err=$(awk -v p="$predicted" -v m="$med" 'BEGIN {printf "%+.0f %%", 100 * (p - m) / m}')
  printf '%-6s %-12s %-12s %s (%s)\n' "$nodes" "$predicted s" "$med s" "$err" "$rest"
  for ns in $(ip netns list | awk -v t="$tag-" 'index($1, t) == 1 {print $1}'); do ip netns del "$ns"; done
done
