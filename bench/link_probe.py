#!/usr/bin/python3
"""What one ring hop costs on an emulated link: the link model of `ringctl simulate`.

Builds two network namespaces joined by one veth pair with a tc token bucket (tbf) at --mbit
on both ends, exactly as bench/emulated_cluster.py shapes every link of its clusters, and runs
one `sim_calibrate --link-probe` rank in each (the ring's transport, UCX over TCP with the same
UCX_TLS, driven by the worker's progress engine). Rank 0 sends messages of each size and times
each send from posted to complete, as the worker's timeline records a ring_send; first with
nothing else running ("idle"), then as in a ring step ("loaded"): both ranks compute in their
main thread (--compute-factor times the message's time at the nominal rate) while the progress
thread moves the message, with --beside more single-thread GEMM processes on the same cores
(the other ranks of an emulated cluster). For each of the two, a least-squares line through the
median time per size,

    t(bytes) = message_s + bytes / (rate_share x rate),

fitted to the sizes of at least twice the token bucket's burst (smaller ones are reported),
gives the per-message cost (message_s: the transport's rendezvous, the progress thread's
polling, TCP's start on an idle connection, less the burst that the bucket lets through at the
veth's speed when the link was idle: negative when the burst outweighs the rest) and the share of the tc rate that TCP through the
token bucket delivers (rate_share). What the transfers cost the compute beside them,
`cpu_s_per_byte`: each rank's GEMM rate while a transfer moved, against the same GEMMs for as
long right after with no transfer (same processes beside), the median of these pairs' ratios q
(the mean of the two ranks'); with n = 2 + beside processes on the cores, a ratio q is
n (1/q - 1) more processes over the compute window, divided by the bytes moved in it (the
transport's progress thread, the kernel's TCP and the tc/veth/bridge work, wherever the kernel
charges it).

With --merge-into CAL the fit is written into the calibration file `ringctl simulate` reads
(keys link_rate_share, link_message_s, link_rate_share_loaded, link_message_s_loaded,
link_loaded_processes, link_cpu_s_per_byte, link_probe_mbit; docs/simulation.md, "Links").
Needs root (ip, tc).

  sudo bench/link_probe.py --build build --spec SPEC [--mbit 400] [--beside 2] [--reps 5]
                           [--sizes B1 B2 ..] [--merge-into CAL] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulated_cluster as ec  # noqa: E402


def fit_line(xs, ys):
    """Least squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def fit_level(level, rate_Bps, min_fit_bytes):
    """The line through the sizes of at least min_fit_bytes (twice the token bucket's burst:
    smaller messages pass partly or wholly at the burst and are reported, not fitted)."""
    xs, ys, pts = [], [], []
    for s in level["sizes"]:
        x, y = float(s["bytes"]), statistics.median(s["send_completed_s"])
        pts.append([x, y])
        if x >= min_fit_bytes:
            xs.append(x)
            ys.append(y)
    if len(xs) < 2:
        raise RuntimeError(f"link probe: fewer than two sizes of at least {min_fit_bytes} bytes to fit")
    a, b = fit_line(xs, ys)
    if b <= 0:
        raise RuntimeError(f"link probe: time does not grow with size ({list(zip(xs, ys))})")
    return {"message_s": a, "rate_share": min(1.0, 1.0 / (b * rate_Bps)), "points": pts,
            "fitted_from_bytes": min_fit_bytes, "half_round_trip_s": level["half_round_trip_s"]}


