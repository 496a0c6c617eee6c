#!/usr/bin/python3
"""A small emulated cluster on this machine, and ringmaster jobs measured on it.

Each "node" is a network namespace running one ringd (and its ring-worker processes); the nodes
are linked by veth pairs through Linux bridges in a fabric namespace, with tc tbf rate limits on every link, so ring hops and the gradient exchange between daemons go over UCX/TCP
through links of known bandwidth and latency. Two topologies:

  fat-tree  nodes in leaves of `--leaf-size`; each node's link to its leaf runs at --node-mbit;
            each leaf's uplink to the root bridge at --uplink-mbit (below leaf-size x node-mbit:
            an oversubscribed root). --interleaved puts node i in leaf i mod leaves.
  ring      node i linked directly to node i+1 (and the last to the first) at --node-mbit;
            traffic between non-adjacent nodes is routed through the nodes between them.

Links are rate limits only (tc tbf): this kernel has no netem, so no delay is added; veth's
own latency is what the links have. Namespaces, bridges and veths are named with a prefix
unique to this run (rc<pid>-...), addresses are from 10.213.0.0/16 inside those namespaces only,
and everything this script created is removed when it exits (also on an error or Ctrl-C); it
never touches anything it did not create. Needs root (ip, tc).

Writes, with --out FILE, a JSON record: the topology as a link graph (nodes, switches, links
with bandwidth in bytes/s and latency in s; the same numbers tc enforces), the spec, the bytes
each node sent on its link over the whole job (node_tx_bytes, fat-tree), and per
step what ringd measured (step_ms, comm_s, ...) on node 0, plus the median step time over the
steps after the first (warm-up), and per rank the share of a core its compute got
(compute_share: the main thread's CPU time over the wall time of its forward and backward
passes less the ring waits, steps after the first; from the workers' `compute cpu` log lines).
All nodes run on this machine's cores, node i's ringd bound to core i mod cores (taskset, as
Slurm binds a job step; ringd places its worker within its binding): that share is what an
emulated node's "GPU" is. A
thread's CPU clock also counts the kernel's interrupt work (the links' token-bucket timers, veth,
bridges, TCP) done while it was the current thread, so the record keeps beside it the share of
the host's busy time spent in interrupts over the same steps (kernel_interrupt_share, /proc/stat
sampled every 0.1 s): the compute got its CPU share times (1 - that).

  bench/emulated_cluster.py --build build --topology fat-tree --nodes 4 --spec SPEC --steps 6
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def tbf_burst(mbit):
    """The token bucket's burst in bytes for a link of mbit (two timer ticks at HZ 250)."""
    return max(64 * 1024, int(mbit * 1e6 / 8 / 250) * 2)


