#!/usr/bin/env bash
# Time (wall and user CPU) and peak memory of `ringctl simulate` for one step of a 16,384-GPU job and smaller ones:
# configs/examples/70b-1m-64x8-h100.yaml (rings of 64 GPUs) on 8, 64, 256 and 2,048 nodes x 8
# (64, 512, 2,048, 16,384 GPUs), on each built-in topology. Wall seconds and peak RSS
# (/usr/bin/time -v), median and min..max over REPS runs, and each size's time as a ratio to the
# 64-GPU run of the same topology measured in the same run. Target: 16,384 GPUs in <= 10 s and
# <= 2 GiB on 2 cores.
#   bench/sim_scale.sh [SPEC]        REPS=3 by default; RINGCTL=path/to/ringctl
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ringctl=${RINGCTL:-$root/build/cli/ringctl}
spec=${1:-$root/configs/examples/70b-1m-64x8-h100.yaml}
reps=${REPS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-11s %6s %8s  %-22s %-10s %-22s %s\n' topology GPUs tasks "seconds (min..max)" "user s" "peak RSS MiB (max)" "x 64-GPU time"
for topo in fat-tree dragonfly+ torus3d; do
  base=""
  for nodes in 8 64 256 2048; do
    secs=() rss=() user=()
    for ((i = 0; i < reps; i++)); do
      /usr/bin/time -v "$ringctl" simulate "$spec" --topology "$topo" --nodes "$nodes" --json \
        >"$tmp/out.json" 2>"$tmp/time.txt"
      secs+=("$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (k = 1; k <= n; k++) s = s * 60 + p[k]; print s}' "$tmp/time.txt")")
      rss+=("$(awk -F': ' '/Maximum resident set size/ {print $2 / 1024}' "$tmp/time.txt")")
      user+=("$(awk -F': ' '/User time \(seconds\)/ {print $2}' "$tmp/time.txt")")
    done
    tasks=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tasks"])' "$tmp/out.json")
    read -r med lo hi < <(printf '%s\n' "${secs[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)], a[1], a[NR]}')
    rmax=$(printf '%s\n' "${rss[@]}" | sort -g | tail -1)
    umed=$(printf '%s\n' "${user[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
    [[ -z $base ]] && base=$med
    ratio=$(awk -v a="$med" -v b="$base" 'BEGIN {printf "%.1f", (b > 0 ? a / b : 0)}')
    printf '%-11s %6d %8s  %-22s %-10s %-22s %s\n' "$topo" $((nodes * 8)) "$tasks" "$med ($lo..$hi)" "$umed" "$(printf '%.0f' "$rmax")" "$ratio"
  done
done
