#!/usr/bin/python3
"""A step phase by phase: what the workers' timelines measured against `ringctl simulate --trace`.

Measured (the timelines a job keeps, <job dir>/timeline/node-K.jsonl; steps from --from-step on),
per rank and step, then the median over ranks of the mean over steps:

  forward, backward      the layers' windows (kForward / kBackward records), summed over layers
  *_wait                 the part of them the main thread spent blocked on the ring: receives
                         (ring_wait) and K/V sends (from the end of the hop's last receive wait
                         to the send's completion, when later)
  *_compute              window minus wait: the compute, as the host let it run
  step, params_wait, data, collective, handover: the records of those kinds; other = step -
                         data - collective - forward - backward - handover (LM head, embedding,
                         loss)
  hop_fwd, hop_bwd       K/V sends (bytes = the K/V block), posted to completed, median
  hop_dkv                dK/dV accumulator sends (other sizes, in the backward), median

Predicted (the simulated step's trace: every rank's compute tasks and sends), the same
quantities where the simulator has them: forward_compute (projections and attention forward),
backward_compute (their backward and any recompute), forward / backward (from the pass's first
to last task per rank, summed over layers), other (LM head), params_wait (the exchange and
optimizer exposed after the backward), hops as `--json` reports them (posted_median_s).

  bench/sim_phases.py TIMELINE_DIR --trace TRACE.json --sim SIM.json [--from-step 2]
"""
import argparse
import json
import os
import statistics
import sys


def _rows(tl_dir):
    for f in sorted(os.listdir(tl_dir)):
        lines = open(os.path.join(tl_dir, f)).read().splitlines()[1:]
        for line in lines:
            if line.strip():
                yield json.loads(line)


def measured(tl_dir, kv_bytes, from_step=2):
    """Per-phase seconds per step (median over ranks) and hop medians, from the timelines."""
    per = {}  # (rank, step) -> dict of lists
    for r in _rows(tl_dir):
        rank, step, kind, layer, hop, peer, b, e, by = r
        if step < from_step or rank < 0:
            continue
        per.setdefault((rank, step), []).append((kind, layer, hop, b, e, by))
    sums = {}  # rank -> {phase: [per step]}
    hops = {"fwd": [], "bwd": [], "dkv": []}
    for (rank, step), recs in per.items():
        win = {"forward": [], "backward": []}
        for kind, layer, hop, b, e, by in recs:
            if kind in win:
                win[kind].append((b, e))
        wait_end = {}  # (layer, hop) -> latest ring_wait end
        waits = []
        for kind, layer, hop, b, e, by in recs:
            if kind == "ring_wait":
                waits.append((b, e))
                wait_end[(layer, hop)] = max(wait_end.get((layer, hop), 0), e)
        for kind, layer, hop, b, e, by in recs:
            if kind == "ring_send" and by == kv_bytes and (layer, hop) in wait_end:
                if e > wait_end[(layer, hop)]:  # blocked on the send after the last receive
                    waits.append((wait_end[(layer, hop)], e))

        def inside(iv, wins):
            return next((k for k, ws in wins.items() for wb, we in ws if wb <= iv[0] <= we), None)

        d = {k: 0.0 for k in ("step", "params_wait", "data", "collective", "handover", "forward",
                              "backward", "forward_wait", "backward_wait")}
        for kind, layer, hop, b, e, by in recs:
            if kind in ("step", "params_wait", "data", "collective", "handover", "forward",
                        "backward"):
                d[kind] += (e - b) / 1e9
            if kind == "ring_send":
                k = inside((b, e), win)
                if by == kv_bytes and k:
                    hops["fwd" if k == "forward" else "bwd"].append((e - b) / 1e9)
                elif k == "backward" and by > 0:
                    hops["dkv"].append((e - b) / 1e9)
        for iv in waits:
            k = inside(iv, win)
            if k:
                d[k + "_wait"] += (iv[1] - iv[0]) / 1e9
        d["forward_compute"] = d["forward"] - d["forward_wait"]
        d["backward_compute"] = d["backward"] - d["backward_wait"]
        d["other"] = d["step"] - d["data"] - d["collective"] - d["forward"] - d["backward"] - \
            d["handover"]
        s = sums.setdefault(rank, {})
        for k, v in d.items():
            s.setdefault(k, []).append(v)
    out = {}
    if sums:
        keys = next(iter(sums.values())).keys()
        for k in keys:
            out[k] = statistics.median(statistics.mean(s[k]) for s in sums.values())
    med = lambda v: statistics.median(v) if v else float("nan")
    out["hop_fwd"], out["hop_bwd"], out["hop_dkv"] = med(hops["fwd"]), med(hops["bwd"]), \
        med(hops["dkv"])
    out["ranks"] = len(sums)
    return out


FWD = ("projections+MLP forward", "attention forward")
BWD = ("projections+MLP backward", "attention backward", "projections+MLP recompute",
       "attention recompute")


def predicted(trace_path, sim):
    """The same phases from the simulated step's trace (per rank, median over ranks)."""
    ev = [x for x in json.load(open(trace_path))["traceEvents"] if x.get("ph") == "X"]
    ranks = {}
    for x in ev:
        if x["pid"] != 1:
            continue
        r = ranks.setdefault(x["tid"], {"forward_compute": 0.0, "backward_compute": 0.0,
                                        "other": 0.0})
        dur = x["dur"] / 1e6
        if x["name"] in FWD:
            r["forward_compute"] += dur
        elif x["name"] in BWD:
            r["backward_compute"] += dur
        elif x["name"] == "LM head":
            r["other"] += dur
    out = {}
    if ranks:
        for k in ("forward_compute", "backward_compute", "other"):
            out[k] = statistics.median(r[k] for r in ranks.values())
    out["forward"] = sum(sim.get("layer_forward_s", []))
    out["backward"] = sum(sim.get("layer_backward_s", []))
    out["forward_wait"] = out["forward"] - out.get("forward_compute", 0)
    out["backward_wait"] = out["backward"] - out.get("backward_compute", 0)
    out["step"] = sim["step_s"]
    out["hop_fwd"] = sim["hops"]["forward"]["posted_median_s"]
    out["hop_bwd"] = sim["hops"]["backward_kv"]["posted_median_s"]
    out["hop_dkv"] = sim["hops"]["dkv"].get("posted_median_s") or sim["hops"]["dkv"]["mean_s"]
    # The exchange and optimizer after the backward: what the workers wait for as params_wait.
    out["params_wait"] = sim.get("exchange_exposed_s", 0) + sim.get("optimizer_exposed_s", 0)
    return out


ORDER = ("step", "forward", "forward_compute", "forward_wait", "backward", "backward_compute",
         "backward_wait", "other", "params_wait", "collective", "data", "handover", "hop_fwd",
         "hop_bwd", "hop_dkv")


def table(m, p):
    lines = ["| phase (s per step) | predicted | measured | error |", "|---|---|---|---|"]
    for k in ORDER:
        mv, pv = m.get(k), p.get(k)
        err = f"{100 * (pv - mv) / mv:+.0f} %" if mv and pv is not None and mv == mv else ""
        f = lambda v: "-" if v is None or v != v else f"{v:.4f}"
        lines.append(f"| {k} | {f(pv)} | {f(mv)} | {err} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("timeline_dir")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--sim", required=True, help="ringctl simulate --json output")
    ap.add_argument("--from-step", type=int, default=2)
    a = ap.parse_args()
    sim = json.load(open(a.sim))
    kv = int(sim["hops"]["forward"]["bytes"])
    print(table(measured(a.timeline_dir, kv, a.from_step), predicted(a.trace, sim)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
