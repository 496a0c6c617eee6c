#!/usr/bin/env bash
# Host memory of parallel.shard none, optimizer and full, measured against `ringctl plan`: one model
# whose optimizer state dominates (4 layers, d_model 1024: 51 M parameters, 204 MB per fp32
# copy) trained a few steps through ringd on 1, 2 and 4 nodes of this machine (one ringd per
# node, one CPU worker per node, one ring over the nodes), dense AdamW, no checkpoints.
#
#   bench/shard_memory.sh [BUILD_DIR] [STEPS]     (defaults: build, 3)
#   COMPRESSION=topk bench/shard_memory.sh ...       (top-k density 0.01 + error feedback after
#                                                    one dense step, instead of dense AdamW)
#   RINGCTL=other/ringctl bench/shard_memory.sh ...  (the plan from another build's ringctl: to
#                                                    measure one build's ringd against another's plan)
#
# Needs ringd, ring-worker and ringctl built (cmake --build BUILD_DIR --target ringd ring-worker
# ringctl). Peak 4 x ~1.9 GB of memory with 4 nodes.
#
# What is measured, from /proc/PID/status sampled every 0.2 s until the process exits:
#   worker   VmHWM - RssShmem: the worker's private peak (its own buffers; the shared segment it
#            maps is the node's and is counted once, below). RssShmem is the largest sampled:
#            the segment's pages the process touched, which stay mapped until the attempt ends.
#   ringd    VmHWM - RssShmem: ringd's private peak (optimizer state, node gradient, ...)
#   shm      ringd's RssShmem: the pages of the node's segment in use. The lazy index (8 n bytes)
#            is only touched by update: lazy, so with dense updates the plan's shm line minus
#            the index is what can be resident; the table compares with that.
#   node     ringd VmHWM + workers' private peaks (backend cpu: the workers are host memory)
# Plan figures are `ringctl plan --json` for the same spec. Ratio = measured / plan. Process
# overheads the plan does not list (binaries, libraries, thread stacks, allocator slack, the
# worker's corpus and activations of 512 tokens) make the small figures' ratios above 1.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
steps="${2:-3}"
ringd="$build/daemon/ringd/ringd"
worker="$build/worker/ring-worker"
ringctl="${RINGCTL:-$build/cli/ringctl}"
for x in "$ringd" "$worker" "$ringctl"; do
  [[ -x "$x" ]] || { echo "shard_memory: no $x (build ringd, ring-worker, ringctl)" >&2; exit 2; }
done
export UCX_TLS="${UCX_TLS:-self,posix}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
work="$(mktemp -d /tmp/shard-mem-XXXXXX)"
trap 'rm -rf "$work"' EXIT

spec() {  # file shard nodes
  cat > "$1" <<YAML
job:
  name: shard-mem
model:
  layers: 4
  d_model: 1024
  heads: 8
  mlp: swiglu
  vocab: 256
data:
  source: passkey
  seq_len: 512
  seed: 3
parallel:
  context_ranks: $3
  ring_order: natural
  shard: $2
optimizer:
  lr: 1.0e-4
  offload: cpu
$compression
train:
  steps: $steps
  grad_clip: 1.0
  seed: 3
checkpoint:
  every_steps: 0
resources:
  nodes: $3
  workers_per_node: 1
  backend: cpu
  cpus_per_worker: 1
  host_memory_gb: 20
restart:
  max_restarts: 0
YAML
}

# Samples VmHWM / RssShmem of the ringd pids given and of their children until all exit;
# writes one JSON object per process to $2.
sampler() {
  python3 - "$@" <<'PY'
import json, os, sys, time
out, pids = sys.argv[1], [int(p) for p in sys.argv[2:]]
seen = {}  # pid -> {"role", "node", "hwm", "shm"}
def status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            d = {}
            for l in f:
                k, _, v = l.partition(":")
                if k in ("VmHWM", "RssShmem", "RssAnon", "State"):
                    d[k] = v.split()[0]
            return d
    except OSError:
        return None
def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
while True:
    alive = False
    for node, p in enumerate(pids):
        for pid, role in [(p, "ringd")] + [(c, "worker") for c in children(p)]:
            s = status(pid)
            if s is None or s.get("State") == "Z":
                continue
            alive = True
            e = seen.setdefault(pid, {"role": role, "node": node, "hwm": 0, "shm": 0, "anon": 0})
            e["hwm"] = max(e["hwm"], int(s.get("VmHWM", 0)) * 1024)
            e["shm"] = max(e["shm"], int(s.get("RssShmem", 0)) * 1024)
            e["anon"] = max(e["anon"], int(s.get("RssAnon", 0)) * 1024)
    if not alive:
        break
    time.sleep(0.2)
json.dump(list(seen.values()), open(out, "w"))
PY
}

