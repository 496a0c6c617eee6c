#!/usr/bin/env bash
# `ringctl simulate` against a real run on emulated links, at the validation's smallest size:
# bench/sim_validate.py on a 2-node fat-tree (two network namespaces, veth through bridges, tc
# rate limits, one ringd per node over UCX/TCP), the simulator calibrated by bench/sim_calibrate
# and bench/link_probe.py (the transport's cost on one shaped link) just before the run and
# given the CPU share each rank got in it (predicted_s), and calibrated again just after it
# with the host table measured then (predicted_after_s; the load of a shared machine moves
# between the two, and between the steps). Passes when the measured steps from the fastest to
# the median meet the span of the two predictions widened by a factor FACTOR (default 2): other
# work on the machine only slows steps, so the fastest step bounds the job's own time from
# below. With the link model single
# 2-node fat-tree runs came out between -40 % and +43 % under other sessions' load (load average
# 4-10; docs/simulation.md): the calibration and the run, 30 s apart, see different machines.
# This guards the model and the machinery against gross errors (a unit slip, a phase lost); the
# 15 % claim belongs to the benchmark's medians. ctest runs it alone.
# Skips (exit 77) when network namespaces cannot be created.
#   tests/sim/sim_validate_test.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
factor=${FACTOR:-2}
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
/usr/bin/python3 - "$tmp/out.json" "$factor" <<'PY'
import json, sys
cases, factor = json.load(open(sys.argv[1])), float(sys.argv[2])
assert len(cases) == 1 and len(cases[0]["runs"]) == 1, cases
r = cases[0]["runs"][0]
if "failed" in r:
    sys.exit("the emulated run failed: " + r["failed"])
lo = min(r["predicted_s"], r["predicted_after_s"])
hi = max(r["predicted_s"], r["predicted_after_s"])
m, fast = r["measured_s"], min(r["steps_s"])
ok = fast <= hi * factor and m >= lo / factor
print(f"predicted {r['predicted_s']:.3f} s (calibrated before) and {r['predicted_after_s']:.3f} s "
      f"(after); measured median {m:.3f} s, fastest {fast:.3f} s (steps {r['steps_s']}); "
      f"within a factor {factor:g}: {'ok' if ok else 'outside'}; load {r['load']:.1f} / {r['load_after']:.1f}")
for k in ("pred_hop_fwd_s", "meas_hop_fwd_s", "pred_hop_bwd_s", "meas_hop_bwd_s"):
    assert r[k] == r[k] and r[k] > 0, f"{k} missing: {r}"
sys.exit(0 if ok else 1)
PY
