#!/usr/bin/env bash
# parallel.shard full against shard none in the same run: step time, and the share of the block
# all-gathers and gradient reduce-scatters hidden behind compute.
#
#   bench/shard_overlap.sh [BUILD_DIR] [STEPS] [NODES]    (defaults: build, 12, 1)
#
# One job spec (4 layers, d_model 512, seq_len 4096, 2 context ranks x 2 data replicas = 4 CPU
# workers of one thread each, on NODES ringd processes of this machine), run once with shard
# none and once with shard full, alternating NONE/FULL twice so that both see the same machine
# state. Steps 1-2 are warm-up and left out.
#
#   step time   ringd's steps.jsonl step_ms: median and [min, max] over the steps of both runs
#               of a mode; ratio = full / none of the medians.
#   hidden      per worker and step, from the worker's "shard full overlap" log line
#               (worker/ring/rank_offloaded.cc): flight = seconds from posting each gather or
#               reduce-scatter to the completion of its last transfer as the progress engine saw
#               it, wait = seconds the rank blocked on them; hidden = 1 - wait / flight, the
#               transfer time covered by compute. Median and [min, max] over workers x steps.
#
# On a machine with fewer cores than workers the ranks share cores, so "compute" includes other
# ranks' compute, and the transfers are memory copies through shared memory (UCX posix): read the
# figures as this machine's, not a cluster's.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
steps="${2:-12}"
nodes="${3:-1}"
ringd="$build/daemon/ringd/ringd"
worker="$build/worker/ring-worker"
for x in "$ringd" "$worker"; do
  [[ -x "$x" ]] || { echo "shard_overlap: no $x (build ringd, ring-worker)" >&2; exit 2; }
done
[[ $((4 % nodes)) == 0 ]] || { echo "shard_overlap: NODES must divide 4" >&2; exit 2; }
export UCX_TLS="${UCX_TLS:-self,posix}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
work="$(mktemp -d /tmp/shard-overlap-XXXXXX)"
trap 'rm -rf "$work"' EXIT

spec() {  # file shard
  cat > "$1" <<YAML
job:
  name: shard-overlap
model:
  layers: 4
  d_model: 512
  heads: 8
  mlp: swiglu
  vocab: 256
data:
  source: passkey
  seq_len: 4096
  seed: 5
parallel:
  context_ranks: 2
  data_replicas: 2
  ring_order: natural
  shard: $2
optimizer:
  lr: 1.0e-4
  offload: cpu
train:
  steps: $steps
  grad_clip: 1.0
  seed: 5
checkpoint:
  every_steps: 0
resources:
  nodes: $nodes
  workers_per_node: $((4 / nodes))
  backend: cpu
  cpus_per_worker: 1
  host_memory_gb: 20
restart:
  max_restarts: 0
YAML
}

runs=("none-a none" "full-a full" "none-b none" "full-b full")
for r in "${runs[@]}"; do
  read -r tag shard <<< "$r"
  spec "$work/$tag.yaml" "$shard"
  pids=()
  for ((k = 0; k < nodes; ++k)); do
    extra=()
    [[ $nodes -gt 1 ]] && extra=(--nodes "$nodes" --node-rank "$k" --rendezvous "$work/$tag-rdv")
    "$ringd" --spec "$work/$tag.yaml" --job-dir "$work/$tag" --worker-bin "$worker" \
      --worker-threads 1 --threads 1 --json "${extra[@]}" \
      > "$work/$tag.$k.out" 2> "$work/$tag.$k.err" &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if [[ $ok != 1 ]]; then
    echo "shard_overlap: ringd ($tag) failed; its log:" >&2
    tail -20 "$work/$tag/logs/ringd-0.log" >&2 || true
    exit 1
  fi
  echo "$tag: done" >&2
done

python3 - "$work" <<'PY'
import glob, json, re, statistics, sys
work = sys.argv[1]
def steps(tag):
    out = []
    for l in open(f"{work}/{tag}/steps.jsonl"):
        j = json.loads(l)
        if "step_ms" in j and j.get("step", 0) > 2:
            out.append(j["step_ms"])
    return out
def spread(xs):
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]"
none = steps("none-a") + steps("none-b")
full = steps("full-a") + steps("full-b")
hidden, flight, wait = [], [], []
for tag in ("full-a", "full-b"):
    for log in glob.glob(f"{work}/{tag}/logs/worker-*.log"):
        for l in open(log):
            m = re.search(r"shard full overlap (\{.*\})", l)
            if not m:
                continue
            j = json.loads(m.group(1))
            for s, f, w in zip(j["step"], j["flight_s"], j["wait_s"]):
                if s <= 2 or f <= 0:
                    continue
                flight.append(f * 1e3)
                wait.append(w * 1e3)
                hidden.append(max(0.0, 1.0 - w / f))
if not hidden:
    sys.exit("shard_overlap: no 'shard full overlap' line in the full runs' worker logs")
print(f"steps per run: {len(none) // 2} (after 2 warm-up), 2 runs per mode, 4 workers")
print("| mode | step ms, median [min, max] |")
print("|---|---|")
print(f"| none | {spread(none)} |")
print(f"| full | {spread(full)} |")
print(f"full / none (medians): {statistics.median(full) / statistics.median(none):.2f}")
print()
print("| shard full, per worker and step | median [min, max] |")
print("|---|---|")
print(f"| gathers + reduce-scatters in flight, ms | {spread(flight)} |")
print(f"| waited on them, ms | {spread(wait)} |")
h = [100 * x for x in hidden]
print(f"| hidden behind compute, % | {statistics.median(h):.0f} [{min(h):.0f}, {max(h):.0f}] |")
PY
