#!/usr/bin/env bash
# Memory and ring bytes of bf16 against fp32, measured against `ringctl plan` (issue 33,
# docs/precision.md "Memory"): configs/examples/tiny.yaml and tiny-bf16.yaml (4 ranks on one
# node, 4,096 tokens per rank, zigzag, packed documents) trained STEPS steps each through ringd,
# one after the other, no checkpoints, on the text of /usr/share/common-licenses only (the
# examples' /usr/share/doc makes each worker hold a corpus of up to 256 MiB, which the plan does
# not count).
#
#   bench/precision_memory.sh [BUILD_DIR] [STEPS]     (defaults: build, 4)
#   PACK=false bench/precision_memory.sh ...          one document per sequence (plain causal):
#                                                    the dK/dV rows then depend on the spec only
#
# Needs ringd, ring-worker and ringctl built. What is measured:
#   worker peak   VmHWM - RssShmem of each worker, sampled from /proc every 0.1 s (its private
#                 peak: the node's shared segment is counted once, by ringd); the largest worker
#   ring bytes    per rank and step, the sum of the bytes of its ring_send records in the node
#                 timeline (the transport's posted sends: K/V blocks forward and backward, dK/dV
#                 accumulators); median over steps 2..STEPS, then min/mean/max over ranks
# against the plan's "worker total" and "ring sent per rank" (ringctl plan --json of the same
# spec). Ratio = measured / plan.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
steps="${2:-4}"
ringd="$build/daemon/ringd/ringd"
worker="$build/worker/ring-worker"
ringctl="${RINGCTL:-$build/cli/ringctl}"
for x in "$ringd" "$worker" "$ringctl"; do
  [[ -x "$x" ]] || { echo "precision_memory: no $x (build ringd, ring-worker, ringctl)" >&2; exit 2; }
done
export UCX_TLS="${UCX_TLS:-self,posix}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
work="$(mktemp -d /tmp/precision-mem-XXXXXX)"
trap 'rm -rf "$work"' EXIT

sampler() {  # out ringd-pid: one JSON object per worker (VmHWM, RssShmem peaks)
  python3 - "$@" <<'PY'
import json, sys, time
out, ringd = sys.argv[1], int(sys.argv[2])
seen = {}
def status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.split()[0] for k, _, v in (l.partition(":") for l in f)
                    if k in ("VmHWM", "RssShmem", "State")}
    except OSError:
        return None
def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
while status(ringd) is not None:
    for pid in children(ringd):
        s = status(pid)
        if s is None or s.get("State") == "Z":
            continue
        e = seen.setdefault(pid, {"hwm": 0, "shm": 0})
        e["hwm"] = max(e["hwm"], int(s.get("VmHWM", 0)) * 1024)
        e["shm"] = max(e["shm"], int(s.get("RssShmem", 0)) * 1024)
    time.sleep(0.1)
json.dump(list(seen.values()), open(out, "w"))
PY
}

for run in fp32 bf16; do
  case $run in
    fp32) base="$src/configs/examples/tiny.yaml" ;;
    bf16) base="$src/configs/examples/tiny-bf16.yaml" ;;
  esac
  # The example as it is, but no checkpoints and no restarts, the text of
  # /usr/share/common-licenses only (the example's /usr/share/doc is a corpus of up to
  # --max-corpus-mb = 256 MiB that each worker holds, which the plan does not count), and PACK.
  sed -e 's/^\(  every_steps:\).*/\1 0/' -e "s/^\(  pack:\).*/\1 ${PACK:-true}/" \
    -e 's#^\(  paths:\).*#\1 [/usr/share/common-licenses]#' "$base" > "$work/$run.yaml"
  printf 'restart:\n  max_restarts: 0\n' >> "$work/$run.yaml"
  "$ringctl" plan --json "$work/$run.yaml" > "$work/$run.plan.json"
  "$ringd" --spec "$work/$run.yaml" --job-dir "$work/$run" --worker-bin "$worker" \
    --steps "$steps" --threads 1 --json > "$work/$run.out" 2> "$work/$run.err" &
  pid=$!
  sampler "$work/$run.mem.json" "$pid" &
  spid=$!
  wait "$pid" || {
    echo "precision_memory: ringd ($run) failed; its log:" >&2
    tail -20 "$work/$run/logs/ringd-0.log" >&2 || tail -20 "$work/$run.err" >&2
    exit 1
  }
  wait "$spid"
  echo "$run: $steps steps done" >&2
done

python3 - "$work" "$steps" <<'PY'
import json, statistics, sys
from collections import defaultdict
work, steps = sys.argv[1], int(sys.argv[2])
mb = lambda b: f"{b / 1e6:.1f}"
res = {}
for run in ("fp32", "bf16"):
    plan = json.load(open(f"{work}/{run}.plan.json"))
    mem = json.load(open(f"{work}/{run}.mem.json"))
    rows = [json.loads(l) for l in list(open(f"{work}/{run}/timeline/node-0.jsonl"))[1:]]
    sent = defaultdict(lambda: defaultdict(int))  # rank -> step -> bytes
    for r in rows:
        if r[2] == "ring_send":
            sent[r[0]][r[1]] += r[-1]
    per_rank = {k: statistics.median(v[s] for s in v if s >= 2 or steps == 1)
                for k, v in sent.items()}
    items = {i["name"]: i["bytes"] for i in plan["worker"]["items"]}
    res[run] = dict(
        plan_worker=plan["worker"]["total_bytes"],
        worker=max(m["hwm"] - m["shm"] for m in mem),
        workers=sorted(m["hwm"] - m["shm"] for m in mem),
        plan_ring=plan["communication"]["ring_bytes_per_step_per_rank"],
        plan_hop=plan["communication"]["ring_bytes_per_hop"],
        ring=[per_rank[k] for k in sorted(per_rank)],
        act=items.get("activations", 0), weights=items.get("weights", 0))
print("| | fp32 | bf16 | bf16 / fp32 |")
print("|---|---|---|---|")
f, b = res["fp32"], res["bf16"]
def row(name, x, y, fmt=mb):
    print(f"| {name} | {fmt(x)} | {fmt(y)} | {y / x:.3f} |")
row("worker peak, measured (largest worker, MB)", f["worker"], b["worker"])
print(f"| worker peaks, all 4 (MB) | {' / '.join(mb(x) for x in f['workers'])} | "
      f"{' / '.join(mb(x) for x in b['workers'])} | |")
row("worker total, plan (MB)", f["plan_worker"], b["plan_worker"])
print(f"| measured / plan | {f['worker'] / f['plan_worker']:.3f} | "
      f"{b['worker'] / b['plan_worker']:.3f} | |")
row("plan: weights (MB)", f["weights"], b["weights"])
row("plan: activations (MB)", f["act"], b["act"])
row("ring K/V block per hop, plan (MB)", f["plan_hop"], b["plan_hop"])
row("ring bytes per rank and step, measured mean (MB)", statistics.mean(f["ring"]),
    statistics.mean(b["ring"]))
print(f"| ring bytes per rank and step, measured min..max (MB) | {mb(min(f['ring']))}.."
      f"{mb(max(f['ring']))} | {mb(min(b['ring']))}..{mb(max(b['ring']))} | |")
row("ring bytes per rank and step, plan (MB)", f["plan_ring"], b["plan_ring"])
print(f"| measured mean / plan | {statistics.mean(f['ring']) / f['plan_ring']:.3f} | "
      f"{statistics.mean(b['ring']) / b['plan_ring']:.3f} | |")
PY
