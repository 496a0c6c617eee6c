#!/usr/bin/env bash
# Wall time of `ringctl plan --search` on the big examples (configs/examples: the 7B and 70B on
# 64 x 8 H100, the 270B on 64 x 8 H200), each on a fat-tree (the 270B on dragonfly+ too): seconds
# (median and min..max over REPS runs), peak RSS, the layouts screened and simulated, the pick.
# Target (issue 35): the 270B search in < 60 s on this machine (2 cores); exit 1 when missed.
#   bench/plan_search.sh            REPS=3 by default; RINGCTL=path/to/ringctl
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ringctl=${RINGCTL:-$root/build/cli/ringctl}
reps=${REPS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
printf '%-22s %-11s %-22s %8s %9s %9s  %s\n' example topology "seconds (min..max)" "RSS MiB" screened simulated "pick"
for case in "llama7b-1m-64x8-h100 fat-tree" "70b-1m-64x8-h100 fat-tree" \
            "270b-1.2m-64x8-h200 fat-tree" "270b-1.2m-64x8-h200 dragonfly+"; do
  read -r name topo <<<"$case"
  spec=$root/configs/examples/$name.yaml
  secs=() rss=()
  for ((i = 0; i < reps; i++)); do
    /usr/bin/time -v "$ringctl" plan --search "$spec" --topology "$topo" --json \
      >"$tmp/out.json" 2>"$tmp/time.txt"
    secs+=("$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (k = 1; k <= n; k++) s = s * 60 + p[k]; print s}' "$tmp/time.txt")")
    rss+=("$(awk -F': ' '/Maximum resident set size/ {print $2 / 1024}' "$tmp/time.txt")")
  done
  read -r med lo hi < <(printf '%s\n' "${secs[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)], a[1], a[NR]}')
  rmax=$(printf '%s\n' "${rss[@]}" | sort -g | tail -1)
  read -r screened simulated pick < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
b = d["best"][0]
print(d["screened"], d["simulated"], "%s: %.1f s, MFU %.2f %%" % (b["layout"], b["step_s"], 100 * b["mfu"]))' "$tmp/out.json")
  printf '%-22s %-11s %-22s %8.0f %9s %9s  %s\n' "$name" "$topo" "$med ($lo..$hi)" "$rmax" "$screened" "$simulated" "$pick"
  if [[ $name == 270b* ]] && awk -v h="$hi" 'BEGIN {exit !(h >= 60)}'; then
    echo "MISSED: the 270B search took up to $hi s on $topo (target < 60 s)" >&2
    status=1
  fi
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
exit $status
