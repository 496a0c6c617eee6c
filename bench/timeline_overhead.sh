#!/usr/bin/env bash
# Overhead of the always-on phase timeline (common/contract/timeline.h). ringd runs one job (4 CPU
# workers on this node, a small 4-layer model, 2K tokens: short steps with ring hops, waits and
# gradient handovers in every layer, so the records weigh as much as they can):
#   1. RUNS runs with RING_TIMELINE=alternate: the workers record in even steps only, so every run
#      compares its own steps with the timeline on (even) and off (odd), on the same placement and
#      memory layout; per run the ratio of the median step times (steps.jsonl step_ms, the first 4
#      steps skipped); printed: the median ratio over the runs and its spread (min, max).
#   2. PAIRS pairs of whole runs, RING_TIMELINE=off and on (which runs first alternates): the same
#      ratio between runs, which run-to-run noise of this machine dominates.
#   3. The bound without noise: records per rank and step x the cost of one record
#      (timeline_record_bench), as a share of the step.
# Target: median ratio <= 1.01.
#   bench/timeline_overhead.sh [BUILD_DIR] [RUNS] [STEPS] [PAIRS]    (default build 6 60 4)
set -euo pipefail
build=${1:-build}
runs=${2:-6}
steps=${3:-60}
pairs=${4:-4}
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
ringd() {  # $1: RING_TIMELINE, $2: the job dir
  RING_TIMELINE=$1 UCX_TLS=self,sm,tcp "$build/daemon/ringd/ringd" --spec "$dir/spec.yaml" \
    --job-dir "$2" --worker-threads 1 --threads 1 \
    --worker-bin "$build/worker/ring-worker" --json > "$2.out" 2> "$2.err" ||
    { echo "ringd failed ($1, $2):" >&2; tail -20 "$2.err" >&2; exit 1; }
}
# Median step_ms of a run's steps after the first 4: all, even or odd ones.
median() {
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pick = {"all": lambda s: True, "even": lambda s: s % 2 == 0, "odd": lambda s: s % 2 == 1}[sys.argv[2]]
print(statistics.median(r["step_ms"] for r in recs if r["step"] > 4 and pick(r["step"])))
PY
}
summary() {  # $1: label, then the ratios
  python3 - "$@" <<'PY'
import statistics, sys
label, r = sys.argv[1], [float(x) for x in sys.argv[2:]]
med = statistics.median(r)
print(f"{label}: median ratio {med:.4f} (min {min(r):.4f}, max {max(r):.4f}, {len(r)} samples); "
      f"target <= 1.01: {'met' if med <= 1.01 else 'NOT met'}")
PY
}

within=()
for i in $(seq 1 "$runs"); do
  ringd alternate "$dir/alt-$i"
  on=$(median "$dir/alt-$i/steps.jsonl" even)
  off=$(median "$dir/alt-$i/steps.jsonl" odd)
  r=$(python3 -c "print($on / $off)")
  printf 'run %d (alternate): off %.2f ms  on %.2f ms  ratio %.4f\n' "$i" "$off" "$on" "$r"
  within+=("$r")
done
between=()
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) -eq 1 ]; then
    ringd off "$dir/off-$i"; ringd on "$dir/on-$i"
  else
    ringd on "$dir/on-$i"; ringd off "$dir/off-$i"
  fi
  off=$(median "$dir/off-$i/steps.jsonl" all)
  on=$(median "$dir/on-$i/steps.jsonl" all)
  r=$(python3 -c "print($on / $off)")
  printf 'pair %d (whole runs): off %.2f ms  on %.2f ms  ratio %.4f\n' "$i" "$off" "$on" "$r"
  between+=("$r")
done
summary "timeline on/off step time, within runs" "${within[@]}"
[ "$pairs" -gt 0 ] && summary "timeline on/off step time, between runs" "${between[@]}"

micro=$("$build/bench/timeline_record_bench")
echo "$micro" | grep -v '^ns_per_record'
ns=$(echo "$micro" | awk '/^ns_per_record/ {print $2}')
python3 - "$dir/alt-1/timeline/node-0.jsonl" "$ns" "$(median "$dir/alt-1/steps.jsonl" all)" <<'PY'
import json, sys
pairs, n = set(), 0
for i, line in enumerate(open(sys.argv[1])):
    if i == 0: continue
    rec = json.loads(line)
    if rec[0] >= 0:
        pairs.add((rec[0], rec[1])); n += 1
per_step = n / len(pairs)
ns, step_ms = float(sys.argv[2]), float(sys.argv[3])
print(f"records per rank and (recorded) step: {per_step:.0f}; x {ns:.1f} ns = "
      f"{per_step * ns / 1e3:.1f} us per step of {step_ms:.1f} ms: "
      f"{per_step * ns / (step_ms * 1e6) * 100:.4f} % of the step")
PY
