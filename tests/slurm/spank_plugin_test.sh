#!/usr/bin/env bash
# spank_plugin_test: spank_ringmaster.so on the local cluster. Options in srun/sbatch --help;
# each task sees the RING_* variables with the right values on each node; bad option values
# and bad plugstack.conf arguments give a clear error naming the option/argument and the rule,
# and the step does not start (a marker file the step would create stays absent); slurmd
# keeps running with a bad plugstack.conf; only the SPANK symbols are exported.
source "$(dirname "$0")/common.bash"
require_cluster
[ -n "${RING_SPANK_SO:-}" ] && [ -f "$RING_SPANK_SO" ] || { echo "SKIP: spank_ringmaster.so not built"; exit 77; }
OUT=$(mktemp -d /tmp/ring-spank-test.XXXXXX)
chmod 0755 "$OUT"
cd "$OUT" || exit 1
plugstack() {   # plugstack [ARGS]: re-render plugstack.conf (read afresh by every srun/step)
  "$CLUSTER" plugstack --quiet --state-dir "$RING_SLURM_STATE" --spank "$RING_SPANK_SO" --spank-args "$*"
}
trap 'plugstack; rm -rf "$OUT"' EXIT
plugstack

# 1. exported symbols
run nm -D --defined-only "$RING_SPANK_SO"
assert_eq "nm -D: only the SPANK symbols are exported" \
  "plugin_name plugin_type plugin_version slurm_spank_init slurm_spank_init_post_opt slurm_spank_local_user_init slurm_spank_task_init" \
  "$(echo "$output" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' | sort | tr '\n' ' ' | sed 's/ $//')"

# 2. options in --help
run srun --help
assert_contains "srun --help: --ring-job=ID" "$output" "--ring-job=ID"
assert_contains "srun --help: --ring-order=ORDER" "$output" "--ring-order=ORDER"
assert_contains "srun --help: --ring-coord=ENDPOINT" "$output" "--ring-coord=ENDPOINT"
assert_contains "srun --help: help text" "$output" "ringmaster job id"
run sbatch --help
assert_contains "sbatch --help: --ring-job=ID" "$output" "--ring-job=ID"
assert_contains "sbatch --help: --ring-order=ORDER" "$output" "--ring-order=ORDER"

# 3. exported variables, per task and node
show='echo $SLURMD_NODENAME job=$RING_JOB_ID coord=$RING_COORD order=$RING_RING_ORDER pos=${RING_RING_POS-unset} rank=$RING_NODE_RANK/$SLURM_NODEID n=$RING_NUM_NODES local=$RING_LOCAL_RANK/$SLURM_LOCALID gpu=$RING_GPU/$CUDA_VISIBLE_DEVICES ord=$RING_GPU_ORDINAL'
runo srun -N3 -n6 --ntasks-per-node=2 --gpus-per-task=1 --ring-job=tj-1 --ring-order=list:2,0,1 \
  --ring-coord=tcp://127.0.0.1:5555 bash -c "$show"
assert_succeeds "srun with --ring-job/--ring-order/--ring-coord"
expect=""
for t in "node1 0 1" "node2 1 2" "node3 2 0"; do
  set -- $t
  for l in 0 1; do
    expect+="$1 job=tj-1 coord=tcp://127.0.0.1:5555 order=list:2,0,1 pos=$3 rank=$2/$2 n=3 local=$l/$l gpu=$l/$l ord=0|"
  done
done
assert_eq "RING_* on each of 6 tasks (list order: node3 first)" "${expect%|}" \
  "$(echo "$output" | sort | tr '\n' '|' | sed 's/|$//')"

# a node-wide GPU set: tasks of a node pick distinct GPUs, RING_GPUS lists them all
runo srun -N1 -n2 --gpus-per-node=2 --ring-job=tj-2 --ring-coord=ipc:///tmp/rc.sock \
  bash -c 'echo $RING_LOCAL_RANK:$RING_GPU:$RING_GPU_ORDINAL:$RING_GPUS'
assert_eq "shared GPUs: task r gets GPU r, RING_GPUS=0,1" "0:0:0:0,1 1:1:1:0,1" "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"
runo srun -N1 --ring-job=tj-3 --ring-coord=ipc:///tmp/rc.sock bash -c 'echo $RING_GPU:$RING_GPU_ORDINAL:[$RING_GPUS]'
assert_eq "no GPU requested: RING_GPU=none" "none:-1:[]" "$output"