class Cluster:
    """Creates the namespaces and links; remove() undoes exactly what was created."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.namespaces = []
        self.links = []  # the graph record
        self.node_dev = {}  # node index -> the device its UCX uses
        self.node_ns = {}

    def ns(self, name):
        full = f"{self.prefix}-{name}"
        sh("ip", "netns", "add", full)
        self.namespaces.append(full)
        sh("ip", "-n", full, "link", "set", "lo", "up")
        return full

    def veth(self, a_ns, a_dev, b_ns, b_dev):
        sh("ip", "link", "add", a_dev, "type", "veth", "peer", "name", b_dev)
        sh("ip", "link", "set", a_dev, "netns", a_ns)
        sh("ip", "link", "set", b_dev, "netns", b_ns)
        for ns, dev in ((a_ns, a_dev), (b_ns, b_dev)):
            sh("ip", "-n", ns, "link", "set", dev, "up")

    @staticmethod
    def shape(ns, dev, mbit, delay_ms):
        # A token bucket on the device's egress: the rate, a burst of at least one timer tick's
        # worth of bytes (so the rate holds at HZ 250), a queue of 200 ms at the rate (no drops
        # from the emulation itself). This kernel has no netem, so no added delay: the links'
        # latency is veth's own, measured by --probe and recorded instead of --delay-ms.
        burst = tbf_burst(mbit)
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
           "rate", f"{mbit}mbit", "burst", str(burst), "latency", "200ms")

    def link(self, a, b, mbit, delay_ms):
        self.links.append({"a": a, "b": b, "bandwidth_Bps": mbit * 1e6 / 8,
                           "latency_s": delay_ms / 1e3})

    def remove(self):
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)  # deletes its veths (and their peers)
        self.namespaces.clear()


def remove_stale():
    """Namespaces an earlier run of this script left when it was killed (SIGKILL skips the
    clean-up): named rc<pid>-fabric or rc<pid>-n<i>, with <pid> no longer this script."""
    import re
    for line in sh("ip", "netns", "list").stdout.splitlines():
        m = re.match(r"^(rc(\d+)-(fabric|n\d+))\b", line)
        if not m:
            continue
        pid = int(m.group(2))
        try:
            alive = "emulated_cluster" in open(f"/proc/{pid}/cmdline").read()
        except OSError:
            alive = False
        if not alive:
            sh("ip", "netns", "del", m.group(1), check=False)


def build_fat_tree(c, n, leaf_size, node_mbit, uplink_mbit, delay_ms, interleaved=False):
    fab = c.ns("fabric")
    sh("ip", "-n", fab, "link", "add", "root", "type", "bridge")
    sh("ip", "-n", fab, "link", "set", "root", "up")
    leaves = (n + leaf_size - 1) // leaf_size
    p = c.prefix.split("-")[0][-5:]
    for l in range(leaves):
        br = f"leaf{l}"
        sh("ip", "-n", fab, "link", "add", br, "type", "bridge")
        sh("ip", "-n", fab, "link", "set", br, "up")
        up, down = f"{p}u{l}", f"{p}d{l}"
        c.veth(fab, up, fab, down)
        sh("ip", "-n", fab, "link", "set", up, "master", br)
        sh("ip", "-n", fab, "link", "set", down, "master", "root")
        c.shape(fab, up, uplink_mbit, delay_ms)    # leaf -> root
        c.shape(fab, down, uplink_mbit, delay_ms)  # root -> leaf
        c.link(f"leaf{l}", "root", uplink_mbit, delay_ms)
    for i in range(n):
        # interleaved: node i in leaf i mod leaves (names that do not follow the racks, so the
        # natural ring order crosses the root at every hop)
        leaf = i % leaves if interleaved else i // leaf_size
        ns = c.ns(f"n{i}")
        dev, peer = f"{p}n{i}", f"{p}p{i}"
        c.veth(ns, dev, fab, peer)
        sh("ip", "-n", fab, "link", "set", peer, "master", f"leaf{leaf}")
        sh("ip", "-n", ns, "addr", "add", f"10.213.0.{i + 1}/24", "dev", dev)
        c.shape(ns, dev, node_mbit, delay_ms)   # node -> leaf
        c.shape(fab, peer, node_mbit, delay_ms)  # leaf -> node
        c.link(f"node{i}", f"leaf{leaf}", node_mbit, delay_ms)
        c.node_dev[i], c.node_ns[i] = dev, ns


def build_ring(c, n, node_mbit, delay_ms):
    p = c.prefix.split("-")[0][-5:]
    nss = [c.ns(f"n{i}") for i in range(n)]
    for i in range(n):
        sh("ip", "netns", "exec", nss[i], "sysctl", "-qw", "net.ipv4.ip_forward=1")
        c.node_ns[i] = nss[i]
    pairs = [(i, (i + 1) % n) for i in range(n)] if n > 2 else [(0, 1)]
    for i, j in pairs:
        a, b = f"{p}r{i}x{j}", f"{p}r{j}x{i}"
        c.veth(nss[i], a, nss[j], b)
        c.shape(nss[i], a, node_mbit, delay_ms)
        c.shape(nss[j], b, node_mbit, delay_ms)
        c.link(f"node{i}", f"node{j}", node_mbit, delay_ms)
    # Each node's one address sits on its link to the next node (UCX uses that device); the
    # links are otherwise unnumbered, and every node routes the shortest way round the ring,
    # through the neighbour on that side (which forwards).
    for i in range(n):
        dev = f"{p}r{i}x{(i + 1) % n}" if n > 2 or i == 0 else f"{p}r1x0"
        sh("ip", "-n", nss[i], "addr", "add", f"10.213.0.{i + 1}/32", "dev", dev)
        c.node_dev[i] = dev
    for i in range(n):
        for k in range(n):
            if k == i:
                continue
            fwd = (k - i) % n
            j = (i + 1) % n if fwd <= n - fwd else (i - 1) % n
            dev = f"{p}r{i}x{j}"
            via = [] if j == k else ["via", f"10.213.0.{j + 1}", "onlink"]
            sh("ip", "-n", nss[i], "route", "add", f"10.213.0.{k + 1}/32", *via, "dev", dev,
               "src", f"10.213.0.{i + 1}")


def node_tx_bytes(c, n):
    """Bytes each node has sent on its link to the fabric (the veth's tx counter, frames as the
    kernel counts them: payload plus TCP/IP/Ethernet headers); None where a node has no single
    device (the ring topology)."""
    out = []
    for i in range(n):
        dev = c.node_dev.get(i)
        if not dev:
            out.append(None)
            continue
        r = sh("ip", "netns", "exec", c.node_ns[i], "cat", f"/sys/class/net/{dev}/statistics/tx_bytes")
        out.append(int(r.stdout.strip()))
    return out


def run_job(args, c, work):
    ringd = os.path.join(args.build, "daemon", "ringd", "ringd")
    worker = os.path.join(args.build, "worker", "ring-worker")
    job = os.path.join(work, "job")
    procs = []
    cores = sorted(os.sched_getaffinity(0))
    for i in range(args.nodes):
        env = dict(os.environ, UCX_TLS="tcp,self,posix")
        if c.node_dev[i]:
            env["UCX_NET_DEVICES"] = c.node_dev[i]
        # Each node's daemon bound to its own core (node i: core i mod cores), as Slurm binds a
        # job step: ringd places its worker within that binding, so the emulated nodes spread
        # over the machine's cores instead of all pinning their workers to core 0.
        cmd = ["ip", "netns", "exec", c.node_ns[i], "taskset", "-c", str(cores[i % len(cores)]), ringd,
               "--spec", args.spec, "--job-dir", job,
               "--json", "--worker-threads", "1", "--worker-bin", worker, "--threads", "1",
               "--nodes", str(args.nodes), "--node-rank", str(i), "--rendezvous",
               os.path.join(work, "rdv"), "--steps", str(args.steps)]
        out = open(os.path.join(work, f"ringd-{i}.out"), "w")
        err = open(os.path.join(work, f"ringd-{i}.err"), "w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=err,
                                      start_new_session=True))
    deadline = time.time() + args.timeout
    codes = [None] * len(procs)
    cpu_samples = []  # (monotonic ns, /proc/stat's host-wide CPU counters): kernel_share()
    while time.time() < deadline and any(x is None for x in codes):
        codes = [p.poll() for p in procs]
        cpu_samples.append(proc_stat_sample())
        time.sleep(0.1)
    cpu_samples.append(proc_stat_sample())
    with open(os.path.join(work, "cpu-samples.json"), "w") as f:
        json.dump(cpu_samples, f)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if any(x != 0 for x in codes):
        tails = "".join(open(os.path.join(work, f"ringd-{i}.{k}")).read()[-1500:]
                        for i in range(len(procs)) for k in ("err", "out"))
        raise RuntimeError(f"ringd exit codes {codes}:\n{tails}")
    return [json.loads(l) for l in open(os.path.join(job, "steps.jsonl")) if l.strip()]


def proc_stat_sample():
    """(CLOCK_MONOTONIC ns, the host's CPU time in ticks: busy in threads (user, nice,
    system), in interrupts (irq, softirq), idle (idle, iowait)) from /proc/stat's first line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    user, nice, system, idle, iowait, irq, softirq = v
    return [time.monotonic_ns(), user + nice + system, irq + softirq, idle + iowait]


