#!/usr/bin/env bash
# `ringctl simulate` against a real run on emulated links, at the validation's smallest size:
# bench/sim_validate.py on a 2-node fat-tree (two network namespaces, veth through bridges, tc
# rate limits, one ringd per node over UCX/TCP), the simulator calibrated by bench/sim_calibrate
# just before the run and again just after it (the load of a shared machine moves between the
# two, and between the steps: under load 13 one run's steps took 2.4, 5.5 and 6.6 s). Passes when
# the measured steps from the fastest to the median meet the span of the two predictions widened
# by TOL (default 60 %): other work on the machine only slows steps, so the fastest step bounds
# the job's own time from below. On a quiet machine the model is -41 % (its hops are 1.5x too
# fast there), under load -25..+8 %: this guards the model and the machinery against gross
# regressions; the 15 % claim belongs to the benchmark (docs/simulation.md), which misses it.
# Skips (exit 77) when network namespaces cannot be created.
#   tests/sim/sim_validate_test.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
tol=${TOL:-60}
if [[ $(id -u) != 0 ]]; then
  echo "SKIP: needs root to create network namespaces (ip netns, tc)"; exit 77
fi
for t in ip tc; do
  command -v "$t" > /dev/null || { echo "SKIP: $t (iproute2) is not installed"; exit 77; }
done
probe=rsvt$$
if ! ip netns add "$probe" 2> /dev/null; then
  echo "SKIP: cannot create a network namespace here (a container without CAP_SYS_ADMIN?)"; exit 77
fi
ip netns del "$probe"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$root/bench/sim_validate.py" --build "$build" --nodes 2 --topologies fat-tree \
  --reps 1 --steps 6 --after --json "$tmp/out.json"
/usr/bin/python3 - "$tmp/out.json" "$tol" <<'PY'
import json, sys
cases, tol = json.load(open(sys.argv[1])), float(sys.argv[2])
assert len(cases) == 1 and len(cases[0]["runs"]) == 1, cases
r = cases[0]["runs"][0]
if "failed" in r:
    sys.exit("the emulated run failed: " + r["failed"])
lo = min(r["predicted_s"], r["predicted_after_s"])
hi = max(r["predicted_s"], r["predicted_after_s"])
m, fast = r["measured_s"], min(r["steps_s"])
ok = fast <= hi * (1 + tol / 100) and m >= lo * (1 - tol / 100)
print(f"predicted {r['predicted_s']:.3f} s (calibrated before) and {r['predicted_after_s']:.3f} s "
      f"(after); measured median {m:.3f} s, fastest {fast:.3f} s (steps {r['steps_s']}); "
      f"tolerance {tol:.0f} %: {'ok' if ok else 'outside'}; load {r['load']:.1f} / {r['load_after']:.1f}")
for k in ("pred_hop_fwd_s", "meas_hop_fwd_s", "pred_hop_bwd_s", "meas_hop_bwd_s"):
    assert r[k] == r[k] and r[k] > 0, f"{k} missing: {r}"
sys.exit(0 if ok else 1)
PY