# defaults from plugstack.conf; topology order has no position
plugstack default_coord=ipc:///run/ring/coord.sock
runo srun -N2 --ring-job=tj-4 bash -c 'echo $SLURM_NODEID $RING_COORD $RING_RING_ORDER ${RING_RING_POS-unset}'
assert_eq "default_coord and topology order" "0 ipc:///run/ring/coord.sock topology unset|1 ipc:///run/ring/coord.sock topology unset" \
  "$(echo "$output" | sort | tr '\n' '|' | sed 's/|$//')"
runo srun -N2 --ring-job=tj-5 --ring-order=natural bash -c 'echo $SLURM_NODEID:$RING_RING_POS'
assert_eq "natural order: position = node rank" "0:0 1:1" "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"
runo srun -N2 bash -c 'echo [${RING_JOB_ID-}${RING_COORD-}${RING_NODE_RANK-}${RING_GPU-}]'
assert_eq "without --ring-job nothing is exported" "[] []" "$(echo "$output" | tr '\n' ' ' | sed 's/ $//')"

# sbatch: options reach the batch script's steps
j=$(sbatch --parsable -N2 --ring-job=sb-1 --ring-order=slurm -o "$OUT/sb-%j.out" \
  --wrap 'srun bash -c "echo \$SLURMD_NODENAME \$RING_JOB_ID \$RING_NODE_RANK \$RING_RING_ORDER \$RING_COORD"')
st=$(wait_job "$j" 60)
assert_eq "sbatch --ring-job job $j" COMPLETED "$st"
# (the two nodes are whichever Slurm picked; node rank 0 is the first of the job's node list)
hosts=($(scontrol show hostnames "$(job_field "$j" NodeList)" 2>/dev/null))
assert_eq "sbatch: each node's task sees the job's options" \
  "${hosts[0]:-?} sb-1 0 slurm ipc:///run/ring/coord.sock|${hosts[1]:-?} sb-1 1 slurm ipc:///run/ring/coord.sock" \
  "$(sort -k3,3n "$OUT/sb-$j.out" 2>/dev/null | tr '\n' '|' | sed 's/|$//')"
plugstack

# 4. bad option values: a clear error, and the step does not start
bad_option() {   # bad_option EXPECTED_MESSAGE SRUN_ARGS...
  local want=$1; shift
  rm -f "$OUT/started"
  run srun -N2 "$@" touch "$OUT/started"
  assert_fails "srun $* is refused"
  assert_contains "  ... message" "$output" "$want"
  check "  ... the step did not start" [ ! -e "$OUT/started" ]
}
C=--ring-coord=ipc:///tmp/rc.sock
bad_option "ringmaster: --ring-job=bad id!: character 4 is not one of [A-Za-z0-9._-]" "--ring-job=bad id!" $C
bad_option "ringmaster: --ring-job=-x: must start with a letter or digit" --ring-job=-x $C
bad_option "ringmaster: --ring-order=bogus: must be topology, slurm, natural or list:I,J,..." --ring-job=j --ring-order=bogus $C
bad_option "ringmaster: --ring-order=list:0,0: list: rank 0 appears twice" --ring-job=j --ring-order=list:0,0 $C
bad_option "ringmaster: --ring-order=list:0,2: list: entry 2 (2) is out of range" --ring-job=j --ring-order=list:0,2 $C
bad_option "ringmaster: --ring-order: list: names 3 node(s) but the step runs on 2" --ring-job=j --ring-order=list:0,1,2 $C
bad_option "ringmaster: --ring-coord=http://h:1: must be ipc:///absolute/path or tcp://host:port" --ring-job=j --ring-coord=http://h:1
bad_option "ringmaster: --ring-coord=tcp://head:0: port 0 is outside 1-65535" --ring-job=j --ring-coord=tcp://head:0
bad_option "ringmaster: --ring-coord=ipc://rel/path: ipc:// needs an absolute path" --ring-job=j --ring-coord=ipc://rel/path
bad_option "ringmaster: --ring-order needs --ring-job=ID" --ring-order=natural
bad_option "ringmaster: --ring-job=j needs a coordinator: give --ring-coord=ENDPOINT" --ring-job=j
run sbatch --parsable -N1 --ring-job=j --ring-order=bogus $C --wrap "touch $OUT/started"
assert_fails "sbatch --ring-order=bogus is refused"
assert_contains "  ... message" "$output" "sbatch: error: ringmaster: --ring-order=bogus: must be topology"
assert_not_contains "  ... no job id printed" "$output" "Submitted"
plugstack allow_tcp=0
bad_option "ringmaster: --ring-coord=tcp://head:5555: tcp:// endpoints are disabled on this cluster (plugstack.conf allow_tcp=0)" \
  --ring-job=j --ring-coord=tcp://head:5555
runo srun -N1 --ring-job=j $C bash -c 'echo $RING_COORD'
assert_eq "allow_tcp=0 still accepts ipc://" "ipc:///tmp/rc.sock" "$output"

