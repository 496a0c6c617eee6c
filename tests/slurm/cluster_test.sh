#!/usr/bin/env bash
# slurm_cluster_test: the local cluster from slurm/cluster.sh schedules and runs real jobs:
# nodes idle with their fake GPUs, multi-node srun, sbatch to completion (scontrol, sacct -c),
# a failing job recorded as FAILED with its exit code, GPUs handed out as gres, the two
# partitions set up for preemption.
source "$(dirname "$0")/common.bash"
require_cluster
OUT=$(mktemp -d /tmp/ring-slurm-test.XXXXXX)
chmod 0755 "$OUT"
cd "$OUT" || exit 1

# 1. nodes (the slurm tests share the cluster: wait for any node still completing)
all_idle() { [ "$(sinfo -h -N -p low -o %t | sort -u)" = idle ]; }
wait_for 60 all_idle
run sinfo -h -N -o '%N %t %G' -p low
assert_eq "sinfo: three nodes idle with gpu:2" \
  "node1 idle gpu:2 node2 idle gpu:2 node3 idle gpu:2" "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"
run sinfo -h -o '%P %a'
assert_eq "partitions low (default) and high, both up" "high up low* up" "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"
run scontrol show partition low
assert_contains "low: PreemptMode=REQUEUE" "$output" "PreemptMode=REQUEUE"
assert_contains "low: PriorityTier=1" "$output" "PriorityTier=1 "
run scontrol show partition high
assert_contains "high: PriorityTier=10" "$output" "PriorityTier=10"

# 2. srun across nodes: one task on each, each on its own node id
runo srun -N3 -n3 bash -c 'echo $SLURMD_NODENAME:$SLURM_NODEID:$SLURM_NNODES'
assert_succeeds "srun -N3"
assert_eq "srun -N3 runs on node1..3 with node ids 0..2" "node1:0:3 node2:1:3 node3:2:3" \
  "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"
runo srun -N2 hostname
assert_eq "srun -N2 hostname prints two lines" "2" "$(echo "$output" | grep -c .)"

# 3. sbatch with an inner srun, to completion
j=$(sbatch --parsable -N2 --ntasks-per-node=1 -o "$OUT/batch-%j.out" \
  --wrap 'echo batch on $SLURMD_NODENAME; srun bash -c "echo step on \$SLURMD_NODENAME"')
if [[ $j =~ ^[0-9]+$ ]]; then ok "sbatch printed a job id ($j)"; else bad "sbatch printed no job id: $j"; fi
st=$(wait_job "$j" 60)
assert_eq "sbatch job $j state" COMPLETED "$st"
assert_eq "job $j exit code" "0:0" "$(job_field "$j" ExitCode)"
# Which two nodes Slurm picks depends on which are still completing the jobs above: read them.
hosts=($(scontrol show hostnames "$(job_field "$j" NodeList)" 2>/dev/null))
assert_eq "job $j runs on two distinct nodes" "2" "$(printf '%s\n' "${hosts[@]}" | sort -u | grep -c .)"
assert_eq "job $j output: the batch script and one step task per node" \
  "$(printf 'batch on %s|step on %s|step on %s' "${hosts[0]:-}" "${hosts[0]:-}" "${hosts[1]:-}" | tr '|' '\n' | sort | tr '\n' '|' | sed 's/|$//')" \
  "$(sort "$OUT/batch-$j.out" 2>/dev/null | tr '\n' '|' | sed 's/|$//')"
run sacct -c -n -P -o jobid,state,nnodes -j "$j"
assert_contains "sacct -c (jobcomp/filetxt) records job $j" "$output" "$j|COMPLETED|2"

# 4. a failing job is recorded as such
j=$(sbatch --parsable -N1 -o /dev/null --wrap 'exit 3')
st=$(wait_job "$j" 60)
assert_eq "failing job $j state" FAILED "$st"
assert_eq "failing job $j exit code" "3:0" "$(job_field "$j" ExitCode)"