case "${COMPRESSION:-none}" in
  none) compression="  compression: none" ;;
  topk) compression="  compression: topk
  density: 0.01
  error_feedback: true
  warmup_steps: 1" ;;
  *) echo "shard_memory: COMPRESSION is none or topk" >&2; exit 2 ;;
esac

configs=("none 1" "optimizer 1" "full 1" "none 2" "optimizer 2" "full 2" "none 4" "optimizer 4"
         "full 4")
for c in "${configs[@]}"; do
  read -r shard nodes <<< "$c"
  tag="$shard-$nodes"
  spec "$work/$tag.yaml" "$shard" "$nodes"
  "$ringctl" plan --json "$work/$tag.yaml" > "$work/$tag.plan.json" 2>/dev/null
  pids=()
  for ((k = 0; k < nodes; ++k)); do
    extra=()
    [[ $nodes -gt 1 ]] && extra=(--nodes "$nodes" --node-rank "$k" --rendezvous "$work/$tag-rdv")
    "$ringd" --spec "$work/$tag.yaml" --job-dir "$work/$tag" --worker-bin "$worker" \
      --worker-threads 1 --threads 1 --json "${extra[@]}" \
      > "$work/$tag.$k.out" 2> "$work/$tag.$k.err" &
    pids+=($!)
  done
  sampler "$work/$tag.mem.json" "${pids[@]}" &
  spid=$!
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  wait "$spid"
  if [[ $ok != 1 ]]; then
    echo "shard_memory: ringd ($tag) failed; its log:" >&2
    tail -20 "$work/$tag/logs/ringd-0.log" >&2 || true
    exit 1
  fi
  echo "$tag: done ($(grep -c '"step"' "$work/$tag.0.out" || true) step lines)" >&2
done

python3 - "$work" "${configs[@]}" <<'PY'
import json, sys
work, configs = sys.argv[1], sys.argv[2:]
gb = lambda b: f"{b / 1e9:.3f}"
def item(items, prefix):
    return sum(i["bytes"] for i in items if i["name"].startswith(prefix))
rows = []
for c in configs:
    shard, nodes = c.split()
    tag = f"{shard}-{nodes}"
    p = json.load(open(f"{work}/{tag}.plan.json"))
    mem = json.load(open(f"{work}/{tag}.mem.json"))
    ringd = [m for m in mem if m["role"] == "ringd"]
    workers = [m for m in mem if m["role"] == "worker"]
    # The largest node (every node is sized alike with one worker each).
    r = max(ringd, key=lambda m: m["hwm"])
    w_priv = max(m["hwm"] - m["shm"] for m in workers)
    r_priv = r["hwm"] - r["shm"]
    node = max(m["hwm"] + sum(w["hwm"] - w["shm"] for w in workers if w["node"] == m["node"])
               for m in ringd)
    shm_items = p["host"]["shm"]["items"]
    plan_shm = p["host"]["shm"]["total_bytes"] - item(shm_items, "shm lazy index")
    plan_ringd = p["host"]["ringd"]["total_bytes"]
    plan_worker = p["worker"]["total_bytes"]
    plan_node = plan_ringd + plan_shm + p["host"]["workers"]["total_bytes"]
    rows.append((shard, nodes, p["shard"]["largest_range_floats"], p["shard"]["flat_floats"],
                 plan_worker, w_priv, plan_ringd, r_priv, plan_shm, r["shm"], plan_node, node))
print(f"model: n = {rows[0][3]} floats ({rows[0][3] * 4 / 1e6:.0f} MB per fp32 copy); "
      "GB = 10^9 bytes; ratio = measured / plan")
print("| shard | nodes | range (floats) | worker plan | worker meas. | ratio | ringd plan | "
      "ringd meas. | ratio | shm plan* | shm meas. | ratio | node plan | node meas. | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for (shard, nodes, rng, n, pw, mw, pr, mr, ps, ms, pn, mn) in rows:
    print(f"| {shard} | {nodes} | {rng} | {gb(pw)} | {gb(mw)} | {mw / pw:.2f} | {gb(pr)} | "
          f"{gb(mr)} | {mr / pr:.2f} | {gb(ps)} | {gb(ms)} | {ms / ps:.2f} | {gb(pn)} | "
          f"{gb(mn)} | {mn / pn:.2f} |")
print("* shm plan without the lazy index (untouched with dense updates)")
PY