# 5. bad plugstack.conf arguments: reported clearly, nothing starts, daemons unharmed
bad_plugstack() {   # bad_plugstack EXPECTED_MESSAGE ARGS...
  local want=$1; shift
  plugstack "$@"
  rm -f "$OUT/started"
  run srun -N1 touch "$OUT/started"
  assert_fails "plugstack '$*': srun is refused"
  assert_contains "  ... message" "$output" "$want"
  check "  ... the step did not start" [ ! -e "$OUT/started" ]
}
bad_plugstack "ringmaster: plugstack.conf: unknown argument 'colour' (known: default_coord=ENDPOINT, allow_tcp=0|1)" colour=blue
bad_plugstack "ringmaster: plugstack.conf: allow_tcp=yes: must be 0 or 1" allow_tcp=yes
bad_plugstack "ringmaster: plugstack.conf: argument 'default_coord' is not key=value" default_coord
bad_plugstack "ringmaster: plugstack.conf: allow_tcp is given twice" allow_tcp=1 allow_tcp=0
bad_plugstack "ringmaster: plugstack.conf: default_coord=tcp://h:1: tcp:// endpoints are disabled" default_coord=tcp://h:1 allow_tcp=0
run sbatch -N1 --wrap true
assert_fails "bad plugstack: sbatch is refused"
assert_contains "  ... message" "$output" "sbatch: error: ringmaster: plugstack.conf: default_coord=tcp://h:1: tcp:// endpoints are disabled"

# ... but only on the submitting side: a node that finds bad arguments when a job is already
# on its way runs plain steps, refuses ringmaster steps, and is not drained.
# Held at submission, released once the node's plugstack.conf is bad: no race with the start.
plugstack default_coord=ipc:///tmp/rc.sock
j1=$(sbatch --parsable -N1 -w node3 --hold -o "$OUT/plain-%j.out" --wrap 'echo plain ran')
j2=$(sbatch --parsable -N1 -w node3 --hold --ring-job=late -o "$OUT/ring-%j.out" --wrap 'echo ring ran')
plugstack colour=blue
scontrol release "$j1" "$j2"
st1=$(wait_job "$j1" 60) st2=$(wait_job "$j2" 60)
assert_eq "node-side bad plugstack: plain job $j1" COMPLETED "$st1"
assert_eq "  ... its output" "plain ran" "$(cat "$OUT/plain-$j1.out" 2>/dev/null)"
assert_eq "node-side bad plugstack: ringmaster job $j2" FAILED "$st2"
assert_contains "  ... it says why" "$(cat "$OUT/ring-$j2.out" 2>/dev/null)" \
  "ringmaster: refusing the step: plugstack.conf arguments on this node are invalid: plugstack.conf: unknown argument 'colour'"
assert_not_contains "  ... and did not run" "$(cat "$OUT/ring-$j2.out" 2>/dev/null)" "ring ran"
node3_idle() { [ "$(sinfo -h -N -n node3 -o %t | head -n1)" = idle ]; }
wait_for 30 node3_idle   # (it may still be completing the failed step)
assert_eq "  ... node3 is not drained" "idle" "$(sinfo -h -N -n node3 -o %t | head -n1)"

# slurmd (re)starts with a bad plugstack.conf: it logs the error and keeps running
run "$CLUSTER" node-stop node3 --state-dir "$RING_SLURM_STATE" --quiet
run "$CLUSTER" node-start node3 --state-dir "$RING_SLURM_STATE" --quiet
assert_succeeds "slurmd node3 restarts with a bad plugstack.conf"
wait_for 30 grep -q "ringmaster: plugstack.conf arguments are invalid" "$RING_SLURM_STATE/log/slurmd-node3.log"
sleep 1
pid=$(cat "$RING_SLURM_STATE/run/slurmd-node3.pid" 2>/dev/null)
check "  ... and is still running (pid $pid)" kill -0 "${pid:-0}"
assert_contains "  ... its log says what is wrong" "$(cat "$RING_SLURM_STATE/log/slurmd-node3.log")" \
  "ringmaster: plugstack.conf arguments are invalid (see above): steps on this node will be refused until they are fixed; slurmd keeps running"
plugstack
for ((i = 0; i < 50; i++)); do [ "$(sinfo -h -N -n node3 -o %t | head -n1)" = idle ] && break; sleep 0.2; done
runo srun -N3 --ring-job=after --ring-coord=ipc:///tmp/rc.sock bash -c 'echo $RING_NODE_RANK'
assert_eq "plugstack fixed: ringmaster steps run on all nodes again" "0 1 2" "$(echo "$output" | sort | tr '\n' ' ' | sed 's/ $//')"

finish
