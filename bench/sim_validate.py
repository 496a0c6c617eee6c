#!/usr/bin/python3
"""`ringctl simulate` against real ringd runs on emulated links (bench/emulated_cluster.py).

For each case (topology, nodes, ring order, stagger) and each repetition: bench/sim_calibrate
measures this machine right before the run (the case's spec, --as-run: the worker's step as a
ring rank runs it; ringd's optimizer on ringd's one thread; --host-probe: how concurrent
processes share the cores now; and again --cpu-time, per CPU-second of the main thread, beside
N-1 computing processes and N pollers that wake like progress threads) and bench/link_probe.py
adds the link model (one shaped link, idle and while the case's ranks' worth of compute runs;
--no-link-probe leaves it out), then the emulated cluster trains STEPS steps and keeps its
timelines, then `ringctl simulate` predicts the step on the same links (the graph the cluster
script wrote, which says that every node runs on this one machine).

Two predictions per run. From the calibration alone ("host probe"): the first calibration
file as measured (rates, the host table of concurrent processes, a waiter's load, the link
model); nothing of the run reaches the simulator. With the run's CPU share: the emulated nodes'
"GPUs" are time-shared cores, and what share of a core each rank's compute got can be taken as
an input of the emulation, as the links' tc rates are. The run measures it (each worker's
`compute cpu` log line: its passes' main-thread CPU time over their wall time less the ring
waits; bench/emulated_cluster.py) and this prediction takes it: the host table flat at the
largest rank's share, the others as `--straggler rank:factor`, the compute rates per
CPU-second, the idle link figures; not the run's step, compute or hop times. Beside them, for
comparison: one share (the median) for every rank, the loaded link figures, the gross share.
(While every emulated node's worker ran on core 0 — ringd placed workers on the machine's
first cores whatever its binding — the host-probe model, which shares the 2 cores among the
ranks, was 20-40 % short and the share was the way to predict; each node now runs on its own
core, i mod cores.)

Compared: the step (measured: the median over the steps after the first, per run; reported:
the median over runs and its min..max), and the ring's K/V hop in the forward and in the
backward (measured from the timeline: every forward or backward ring_send of a K/V block,
posted to completed (the progress engine's completion), median over ranks, layers, hops and
steps; predicted: the same from the simulated sends, `posted_median_s`). Each run's record
(--json) also keeps the phases of bench/sim_phases.py (measured from the timelines, predicted
from the simulated trace), the simulated flow's own mean time, the predicted critical path and
the link model used. The load average before each run is printed.

  sudo bench/sim_validate.py [--nodes 2 4 8] [--topologies fat-tree ring] [--reps 3]
                             [--order-stagger] [--json OUT]
--order-stagger adds, on the fat-tree with interleaved leaves (node i in leaf i mod leaves, so
the natural order crosses the oversubscribed root at every hop), the natural and the
topology-aware ring order (the simulator's own choice on the graph, run as
parallel.ring_order: list) and the stagger on and off.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim_phases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec_text(nodes, work, tag, order=None, stagger_us=0):
    base = open(os.path.join(ROOT, "configs", "examples", "tiny.yaml")).read()
    subs = [("seq_len: 16384", f"seq_len: {2048 * nodes}"),
            ("context_ranks: 4", f"context_ranks: {nodes}"),
            ("nodes: 1", f"nodes: {nodes}"), ("workers_per_node: 4", "workers_per_node: 1"),
            ("log_every: 10", "log_every: 1"), ("every_steps: 50", "every_steps: 1000")]
    for a, b in subs:
        assert a in base, a
        base = base.replace(a, b)
    lines = []
    for line in base.splitlines():
        if line.strip().startswith("dir: checkpoints"):
            line = f"  dir: {work}/ck-{tag}"
        if order is not None and line.strip().startswith("ring_order:"):
            line = "  ring_order: list\n  ring_order_list: [" + ", ".join(map(str, order)) + "]"
        if stagger_us and line.strip().startswith("causal_balance:"):
            line += f"\n  stagger_us: {stagger_us}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-3000:]}{r.stdout[-2000:]}")
    return r.stdout


def measured_hops(tl_dir, kv_bytes):
    """Median K/V hop (send posted -> completed) in the forward and in the backward, steps >= 2."""
    fwd, bwd = [], []
    for f in sorted(os.listdir(tl_dir)):
        rows = [json.loads(l) for l in open(os.path.join(tl_dir, f)).read().splitlines()[1:] if l.strip()]
        windows = {}  # (rank, step) -> [(kind, begin, end)]
        for r in rows:
            rank, step, kind, layer, hop, peer, b, e, by = r
            if kind in ("forward", "backward"):
                windows.setdefault((rank, step), []).append((kind, b, e))
        for r in rows:
            rank, step, kind, layer, hop, peer, b, e, by = r
            if step < 2 or kind != "ring_send" or by != kv_bytes:
                continue
            for k, wb, we in windows.get((rank, step), []):
                if wb <= b <= we:
                    (fwd if k == "forward" else bwd).append((e - b) / 1e9)
                    break
    med = lambda v: statistics.median(v) if v else float("nan")
    return med(fwd), med(bwd)


def one_case(a, work, topo, nodes, interleaved=False, order=None, stagger_us=0, label=""):
    tag = f"{topo}-{nodes}-{label or 'base'}"
    spec = os.path.join(work, f"spec-{tag}.yaml")
    open(spec, "w").write(spec_text(nodes, work, tag, order, stagger_us))
    runs = []
    for rep in range(a.reps):
        cal = os.path.join(work, f"cal-{tag}-{rep}.json")
        run([os.path.join(a.build, "bench", "sim_calibrate"), "--spec", spec, "--reps", "3",
             "--as-run", "--ringd-threads", "1", "--host-probe", str(2 * nodes), "-o", cal])
        # The same step per CPU-second of the main thread: a dedicated core's rates, for the
        # prediction with the share of a core each rank gets in the run.
        calc = os.path.join(work, f"calc-{tag}-{rep}.json")
        # The same step per CPU-second of the main thread, beside what a rank of this cluster
        # has beside it on the shared cores: the other ranks computing, every rank's progress
        # thread waking (their wake-ups preempt the compute: fewer FLOPs per CPU-second).
        run([os.path.join(a.build, "bench", "sim_calibrate"), "--spec", spec, "--reps", "3",
             "--as-run", "--cpu-time", "--beside-compute", str(nodes - 1), "--beside-pollers",
             str(nodes), "--ringd-threads", "1", "-o", calc])
        if not a.no_link_probe:  # the link model: UCX over one shaped veth link, with the
            # case's ranks' worth of compute beside it (bench/link_probe.py)
            run([sys.executable, os.path.join(ROOT, "bench", "link_probe.py"), "--build", a.build,
                 "--spec", spec, "--mbit", str(a.node_mbit), "--beside", str(max(0, nodes - 2)),
                 "--reps", str(a.probe_reps), "--merge-into", cal])
        load = os.getloadavg()[0]
        rec, graph = os.path.join(work, f"{tag}-{rep}.json"), os.path.join(work, f"{tag}.yaml")
        tl = os.path.join(work, f"tl-{tag}-{rep}")
        cmd = [sys.executable, os.path.join(ROOT, "bench", "emulated_cluster.py"), "--build", a.build,
               "--topology", topo, "--nodes", str(nodes), "--node-mbit", str(a.node_mbit),
               "--uplink-mbit", str(a.uplink_mbit), "--spec", spec, "--steps", str(a.steps),
               "--out", rec, "--graph-out", graph, "--timeline-out", tl]
        if interleaved:
            cmd.append("--interleaved")
        try:
            run(cmd)
        except RuntimeError as e:  # reported, not hidden: a run that failed or timed out
            print(f"run {rep} of {tag} failed: {str(e)[-600:]}", file=sys.stderr, flush=True)
            runs.append({"load": load, "failed": str(e)[-2000:]})
            continue
        rec_run = json.load(open(rec))
        predict = lambda c, *x: json.loads(run([os.path.join(a.build, "cli", "ringctl"), "simulate",
                                                spec, "--topology", graph, "--gpu", "cpu",
                                                "--calibration", c, "--json", *x]))
        # A rank's thread CPU time includes the kernel's interrupt work (the emulated links'
        # token-bucket timers, veth, bridges, TCP) that ran while it was the current thread: its
        # compute got that share less (kernel_interrupt_share, /proc/stat over the same steps).
        gross = rec_run.get("compute_share") or []
        kshare = rec_run.get("kernel_interrupt_share")
        shares = [x * (1 - kshare) for x in gross] if kshare is not None else gross
        # Each rank's own share: the host table at the largest, the others slower by theirs
        # (`--straggler rank:factor`, factor = largest / own share >= 1).
        top = max(shares) if shares else None
        per_rank = [x for g, sh in enumerate(shares) if sh < top
                    for x in ("--straggler", f"{g}:{top / sh:.6g}")]
        # The emulation's CPU: every rank's compute ran at the share of a core the run measured
        # (its main thread's CPU time over its compute's wall time, the median over ranks): the
        # host table flat at that share, the rates per CPU-second; polling and the transfers'
        # CPU are inside the share. The link model as measured before the run.
        share = statistics.median(shares) if shares else None
        trace = os.path.join(work, f"trace-{tag}-{rep}.json")
        sim_probe = predict(cal)
        if share:
            cs = json.load(open(calc))
            link = {k: v for k, v in json.load(open(cal)).items() if k.startswith("link_")}
            cs.update(link)
            cs.update({"host_speed": [share] * (2 * nodes + 2), "host_poll_load": 0.0,
                       "link_cpu_s_per_byte": 0.0})
            cal_loaded = os.path.join(work, f"cal-share-loaded-{tag}-{rep}.json")
            json.dump(cs, open(cal_loaded, "w"), indent=1)
            sim_loaded = predict(cal_loaded)
            # The hops with the idle link figures: measured to completion, the runs' K/V hops
            # take what an idle link takes (the loaded probe's per-message cost is not there).
            if link:
                cs.update({"link_rate_share_loaded": link["link_rate_share"],
                           "link_message_s_loaded": link["link_message_s"]})
            cal_share = os.path.join(work, f"cal-share-{tag}-{rep}.json")
            json.dump(cs, open(cal_share, "w"), indent=1)
            sim_uniform = predict(cal_share)
            cs["host_speed"] = [top] * (2 * nodes + 2)
            cal_ranks = os.path.join(work, f"cal-ranks-{tag}-{rep}.json")
            json.dump(cs, open(cal_ranks, "w"), indent=1)
            sim = predict(cal_ranks, "--trace", trace, *per_rank)
            # The same with the threads' CPU time taken as the compute's (interrupts included).
            cs["host_speed"] = [max(gross)] * (2 * nodes + 2)
            cal_gross = os.path.join(work, f"cal-gross-{tag}-{rep}.json")
            json.dump(cs, open(cal_gross, "w"), indent=1)
            sim_gross = predict(cal_gross, *per_rank)
        else:  # no share measured (a worker without the log line): the probe's prediction
            sim = sim_loaded = sim_uniform = sim_gross = predict(cal, "--trace", trace)
        after = None
        if a.after:  # the machine measured again after the run: the load may have moved
            cal2 = os.path.join(work, f"cal-{tag}-{rep}-after.json")
            run([os.path.join(a.build, "bench", "sim_calibrate"), "--spec", spec, "--reps", "3",
                 "--as-run", "--ringd-threads", "1", "--host-probe", str(2 * nodes), "-o", cal2])
            if not a.no_link_probe:
                run([sys.executable, os.path.join(ROOT, "bench", "link_probe.py"), "--build", a.build,
                     "--spec", spec, "--mbit", str(a.node_mbit), "--beside", str(max(0, nodes - 2)),
                     "--reps", str(a.probe_reps), "--merge-into", cal2])
            after = predict(cal2)["step_s"]
        steps = rec_run["steps"]
        ms = [s["step_ms"] / 1e3 for s in steps[1:]]
        kv = int(sim["hops"]["forward"]["bytes"])
        mf, mb = measured_hops(tl, kv)
        phases = {"measured": sim_phases.measured(tl, kv), "predicted": sim_phases.predicted(trace, sim)}
        runs.append({"load": load, "measured_s": statistics.median(ms), "steps_s": ms,
                     "predicted_s": sim["step_s"], "predicted_after_s": after,
                     "predicted_probe_s": sim_probe["step_s"], "compute_share": shares, "compute_share_gross": gross,
                     "kernel_interrupt_share": kshare, "predicted_gross_s": sim_gross["step_s"],
                     "pred_probe_hop_fwd_s": sim_probe["hops"]["forward"]["posted_median_s"],
                     "predicted_loaded_s": sim_loaded["step_s"],
                     "predicted_uniform_s": sim_uniform["step_s"],
                     "pred_loaded_hop_fwd_s": sim_loaded["hops"]["forward"]["posted_median_s"],
                     "pred_loaded_hop_bwd_s": sim_loaded["hops"]["backward_kv"]["posted_median_s"],
                     "load_after": os.getloadavg()[0], "pred_hop_fwd_s": sim["hops"]["forward"]["posted_median_s"],
                     "pred_hop_bwd_s": sim["hops"]["backward_kv"]["posted_median_s"],
                     "pred_flow_fwd_s": sim["hops"]["forward"]["mean_s"],
                     "pred_flow_bwd_s": sim["hops"]["backward_kv"]["mean_s"],
                     "critical_path": sim["critical_path"],
                     "link_model": {k: v for k, v in json.load(open(cal)).items() if k.startswith("link_")},
                     "meas_hop_fwd_s": mf, "meas_hop_bwd_s": mb,
                     "host_speed": json.load(open(cal)).get("host_speed", []),
                     "phases": phases})
        print(f"{tag} run {rep} (load {load:.1f}):\n" +
              sim_phases.table(phases["measured"], phases["predicted"]), file=sys.stderr, flush=True)
    return {"topology": topo + (" interleaved" if interleaved else ""), "nodes": nodes,
            "label": label, "runs": runs}


def summary(case):
    rs = [r for r in case["runs"] if "failed" not in r]
    if not rs:
        return None
    med = lambda k: statistics.median(r[k] for r in rs)
    m, p = med("measured_s"), med("predicted_s")
    err = [100 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rs]
    return {"measured": m, "measured_lo": min(r["measured_s"] for r in rs),
            "measured_hi": max(r["measured_s"] for r in rs), "predicted": p,
            "predicted_lo": min(r["predicted_s"] for r in rs),
            "predicted_hi": max(r["predicted_s"] for r in rs),
            "error_pct": 100 * (p - m) / m, "run_errors_pct": err,
            "hop_fwd": (med("pred_hop_fwd_s"), med("meas_hop_fwd_s")),
            "hop_bwd": (med("pred_hop_bwd_s"), med("meas_hop_bwd_s")),
            "load": [r["load"] for r in rs],
            "probe": statistics.median(r["predicted_probe_s"] for r in rs),
            "probe_errors_pct": [100 * (r["predicted_probe_s"] - r["measured_s"]) / r["measured_s"]
                                 for r in rs],
            "loaded": statistics.median(r["predicted_loaded_s"] for r in rs),
            "uniform": statistics.median(r["predicted_uniform_s"] for r in rs),
            "gross": statistics.median(r.get("predicted_gross_s", float("nan")) for r in rs),
            "kshare": [r.get("kernel_interrupt_share") or float("nan") for r in rs],
            "share": [statistics.median(r["compute_share"]) if r.get("compute_share") else float("nan")
                      for r in rs]}


def print_row(case):
    s = summary(case)
    failed = sum("failed" in r for r in case["runs"])
    if s is None:
        loads = " ".join("%.1f" % r["load"] for r in case["runs"])
        print(f"| {case['topology']} {case['label']} | {case['nodes']} | every run failed "
              f"({failed}) | | | | | {loads} |", flush=True)
        return
    hf, hb = s["hop_fwd"], s["hop_bwd"]
    print(f"| {case['topology']} {case['label']} | {case['nodes']} | {s['predicted']:.3f} "
          f"({s['predicted_lo']:.3f}..{s['predicted_hi']:.3f}) | {s['measured']:.3f} "
          f"({s['measured_lo']:.3f}..{s['measured_hi']:.3f}) | {s['error_pct']:+.0f} % "
          f"({', '.join(f'{x:+.0f}' for x in s['run_errors_pct'])}) | "
          f"{hf[0] * 1e3:.1f} / {hf[1] * 1e3:.1f} | {hb[0] * 1e3:.1f} / {hb[1] * 1e3:.1f} | "
          f"{' '.join(f'{x:.1f}' for x in s['load'])}"
          f"{f' ({failed} run(s) failed)' if failed else ''} | "
          f"{' '.join(f'{x:.2f}' for x in s['share'])} | "
          f"{s['uniform']:.3f} ({100 * (s['uniform'] - s['measured']) / s['measured']:+.0f} %) | "
          f"{s['loaded']:.3f} ({100 * (s['loaded'] - s['measured']) / s['measured']:+.0f} %) | "
          f"{s['probe']:.3f} ({100 * (s['probe'] - s['measured']) / s['measured']:+.0f} %; "
          f"{', '.join(f'{x:+.0f}' for x in s['probe_errors_pct'])}) | "
          f"{' '.join(f'{x:.2f}' for x in s['kshare'])} | "
          f"{s['gross']:.3f} ({100 * (s['gross'] - s['measured']) / s['measured']:+.0f} %) |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--nodes", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--topologies", nargs="+", default=["fat-tree", "ring"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--node-mbit", type=float, default=400)
    ap.add_argument("--uplink-mbit", type=float, default=200)
    ap.add_argument("--no-link-probe", action="store_true",
                    help="predict without the link model (the links' nominal rates)")
    ap.add_argument("--probe-reps", type=int, default=7, help="transfers per size in the link probe")
    ap.add_argument("--order-stagger", action="store_true")
    ap.add_argument("--order-nodes", type=int, default=8)
    ap.add_argument("--stagger-us", type=int, default=20000)
    ap.add_argument("--json", help="write every run's numbers here")
    ap.add_argument("--after", action="store_true",
                    help="calibrate again after each run and predict with that too")
    ap.add_argument("--keep", action="store_true", help="keep the specs, calibrations, records and timelines")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("sim_validate: needs root (network namespaces)", file=sys.stderr)
        return 77
    for b in ("daemon/ringd/ringd", "worker/ring-worker", "cli/ringctl", "bench/sim_calibrate"):
        if not os.access(os.path.join(a.build, b), os.X_OK):
            print(f"sim_validate: {a.build}/{b} not built", file=sys.stderr)
            return 2
    work = tempfile.mkdtemp(prefix="sim-validate-")
    cases = []
    print("| case | nodes | predicted with the run's CPU share s (min..max) | measured s (min..max) "
          "| error of medians (per run) "
          "| fwd K/V hop ms pred / meas | bwd K/V hop ms pred / meas | load avg "
          "| CPU share per run | one share for all ranks s (error) "
          "| with the loaded link figures s (error) "
          "| from the calibration alone (host probe) s (error of medians; per run) "
          "| kernel interrupt share per run "
          "| with the threads' CPU share, interrupts included s (error) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    try:
        for topo in a.topologies:
            for n in a.nodes:
                cases.append(one_case(a, work, topo, n))
                print_row(cases[-1])
        if a.order_stagger:
            n = a.order_nodes
            # The topology-aware order the simulator picks on the interleaved graph (the
            # coordinator's tour solver on the graph's hop counts), run as an explicit list.
            probe = one_case_graph(a, work, n)
            for label, order, stagger in (("natural", None, 0), ("topology", probe, 0),
                                          ("natural+stagger", None, a.stagger_us),
                                          ("topology+stagger", probe, a.stagger_us)):
                cases.append(one_case(a, work, "fat-tree", n, True, order, stagger, label))
                print_row(cases[-1])
    finally:
        if a.json:
            json.dump(cases, open(a.json, "w"), indent=1)
        if a.keep:
            print(f"kept {work}")
        else:
            subprocess.run(["rm", "-rf", work])
    return 0


def one_case_graph(a, work, n):
    """The topology-aware ring order on the interleaved fat-tree of n nodes: the same graph the
    cluster script writes, asked of `ringctl simulate --ring-order topology`."""
    leaves = (n + 1) // 2
    g = os.path.join(work, f"order-{n}.yaml")
    out = ["gpus_per_node: 1", f"nodes: [{', '.join(f'node{i}' for i in range(n))}]",
           f"switches: [{', '.join(f'leaf{l}' for l in range(leaves))}, root]", "links:"]
    for l in range(leaves):
        out.append(f"  - {{from: leaf{l}, to: root, gbytes_per_s: {a.uplink_mbit / 8e3}}}")
    for i in range(n):
        out.append(f"  - {{from: node{i}, to: leaf{i % leaves}, gbytes_per_s: {a.node_mbit / 8e3}}}")
    open(g, "w").write("\n".join(out) + "\n")
    spec = os.path.join(work, f"spec-order-{n}.yaml")
    open(spec, "w").write(spec_text(n, work, "order"))
    sim = json.loads(run([os.path.join(a.build, "cli", "ringctl"), "simulate", spec, "--topology", g,
                          "--gpu", "H100", "--ring-order", "topology", "--json"]))
    return sim["ring_nodes"]


if __name__ == "__main__":
    sys.exit(main())