def probe(args):
    cal_bin = os.path.join(args.build, "bench", "sim_calibrate")
    if not os.access(cal_bin, os.X_OK):
        raise RuntimeError(f"{cal_bin} not built")
    ec.remove_stale()
    c = ec.Cluster(f"rc{os.getpid()}")
    work = tempfile.mkdtemp(prefix="link-probe-")
    try:
        ec.build_ring(c, 2, args.mbit, 0.0)
        rdv = os.path.join(work, "rdv")
        procs = []
        for r in (0, 1):
            env = dict(os.environ, UCX_TLS="tcp,self,posix", UCX_NET_DEVICES=c.node_dev[r])
            cmd = ["ip", "netns", "exec", c.node_ns[r], cal_bin, "--spec", args.spec,
                   "--link-probe", str(r), "--rendezvous", rdv, "--reps", str(args.reps),
                   "--sizes", ",".join(map(str, args.sizes)), "--beside", str(args.beside),
                   "--compute-ns-per-byte", str(args.compute_factor * 8e3 / args.mbit),
                   *(["--bidirectional"] if args.bidirectional else []),
                   "-o", os.path.join(work, f"rank{r}.json")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        deadline = time.time() + args.timeout
        while time.time() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
        outs = [p.communicate() for p in procs]
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError("link probe failed: " + " | ".join(
                f"rank {r}: exit {p.returncode} {outs[r][1].strip()[-800:]}" for r, p in enumerate(procs)))
        ranks = [json.load(open(os.path.join(work, f"rank{r}.json"))) for r in (0, 1)]
    finally:
        c.remove()
        subprocess.run(["rm", "-rf", work])
    rate = args.mbit * 1e6 / 8
    lv = ranks[0]["levels"]
    burst = ec.tbf_burst(args.mbit)
    idle = fit_level(lv[0], rate, 2 * burst)
    loaded = fit_level(lv[1], rate, 2 * burst)
    # What the transfers cost the compute: each rank's GEMM rate while a transfer moved against
    # the same GEMMs right after with none (same processes beside), median over the pairs. With n = 2 + beside processes
    # sharing the cores (n >= cores), a rate ratio q means the transfers loaded the host as
    # n (1/q - 1) more processes over the compute window; per byte moved in it:
    n = 2 + args.beside
    lv1 = [rk["levels"][1] for rk in ranks]
    q = statistics.mean(min(1.0, l["compute_rate_ratio"]) for l in lv1)
    window = statistics.mean(l["compute_window_s"] for l in lv1)
    cpu = max(0.0, n * (1 / q - 1)) * window / lv1[0]["bytes"]
    return {"mbit": args.mbit, "beside": args.beside, "idle": idle, "compute_ratio": q,
            "loaded": loaded, "cpu_s_per_byte": cpu, "raw": ranks[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--spec", required=True, help="the case's spec (the GEMM beside it takes its shapes)")
    ap.add_argument("--mbit", type=float, default=400)
    ap.add_argument("--beside", type=int, default=0,
                    help="loaded: GEMM processes computing beside the two ranks (other ranks)")
    ap.add_argument("--bidirectional", action="store_true",
                    help="send the same message the other way at once (both directions loaded)")
    ap.add_argument("--compute-factor", type=float, default=1.5,
                    help="loaded: each rank computes this many times the message's time at the "
                         "nominal rate while it moves")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[65536, 524288, 1048576, 2097152, 3145728, 4194304])
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--merge-into", help="write the link model into this calibration file")
    ap.add_argument("--json", help="write the fit and the raw times here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("link_probe: needs root (network namespaces, tc)", file=sys.stderr)
        return 77
    r = probe(args)
    for k in ("idle", "loaded"):
        f = r[k]
        extra = (f" (both ranks computing, {r['beside']} GEMM processes beside)"
                 if k == "loaded" else "")
        print(f"link {args.mbit:g} Mbit/s, {k}{extra}: "
              f"per message {f['message_s'] * 1e3:.2f} ms, {100 * f['rate_share']:.1f} % of the rate; "
              f"median one-way ms per size: "
              + ", ".join(f"{int(x)}: {y * 1e3:.1f}" for x, y in f["points"]), flush=True)
    print(f"compute beside the transfers ran at {100 * r['compute_ratio']:.1f} % of its rate alone: "
          f"{r['cpu_s_per_byte'] * 1e9:.2f} ns of host CPU per byte moved")
    if args.merge_into:
        cal = json.load(open(args.merge_into))
        cal.update({"link_probe_mbit": args.mbit,
                    "link_rate_share": r["idle"]["rate_share"], "link_message_s": r["idle"]["message_s"],
                    "link_rate_share_loaded": r["loaded"]["rate_share"],
                    "link_message_s_loaded": r["loaded"]["message_s"],
                    "link_loaded_processes": r["beside"] + 2, "link_cpu_s_per_byte": r["cpu_s_per_byte"]})
        fd = os.open(args.merge_into, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "w") as f:
            json.dump(cal, f, indent=2)
    if args.json:
        json.dump(r, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