def kernel_share(samples, timeline_dir, first_step=2):
    """The share of the host's busy CPU time that the kernel spent in interrupts (irq and
    softirq: the tc token buckets' timers, veth, the bridges and TCP of every emulated link)
    over the steps from first_step on (their span from the timelines' `step` records, same
    clock). The kernel charges that time to whichever thread it interrupted (thread CPU clocks
    include it), which on these busy cores is mostly a rank's compute: a compute thread's CPU
    time is this share larger than the CPU its compute got. /proc/stat samples it per tick."""
    begin, end = None, None
    for name in os.listdir(timeline_dir) if os.path.isdir(timeline_dir) else []:
        for i, line in enumerate(open(os.path.join(timeline_dir, name))):
            if i == 0:
                continue
            r = json.loads(line)
            if r[2] == "step" and r[1] >= first_step:
                begin = r[6] if begin is None else min(begin, r[6])
                end = r[7] if end is None else max(end, r[7])
    if begin is None or len(samples) < 2:
        return None
    inside = [s for s in samples if begin <= s[0] <= end]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    busy, intr = b[1] - a[1], b[2] - a[2]
    return intr / (busy + intr) if busy + intr > 0 else None


def compute_share(job):
    """The share of a core each rank's compute got: from every worker log's `compute cpu`
    line (per step, the passes' wall time less the ring waits and the main thread's CPU time in
    it), CPU / wall summed over the steps after the first, per rank."""
    import glob
    import re
    per_rank = {}
    for log in glob.glob(os.path.join(job, "logs", "worker-*.log")):
        for line in open(log, errors="replace"):
            m = re.search(r"compute cpu (\{.*\})", line)
            if not m:
                continue
            j = json.loads(m.group(1))
            rows = [(w, c) for s, w, c in zip(j["step"], j["wall_s"], j["cpu_s"]) if s >= 2]
            wall, cpu = sum(w for w, _ in rows), sum(c for _, c in rows)
            if wall > 0:
                per_rank[j["rank"]] = cpu / wall
    return [per_rank[r] for r in sorted(per_rank)]


