#!/usr/bin/env bash
# The bf16 training curve (issue 33, docs/precision.md "Training curve"): the runnable example
# configs/examples/tiny-bf16.yaml and its fp32 twin configs/examples/tiny.yaml (the same spec but
# model.dtype; same data, seed and data order), each trained STEPS steps through ringd with its
# CPU workers and offloaded AdamW, one run after the other. Writes a plot-ready CSV
#   step,loss_fp32,loss_bf16,rel_diff        rel_diff = (loss_bf16 - loss_fp32) / loss_fp32
# and prints the summary: final loss of each (the last step, and the median of the last 20
# steps), their relative difference (target: within 2%), the largest per-step |rel_diff| after
# the warm-up, and each run's time.
#
#   bench/precision_curve.sh [BUILD_DIR] [STEPS] [CSV]     (defaults: build, 300, precision_curve.csv)
#   EVERY=10 bench/precision_curve.sh ...     also prints the CSV decimated to every 10th step
#                                             plus the last (what docs/precision.md shows)
#   RING_BF16_GEMM=convert bench/precision_curve.sh ...   the bf16 run on the conversion path
#
# Needs ringd and ring-worker built (cmake --build BUILD_DIR --target ringd ring-worker). The
# tiny spec is 4 workers x 4,096 tokens (16K tokens per step): on 2 shared cores (load ~10) a
# median step took 7.5 s in fp32 and 4.9 s in bf16 (oneDNN/AMX), 300 steps of both 74 minutes.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
steps="${2:-300}"
csv="${3:-precision_curve.csv}"
ringd="$build/daemon/ringd/ringd"
worker="$build/worker/ring-worker"
for x in "$ringd" "$worker"; do
  [[ -x "$x" ]] || { echo "precision_curve: no $x (build ringd and ring-worker)" >&2; exit 2; }
done
export UCX_TLS="${UCX_TLS:-self,posix}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
work="$(mktemp -d /tmp/precision-curve-XXXXXX)"
trap 'rm -rf "$work"' EXIT

for run in fp32 bf16; do
  case $run in
    fp32) spec="$src/configs/examples/tiny.yaml" ;;
    bf16) spec="$src/configs/examples/tiny-bf16.yaml" ;;
  esac
  t0=$(date +%s.%N)
  "$ringd" --spec "$spec" --job-dir "$work/$run" --worker-bin "$worker" --steps "$steps" \
    --threads 1 --json > "$work/$run.out" 2> "$work/$run.err" || {
    echo "precision_curve: ringd ($run) failed; its log:" >&2
    tail -20 "$work/$run/logs/ringd-0.log" >&2 || tail -20 "$work/$run.err" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  python3 -c "print(f'$run: $steps steps in {$t1-$t0:.0f} s')" >&2
  echo "$t0 $t1" > "$work/$run.time"
done

python3 - "$work" "$csv" "${EVERY:-0}" <<'PY'
import json, statistics, sys
work, csv, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(run):
    return {s["step"]: s for s in map(json.loads, open(f"{work}/{run}/steps.jsonl")) if "loss" in s}
def secs(run):
    t0, t1 = map(float, open(f"{work}/{run}.time").read().split())
    return t1 - t0
f, b = load("fp32"), load("bf16")
steps = sorted(set(f) & set(b))
if not steps or steps != sorted(f) or steps != sorted(b):
    sys.exit(f"precision_curve: the runs logged different steps ({len(f)} fp32, {len(b)} bf16)")
rows = [(s, f[s]["loss"], b[s]["loss"], (b[s]["loss"] - f[s]["loss"]) / f[s]["loss"]) for s in steps]
with open(csv, "w") as out:
    out.write("step,loss_fp32,loss_bf16,rel_diff\n")
    for r in rows:
        out.write(f"{r[0]},{r[1]:.6f},{r[2]:.6f},{r[3]:.6f}\n")
last = rows[-1]
tail = rows[-20:]
mf, mb = statistics.median(r[1] for r in tail), statistics.median(r[2] for r in tail)
warm = [r for r in rows if r[0] > 20] or rows
worst = max(warm, key=lambda r: abs(r[3]))
ms = lambda run, d: statistics.median(d[s]["step_ms"] for s in steps) / 1e3
print(f"steps: {len(rows)} (csv: {csv})")
print(f"first loss: fp32 {rows[0][1]:.4f}, bf16 {rows[0][2]:.4f}")
print(f"final loss (step {last[0]}): fp32 {last[1]:.4f}, bf16 {last[2]:.4f}, rel diff "
      f"{last[3]*100:+.3f}% (target within 2%: {'PASS' if abs(last[3]) <= 0.02 else 'FAIL'})")
print(f"final loss (median of last {len(tail)} steps): fp32 {mf:.4f}, bf16 {mb:.4f}, rel diff "
      f"{(mb-mf)/mf*100:+.3f}%")
print(f"per-step rel diff after step 20: median {statistics.median(r[3] for r in warm)*100:+.3f}%, "
      f"largest |.| {abs(worst[3])*100:.3f}% (step {worst[0]})")
print(f"time: fp32 {secs('fp32'):.0f} s (median step {ms('fp32', f):.2f} s), "
      f"bf16 {secs('bf16'):.0f} s (median step {ms('bf16', b):.2f} s)")
if every > 0:
    print("\nstep,loss_fp32,loss_bf16,rel_diff")
    for r in rows:
        if r[0] % every == 0 or r is last:
            print(f"{r[0]},{r[1]:.4f},{r[2]:.4f},{r[3]:+.5f}")
PY
