#!/usr/bin/env bash
# Ring attention at scale: one training step (plus a warm-up step) of a tiny model on
# packed Debian text (documents up to 8K tokens, recompute on) across 4 ring-worker processes,
# 1 thread each, at 256K, 512K and 1M tokens; prints time per step and each rank's VmHWM.
#   bench/ring_scale.sh [BUILD_DIR] [SEQ_LENS...]     (default build-ring; 262144 524288 1048576)
#   RING_SCALE_STEPS=1 runs one step only (the first includes first-touch of every buffer).
set -euo pipefail
build=${1:-build-ring}
shift || true
lens=("$@")
[ ${#lens[@]} -gt 0 ] || lens=(262144 524288 1048576)
dir=$(mktemp -d /tmp/ring-scale-XXXXXX)
trap 'rm -rf "$dir"' EXIT
for len in "${lens[@]}"; do
  cat > "$dir/spec-$len.yaml" <<YAML
job: {name: ring-scale-$len}
model: {layers: 2, d_model: 64, heads: 4, kv_heads: 2, mlp: swiglu, vocab: 256, recompute: true}
data: {source: text, paths: [/usr/share/common-licenses, /usr/share/doc], seq_len: $len,
       max_doc_len: 8192, seed: 1}
parallel: {context_ranks: 4, ring_order: natural, causal_balance: zigzag}
optimizer: {lr: 1.0e-3, offload: none}
train: {steps: 2, seed: 1, log_every: 1}
resources: {nodes: 1, workers_per_node: 4, backend: cpu, cpus_per_worker: 1}
YAML
  echo "== seq_len $len"
  /usr/bin/time -f "wall %e s" "$build/worker/ring-worker" --spec "$dir/spec-$len.yaml" ${RING_SCALE_STEPS:+--steps $RING_SCALE_STEPS} \
    --launch-local --threads 1 --max-corpus-mb 16 --timeout-ms 600000
done
