#!/usr/bin/env bash
# Overhead of the always-on phase timeline (common/contract/timeline.h): ringd runs the same job
# (4 CPU workers on this node, a small 4-layer model, 2K tokens: short steps with ring hops,
# waits and gradient handovers in every layer, so the records weigh as much as they can) with RING_TIMELINE=off (the baseline: no records; the step summary and the progress
# counter still run) and on, alternating off/on PAIRS times in this one run. Per run the median
# step time (steps.jsonl step_ms, the first 3 steps skipped); per pair the ratio on/off; printed:
# the median ratio and its spread (min, max). Target: median ratio <= 1.01.
#   bench/timeline_overhead.sh [BUILD_DIR] [PAIRS] [STEPS]     (default build 5 30)
set -euo pipefail
build=${1:-build}
pairs=${2:-5}
steps=${3:-30}
dir=$(mktemp -d /tmp/timeline-bench-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/spec.yaml" <<YAML
job: {name: timeline-bench}
model: {layers: 4, d_model: 64, heads: 4, mlp: swiglu, vocab: 256}
data: {source: text, paths: [/usr/share/common-licenses], seq_len: 2048, seed: 1}
parallel: {context_ranks: 4, ring_order: natural}
optimizer: {lr: 1.0e-3, offload: cpu}
train: {steps: $steps, seed: 1, log_every: 1000}
checkpoint: {every_steps: 0, dir: ""}
resources: {nodes: 1, workers_per_node: 4, backend: cpu, cpus_per_worker: 1}
restart: {max_restarts: 0}
YAML
run() {  # $1: off|on, $2: run number -> median step_ms on stdout
  local jd="$dir/job-$1-$2"
  RING_TIMELINE=$1 UCX_TLS=self,sm,tcp "$build/daemon/ringd/ringd" --spec "$dir/spec.yaml" \
    --job-dir "$jd" --worker-threads 1 --threads 1 \
    --worker-bin "$build/worker/ring-worker" --json > "$jd.out" 2> "$jd.err" ||
    { echo "ringd failed ($1, run $2):" >&2; tail -20 "$jd.err" >&2; exit 1; }
  python3 - "$jd/steps.jsonl" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.strip()]
print(statistics.median(ms[3:]))
PY
}
ratios=()
for i in $(seq 1 "$pairs"); do
  off=$(run off "$i")
  on=$(run on "$i")
  r=$(python3 -c "print($on / $off)")
  printf 'pair %d: off %.2f ms  on %.2f ms  ratio %.4f\n' "$i" "$off" "$on" "$r"
  ratios+=("$r")
done
python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = [float(x) for x in sys.argv[1:]]
med = statistics.median(r)
print(f"timeline on/off step time: median ratio {med:.4f} (min {min(r):.4f}, max {max(r):.4f}, "
      f"{len(r)} pairs); target <= 1.01: {'met' if med <= 1.01 else 'NOT met'}")
PY
