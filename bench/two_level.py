#!/usr/bin/python3
"""Two-level context parallelism against the single ring on emulated links (issue 34).

4 emulated nodes x 2 workers (bench/emulated_cluster.py: a network namespace per node, each
node's link to its leaf rate-limited with tc, UCX over TCP between nodes and shared memory
inside one), one sequence over the 8 ranks: `parallel.head_ranks` 2 (4 groups of 2, the ring over
the groups) against 1 (one ring of 8), the layouts alternating, --reps runs each. Per layout:

  - the measured step time (ringd's step_ms, steps after the first; median over every run's
    steps, and the spread of the runs' medians);
  - the measured bytes between nodes: each node's link tx counter over the job (payload plus
    TCP/IP/Ethernet headers as the kernel counts them), per step, the mean over nodes and the
    busiest node, against `ringctl plan`'s figure for the same spec (ring bytes leaving a node
    plus the node's dense gradient all-reduce; the plan's ring figure is the busiest node's);
  - `ringctl simulate` on the same link graph (--gpu cpu): its predicted step, and the predicted
    ratio of the two layouts against the measured one.

Needs root. Prints a table and writes --out FILE (JSON) with every run.
  sudo bench/two_level.py [--reps 3] [--steps 5] [--node-mbit 200] [--seq-len 8192]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPEC = """job: {{name: two-level-bench}}
model: {{layers: 2, d_model: 64, heads: 4, mlp: swiglu, mlp_hidden: 128, vocab: 256}}
data: {{source: text, paths: [/usr/share/common-licenses], seq_len: {seq}, seed: 1}}
parallel: {{context_ranks: 8, head_ranks: {u}, ring_order: natural}}
optimizer: {{lr: 1.0e-3, lr_warmup_steps: 0, offload: cpu}}
train: {{steps: {steps}, seed: 1, log_every: 1}}
resources: {{nodes: 4, workers_per_node: 2, backend: cpu, cpus_per_worker: 1}}
"""


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-1500:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--node-mbit", type=float, default=200)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--bench-build", default=os.path.join(ROOT, "build-bench"),
                    help="a build with RING_BUILD_BENCH on (sim_calibrate)")
    ap.add_argument("--calibration", help="ringctl simulate --gpu cpu calibration (default: "
                    "measured here with bench/sim_calibrate at the spec's shapes)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("two_level: needs root (network namespaces, tc)", file=sys.stderr)
        return 77
    ringctl = os.path.join(a.build, "cli", "ringctl")
    work = tempfile.mkdtemp(prefix="two-level-")
    specs, plans, runs, graph = {}, {}, {1: [], 2: []}, None
    for u in (1, 2):
        specs[u] = os.path.join(work, f"u{u}.yaml")
        open(specs[u], "w").write(SPEC.format(seq=a.seq_len, u=u, steps=a.steps))
        plans[u] = json.loads(run([ringctl, "plan", specs[u], "--json"]))["communication"]
    cal = a.calibration
    if not cal:
        cal = os.path.join(work, "calibration.json")
        run(["cmake", "--build", a.bench_build, "--target", "sim_calibrate"])
        run([os.path.join(a.bench_build, "bench", "sim_calibrate"), "--spec", specs[1], "--reps",
             "3", "-o", cal])
    for rep in range(a.reps):
        for u in (1, 2):
            rec = os.path.join(work, f"u{u}-{rep}.json")
            graph = os.path.join(work, "graph.yaml")
            load = os.getloadavg()[0]
            run([sys.executable, os.path.join(ROOT, "bench", "emulated_cluster.py"), "--build",
                 a.build, "--topology", "fat-tree", "--nodes", "4", "--leaf-size", "2",
                 "--node-mbit", str(a.node_mbit), "--uplink-mbit", str(2 * a.node_mbit),
                 "--spec", specs[u], "--steps", str(a.steps), "--out", rec, "--graph-out", graph])
            r = json.load(open(rec))
            r["load"] = load
            runs[u].append(r)
            print(f"run {rep} head_ranks {u}: median step {r['median_step_s'] * 1e3:.0f} ms, "
                  f"node tx {[round(x / 1e6, 1) for x in r['node_tx_bytes']]} MB, load {load:.1f}",
                  flush=True)
    result = {"node_mbit": a.node_mbit, "seq_len": a.seq_len, "steps": a.steps, "layouts": {}}
    for u in (1, 2):
        steps = [s["step_ms"] / 1e3 for r in runs[u] for s in r["steps"][1:]]
        medians = [r["median_step_s"] for r in runs[u]]
        tx = [x / a.steps for r in runs[u] for x in r["node_tx_bytes"]]
        per_run_mean = [statistics.mean(r["node_tx_bytes"]) / a.steps for r in runs[u]]
        c = plans[u]
        # The cluster script writes one GPU per node; these nodes run 2 workers each.
        g = open(graph).read().replace("gpus_per_node: 1", "gpus_per_node: 2")
        open(graph, "w").write(g)
        planned = c["inter_node_ring_bytes_per_step_per_node"] + c["grad_sent_dense_per_node_bytes"]
        sim = json.loads(run([ringctl, "simulate", specs[u], "--topology", graph, "--gpu", "cpu",
                              "--calibration", cal, "--json"]))
        result["layouts"][u] = {
            "step_s_median": statistics.median(steps),
            "run_medians_s": medians,
            "node_bytes_per_step_mean": statistics.mean(tx),
            "node_bytes_per_step_max": max(tx),
            "node_bytes_per_step_run_means": per_run_mean,
            "plan_node_bytes_per_step": planned,
            "predicted_step_s": sim.get("step_s") or sim.get("step", {}).get("seconds"),
            "loads": [r["load"] for r in runs[u]],
        }
    L = result["layouts"]
    measured_ratio = L[2]["step_s_median"] / L[1]["step_s_median"]
    p1, p2 = L[1]["predicted_step_s"], L[2]["predicted_step_s"]
    result["measured_ratio"] = measured_ratio
    result["predicted_ratio"] = p2 / p1 if p1 and p2 else None
    print(f"\n| layout | step (median; run medians) | bytes leaving a node per step: mean "
          f"(busiest) | plan | simulate |")
    print("|---|---|---|---|---|")
    for u, name in ((1, "single ring of 8"), (2, "head_ranks 2 x ring of 4")):
        x = L[u]
        print(f"| {name} | {x['step_s_median'] * 1e3:.0f} ms "
              f"({', '.join(f'{m * 1e3:.0f}' for m in x['run_medians_s'])}) | "
              f"{x['node_bytes_per_step_mean'] / 1e6:.2f} MB ({x['node_bytes_per_step_max'] / 1e6:.2f}) "
              f"| {x['plan_node_bytes_per_step'] / 1e6:.2f} MB "
              f"({(x['node_bytes_per_step_mean'] / x['plan_node_bytes_per_step'] - 1) * 100:+.1f}%) | "
              f"{(x['predicted_step_s'] or 0) * 1e3:.0f} ms |")
    pr = result["predicted_ratio"]
    print(f"\nstep ratio two-level / single: measured {measured_ratio:.3f}, simulate "
          f"{pr if pr is None else round(pr, 3)}"
          + ("" if pr is None else f" ({(pr / measured_ratio - 1) * 100:+.1f}%)"))
    if a.out:
        json.dump({"result": result, "runs": runs}, open(a.out, "w"), indent=1)
    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
