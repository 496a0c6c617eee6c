#!/usr/bin/env bash
# The convergence check for top-k gradient compression: the same job trained twice through
# ringd (offloaded AdamW), once dense and once with top-k density 0.001 + error feedback + dense
# warm-up steps, on the text task (Debian's /usr/share/common-licenses), same seed and data order.
# Reports final loss (mean of the last 20 steps) of each run and their ratio (target: top-k within
# 5% of dense), and bytes exchanged per step (steps.jsonl bytes_exchanged vs bytes_dense; target:
# >= 100x fewer after the warm-up). Both runs are measured in the same invocation.
#
#   bench/topk_convergence.sh [BUILD_DIR] [STEPS]     (defaults: build, 300)
#
# Needs ringd and ring-worker built (cmake --build BUILD_DIR --target ringd). A small model
# (2 layers, d_model 64, 2 CPU workers, 256 tokens per rank) keeps 300 steps to a few minutes on
# 2 cores.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
steps="${2:-300}"
ringd="$build/daemon/ringd/ringd"
worker="$build/worker/ring-worker"
[[ -x "$ringd" ]] || { echo "topk_convergence: no ringd at $ringd (build the ringd target)" >&2; exit 2; }
[[ -x "$worker" ]] || { echo "topk_convergence: no ring-worker at $worker" >&2; exit 2; }
export UCX_TLS="${UCX_TLS:-self,posix}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
work="$(mktemp -d /tmp/topk-conv-XXXXXX)"
trap 'rm -rf "$work"' EXIT

spec() {  # name compression-block
  cat > "$work/$1.yaml" <<YAML
job:
  name: topk-conv-$1
model:
  layers: 2
  d_model: 64
  heads: 4
  mlp: swiglu
  vocab: 256
data:
  source: text
  paths: [/usr/share/common-licenses]
  seq_len: 256
  seed: 7
parallel:
  context_ranks: 2
  ring_order: natural
optimizer:
  lr: 3.0e-3
  lr_warmup_steps: 20
  weight_decay: 0.1
  offload: cpu
$2
train:
  steps: $steps
  grad_clip: 1.0
  seed: 7
  log_every: 50
checkpoint:
  every_steps: 0
resources:
  nodes: 1
  workers_per_node: 2
  backend: cpu
  cpus_per_worker: 1
restart:
  max_restarts: 0
YAML
}
spec dense "  compression: none"
spec topk "  compression: topk
  density: 0.001
  error_feedback: true
  warmup_steps: 20"

for run in dense topk; do
  t0=$(date +%s.%N)
  "$ringd" --spec "$work/$run.yaml" --job-dir "$work/$run" --worker-bin "$worker" \
    --worker-threads 1 --threads 1 --json > "$work/$run.out" 2> "$work/$run.err" || {
    echo "topk_convergence: ringd ($run) failed; its log:" >&2
    tail -20 "$work/$run/logs/ringd-0.log" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  echo "$run: $steps steps in $(python3 -c "print(f'{$t1-$t0:.1f}')") s"
done

python3 - "$work/dense/steps.jsonl" "$work/topk/steps.jsonl" <<'PY'
import json, statistics, sys
def load(p):
    return [json.loads(l) for l in open(p) if l.strip()]
d, t = load(sys.argv[1]), load(sys.argv[2])
tail = 20
ld = [s["loss"] for s in d[-tail:]]
lt = [s["loss"] for s in t[-tail:]]
md, mt = statistics.median(ld), statistics.median(lt)
print(f"steps: dense {len(d)}, top-k {len(t)}")
print(f"first loss: dense {d[0]['loss']:.4f}, top-k {t[0]['loss']:.4f}")
print(f"final loss (median of last {tail} steps, min..max): dense {md:.4f} ({min(ld):.4f}..{max(ld):.4f}), "
      f"top-k {mt:.4f} ({min(lt):.4f}..{max(lt):.4f})")
ratio = mt / md
print(f"final loss ratio top-k/dense: {ratio:.4f} ({(ratio-1)*100:+.2f}%; target within 5%: "
      f"{'PASS' if abs(ratio-1) <= 0.05 else 'FAIL'})")
comp = [s for s in t if s.get("compressed")]
bd = statistics.median([s["bytes_dense"] for s in d])
bt_all = statistics.mean([s["bytes_exchanged"] for s in t])
if comp:
    bc = [s["bytes_exchanged"] for s in comp]
    bt = statistics.median(bc)
    print(f"bytes per step: dense {bd:.0f}, top-k after warm-up {bt:.0f} (min {min(bc)}, max {max(bc)}), "
          f"ratio {bd/bt:.1f}x (target >= 100x: {'PASS' if bd/bt >= 100 else 'FAIL'}); "
          f"all {len(t)} steps incl. dense warm-up: {bd/bt_all:.1f}x")
else:
    print("top-k run reported no compressed step")
tps_d = statistics.median([s["tokens_per_s"] for s in d])
tps_t = statistics.median([s["tokens_per_s"] for s in t])
print(f"tokens/s (median): dense {tps_d:.0f}, top-k {tps_t:.0f}")
PY
