#!/usr/bin/env bash
# slurm_dbd_test: `cluster.sh up --with-dbd` (private MariaDB + slurmdbd) on its own 2-node
# cluster: plain sacct records a job and its steps; down stops all six daemons. Skips when the
# optional packages are missing (slurmdbd slurm-wlm-mysql-plugin mariadb-server).
source "$(dirname "$0")/common.bash"
skip_unless_cluster_possible
command -v slurmdbd >/dev/null 2>&1 && command -v mariadbd >/dev/null 2>&1 &&
  ls /usr/lib/*/slurm-wlm/accounting_storage_mysql.so >/dev/null 2>&1 ||
  { echo "SKIP: slurmdbd, slurm-wlm-mysql-plugin or mariadb-server not installed (optional; slurm/README.md)"; exit 77; }
STATE=${RING_SLURM_STATE}-dbd
export SLURM_CONF=$STATE/etc/slurm.conf
trap '"$CLUSTER" down --state-dir "$STATE" --purge --quiet' EXIT
"$CLUSTER" down --state-dir "$STATE" --purge --quiet

run "$CLUSTER" up --nodes 2 --with-dbd --port-base auto --state-dir "$STATE" --quiet
assert_succeeds "cluster.sh up --with-dbd"
run sacctmgr -n -P show cluster format=cluster
assert_eq "slurmdbd knows the cluster" "ringlocal" "$output"
j=$(sbatch --parsable -N2 -o /dev/null --wrap 'srun true')
assert_eq "job $j" COMPLETED "$(wait_job "$j" 60)"
for ((i = 0; i < 50; i++)); do
  [ "$(sacct -n -P -j "$j" -o jobid,state,nnodes 2>/dev/null | grep -c COMPLETED)" -ge 3 ] && break; sleep 0.2
done
run sacct -n -P -j "$j" -o jobid,state,nnodes
assert_eq "sacct: the job, its batch step and its srun step" "$j|COMPLETED|2 $j.batch|COMPLETED|1 $j.0|COMPLETED|2" \
  "$(echo "$output" | tr '\n' ' ' | sed 's/ $//')"

pids=$(cat "$STATE"/run/*.pid "$STATE"/mysql-run/mariadb.pid 2>/dev/null | tr '\n' ' ')
check "six daemons running ($pids)" [ "$(echo $pids | wc -w)" -ge 5 ]
run "$CLUSTER" down --state-dir "$STATE"
assert_succeeds "down"
left=""
for p in $pids; do kill -0 "$p" 2>/dev/null && left+=" $p"; done
assert_eq "no daemon left (slurmdbd and mariadbd included)" "" "$left"
finish
