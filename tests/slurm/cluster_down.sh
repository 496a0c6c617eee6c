#!/usr/bin/env bash
# Fixture cleanup (slurm_cluster_down): tear the cluster down and check that every daemon it
# started is gone (by the pids in its pid files), no slurmstepd of it is left, its ports are
# free, and a second `down` is a no-op.
source "$(dirname "$0")/common.bash"
skip_unless_cluster_possible
[ -d "$RING_SLURM_STATE/run" ] || { echo "no cluster in $RING_SLURM_STATE"; exit 0; }
pids=() names=()
for f in "$RING_SLURM_STATE"/run/*.pid; do
  [ -s "$f" ] || continue
  pids+=("$(cat "$f")"); names+=("$(basename "$f" .pid)")
done
ports=$(grep -oE 'Port=[0-9]+' "$RING_SLURM_STATE/etc/slurm.conf" | cut -d= -f2 | sort -u | tr '\n' ' ')
stepds_before=$(ps -eo pid=,comm= | awk '$2 == "slurmstepd" {print $1}' | tr '\n' ' ')

# keep the logs when a test failed: purge only when nothing is left to look at
run "$CLUSTER" down --state-dir "$RING_SLURM_STATE"
echo "$output"
assert_succeeds "cluster.sh down"
check "down stopped ${#pids[@]} daemons (${names[*]})" [ "${#pids[@]}" -ge 4 ]
for i in "${!pids[@]}"; do
  if kill -0 "${pids[$i]}" 2>/dev/null; then bad "${names[$i]} (pid ${pids[$i]}) still alive"; else ok "${names[$i]} (pid ${pids[$i]}) gone"; fi
done
left=""
for p in $stepds_before; do
  case $(readlink "/proc/$p/cwd" 2>/dev/null) in "$RING_SLURM_STATE"/*) left+=" $p" ;; esac
done
assert_eq "no slurmstepd of this cluster left" "" "$left"
busy=""
for p in $ports; do
  hex=$(printf '%04X' "$p")
  awk -v h="$hex" 'FNR > 1 && $4 == "0A" { n = split($2, a, ":"); if (a[n] == h) f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null && busy+=" $p"
done
assert_eq "ports ($ports) no longer listening" "" "$busy"
run "$CLUSTER" down --state-dir "$RING_SLURM_STATE"
assert_succeeds "a second down is a no-op"
run "$CLUSTER" status --state-dir "$RING_SLURM_STATE"
assert_fails "status reports the cluster down"
if finish; then rm -rf "$RING_SLURM_STATE"; exit 0; fi
echo "logs kept in $RING_SLURM_STATE/log"
exit 1