def graph_yaml(c, n, delay_ms):
    """The emulated cluster as a `ringctl simulate --topology FILE` graph: nodes node0.., the
    fabric's bridges as switches, every tc-limited link with its rate (duplex: both directions
    are limited alike) and the latency to assume."""
    switches = sorted({x for l in c.links for x in (l["a"], l["b"]) if not x.startswith("node")})
    out = ["# written by bench/emulated_cluster.py: the links tc enforces; every node runs on",
           "# this one machine, whose cores its ringd and workers share", "gpus_per_node: 1",
           f"host_cores: {os.cpu_count()}",
           f"nodes: [{', '.join(f'node{i}' for i in range(n))}]"]
    if switches:
        out.append(f"switches: [{', '.join(switches)}]")
    out.append("links:")
    for l in c.links:
        out.append(f"  - {{from: {l['a']}, to: {l['b']}, gbytes_per_s: {l['bandwidth_Bps'] / 1e9:.6g}, "
                   f"latency_us: {delay_ms * 1e3:.6g}}}")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--topology", choices=["fat-tree", "ring"], default="fat-tree")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--leaf-size", type=int, default=2)
    ap.add_argument("--interleaved", action="store_true",
                    help="fat-tree: node i in leaf i mod leaves (natural order crosses the root)")
    ap.add_argument("--node-mbit", type=float, default=400)
    ap.add_argument("--uplink-mbit", type=float, default=200)
    ap.add_argument("--delay-ms", type=float, default=0.02,
                    help="the links' latency to record (not enforced: veth's own)")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out")
    ap.add_argument("--graph-out", help="write the link graph for ringctl simulate --topology")
    ap.add_argument("--timeline-out", help="copy the job's per-node timelines (node-K.jsonl) here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("emulated_cluster: needs root (network namespaces, tc)", file=sys.stderr)
        return 77
    if args.nodes < 2 or args.nodes > 32:
        print("emulated_cluster: --nodes must be in [2, 32]", file=sys.stderr)
        return 2
    remove_stale()
    c = Cluster(f"rc{os.getpid()}")
    work = tempfile.mkdtemp(prefix="emulated-cluster-")
    keep = os.environ.get("KEEP")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.topology == "fat-tree":
            build_fat_tree(c, args.nodes, args.leaf_size, args.node_mbit, args.uplink_mbit,
                           args.delay_ms, args.interleaved)
        else:
            build_ring(c, args.nodes, args.node_mbit, args.delay_ms)
        tx0 = node_tx_bytes(c, args.nodes)
        steps = run_job(args, c, work)
        tx1 = node_tx_bytes(c, args.nodes)
        tx = [None if a is None else b - a for a, b in zip(tx0, tx1)]
        share = compute_share(os.path.join(work, "job"))
        kshare = kernel_share(json.load(open(os.path.join(work, "cpu-samples.json"))),
                              os.path.join(work, "job", "timeline"))
        if args.timeline_out:
            os.makedirs(args.timeline_out, mode=0o700, exist_ok=True)
            src = os.path.join(work, "job", "timeline")
            for f in sorted(os.listdir(src)) if os.path.isdir(src) else []:
                shutil.copyfile(os.path.join(src, f), os.path.join(args.timeline_out, f))
    finally:
        c.remove()
    if args.graph_out:
        open(args.graph_out, "w").write(graph_yaml(c, args.nodes, args.delay_ms))
    times = [s["step_ms"] / 1e3 for s in steps[1:]]
    rec = {"topology": args.topology, "nodes": args.nodes, "leaf_size": args.leaf_size,
           "node_mbit": args.node_mbit, "uplink_mbit": args.uplink_mbit,
           "delay_ms": args.delay_ms, "spec": os.path.abspath(args.spec),
           "graph": {"links": c.links}, "steps": steps, "compute_share": share,
           "kernel_interrupt_share": kshare, "node_tx_bytes": tx,
           "median_step_s": statistics.median(times) if times else None}
    print(f"{args.topology} x{args.nodes}: median step {rec['median_step_s'] * 1e3:.1f} ms "
          f"over {len(times)} steps (first excluded); comm_s median "
          f"{statistics.median(s['comm_s'] for s in steps[1:]) * 1e3:.1f} ms")
    if args.out:
        json.dump(rec, open(args.out, "w"), indent=1)
    if not keep:
        subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