# 5. fake GPUs as gres
run scontrol show node node2
assert_contains "node2 has Gres=gpu:2" "$output" "Gres=gpu:2"
runo srun -N1 -n2 --gpus-per-task=1 bash -c 'echo $CUDA_VISIBLE_DEVICES'
assert_eq "--gpus-per-task=1: each task its own GPU" "0 1" "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"
# The scheduler may pick any two of the three nodes: check two distinct nodes, each with both GPUs.
runo srun -N2 --gpus-per-node=2 bash -c 'echo $SLURMD_NODENAME=$CUDA_VISIBLE_DEVICES'
assert_eq "--gpus-per-node=2: two distinct nodes" "2" "$(echo "$output" | cut -d= -f1 | sort -u | wc -l)"
assert_eq "--gpus-per-node=2: both GPUs on each node" "0,1 0,1" "$(echo "$output" | cut -d= -f2 | sort | tr '\n' ' ' | sed 's/ $//')"
run srun -N1 --gpus-per-node=3 true
assert_fails "--gpus-per-node=3 is refused (only 2 per node)"

# 6. preemption: a "high" job needing every CPU requeues the running "low" job, which gets
#    SIGTERM, goes back to the queue (Restarts=1) and starts again (SLURM_RESTART_COUNT=1)
cat >"$OUT/low.sh" <<'SH'
#!/bin/bash
echo "low start restart=${SLURM_RESTART_COUNT:-0}"
trap 'echo "low got TERM"; exit 0' TERM
while true; do sleep 0.2; done
SH
lo=$(sbatch --parsable -p low -N3 --ntasks-per-node=2 --open-mode=append -o "$OUT/low-%j.out" "$OUT/low.sh")
for ((i = 0; i < 150; i++)); do [ "$(job_field "$lo" JobState)" = RUNNING ] && break; sleep 0.2; done
t0=$SECONDS
hi=$(sbatch --parsable -p high -N3 --ntasks-per-node=2 -o "$OUT/high-%j.out" --wrap 'echo high ran')
assert_eq "high job $hi preempts and completes" COMPLETED "$(wait_job "$hi" 60)"
for ((i = 0; i < 300; i++)); do grep -q 'restart=1' "$OUT/low-$lo.out" 2>/dev/null && break; sleep 0.2; done
assert_eq "low job $lo: TERM, requeued, started again $((SECONDS - t0)) s later" \
  "low start restart=0|low got TERM|low start restart=1" "$(grep '^low ' "$OUT/low-$lo.out" 2>/dev/null | tr '\n' '|' | sed 's/|$//')"
assert_contains "  ... Slurm's reason in its output" "$(cat "$OUT/low-$lo.out" 2>/dev/null)" "DUE TO PREEMPTION"
assert_eq "low job $lo Restarts" 1 "$(job_field "$lo" Restarts)"
scancel "$lo"
assert_eq "low job $lo cancelled" CANCELLED "$(wait_job "$lo" 30)"

# 7. cluster.sh itself: idempotent up, clear refusals, nothing started on a refusal
run "$CLUSTER" up --nodes 3 --gpus-per-node 2 --state-dir "$RING_SLURM_STATE"
assert_succeeds "up again with the same shape"
assert_contains "  ... is a no-op" "$output" "already up in $RING_SLURM_STATE"
run "$CLUSTER" up --nodes 2 --state-dir "$RING_SLURM_STATE"
assert_fails "up with another shape over a running cluster"
assert_contains "  ... says so" "$output" "a cluster is already running in $RING_SLURM_STATE (3 nodes, gpus 2)"
ctld_port=$(sed -n 's/^SlurmctldPort=//p' "$RING_SLURM_STATE/etc/slurm.conf")
run "$CLUSTER" up --nodes 2 --state-dir "$OUT/other" --port-base "$ctld_port"
assert_fails "up on a port in use"
assert_contains "  ... names the port" "$output" "TCP port(s) $ctld_port"
check "  ... and started nothing" [ ! -e "$OUT/other/run/slurmctld.pid" ]
run "$CLUSTER" up --nodes 0 --state-dir "$OUT/other"
assert_contains "--nodes 0 is refused" "$output" "--nodes must be 1-32, got '0'"
run "$CLUSTER" frobnicate
assert_contains "unknown command" "$output" "unknown command 'frobnicate'"
run "$CLUSTER" env --state-dir "$RING_SLURM_STATE"
assert_contains "env prints SLURM_CONF" "$output" "export SLURM_CONF=$RING_SLURM_STATE/etc/slurm.conf"

# 8. the queue is empty again
assert_eq "no job left in the queue" "" "$(squeue -h -o %i)"

rm -rf "$OUT"
finish
