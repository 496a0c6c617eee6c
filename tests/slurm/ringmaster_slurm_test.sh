#!/bin/bash
# ringmaster on the local Slurm cluster: `ringctl submit` of a 2-node job (one ringd
# per node, 2 CPU workers each) with ring-coord as the system of record, then what Slurm does to
# it: completion, `ringctl cancel` (scancel), `ringctl restart` (scontrol requeue) resuming from
# the latest checkpoint, a node whose slurmd dies (Slurm requeues, the job finishes from a
# checkpoint and never runs on that node again) and preemption by the high partition (requeued,
# finishes).
#
# Environment: the cluster fixture's (tests/slurm/CMakeLists.txt) plus RINGCTL, RINGD, RING_COORD_BIN;
# RING_SLURM_KEEP=1 keeps the job dirs (logs, checkpoints) of a passing run too.
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
require_cluster
for b in "${RINGCTL:-}" "${RINGD:-}" "${RING_COORD_BIN:-}"; do
  [ -n "$b" ] && [ -x "$b" ] || { echo "SKIP: ringctl, ringd and ring-coord must be built ($b)"; exit 77; }
done
export UCX_TLS=self,posix,tcp UCX_NET_DEVICES=lo

T=$(mktemp -d /tmp/ring-slurm-XXXXXX)
chmod 755 "$T"
COORD_PID=
cleanup() {
  for j in $(squeue -h -o %i -n slurm-tiny-complete,slurm-tiny-cancel,slurm-tiny-restart,slurm-tiny-preempt,slurm-tiny-nodefail 2>/dev/null); do scancel "$j"; done
  # the crashed node of the node-failure case may be any of them
  for n in node1 node2 node3; do "$CLUSTER" node-start "$n" --state-dir "$RING_SLURM_STATE" >/dev/null 2>&1 || true; done
  [ -n "$COORD_PID" ] && kill "$COORD_PID" 2>/dev/null && wait "$COORD_PID" 2>/dev/null
  # a ringd killed with its node (nodefail) leaves its shared memory behind
  rm -f /dev/shm/ringmaster-slurm-tiny-* 2>/dev/null
  if [ "$T_FAIL" -eq 0 ] && [ -z "${RING_SLURM_KEEP:-}" ]; then rm -rf "$T"; else echo "kept $T for inspection"; fi
}
trap cleanup EXIT

export RING_COORD=ipc://$T/coord/sock/coord.sock
"$RING_COORD_BIN" --state-dir "$T/coord" --endpoint "$RING_COORD" --heartbeat-interval 0.5 \
  --heartbeat-timeout 20 >"$T/coord.log" 2>&1 &
COORD_PID=$!
for _ in $(seq 300); do [ -S "$T/coord/sock/coord.sock" ] && break; sleep 0.1; done
check "ring-coord listens" test -S "$T/coord/sock/coord.sock"

# ringd reports to ring-coord when it can; a ringd built without that runs with --ringd-coord off
# (the Slurm side is the same: ring-coord still records the Slurm id and every start).
RC=on
if grep -aq "reporting to ring-coord is not available" "$RINGD"; then
  RC=off
  echo "note: this ringd does not report to ring-coord yet: submitting with --ringd-coord off"
fi

# mkspec NAME STEPS: the test spec with its own name and step count; RING_SLURM_TEST_NODES
# (default 2) nodes of 2 workers
NN=${RING_SLURM_TEST_NODES:-2}
mkspec() {
  sed -e "s/^  name: slurm-tiny/  name: slurm-tiny-$1/" -e "s/^  steps: 8/  steps: $2/" \
    -e "s/^  nodes: 2/  nodes: $NN/" -e "s/^  context_ranks: 4/  context_ranks: $((2 * NN))/" \
    -e "s|^  dir: checkpoints|  dir: $T/jobs/$1/checkpoints|" \
    "$RING_SOURCE_DIR/tests/slurm/specs/slurm_tiny.yaml" >"$T/$1.yaml"
}
# submit NAME: sets JOB (ring-coord id), SID (Slurm id), JD (job dir). --local-job-dir-ok: the
# job dir is under /tmp, which every node of this one-machine cluster shares.
submit() {
  JD=$T/jobs/$1
  runo "$RINGCTL" submit "$T/$1.yaml" --job-dir "$JD" --local-job-dir-ok --ringd "$RINGD" --ringd-coord "$RC" --json
  JOB=$(printf '%s' "$output" | grep -oE '"job":[0-9]+' | cut -d: -f2)
  SID=$(printf '%s' "$output" | grep -oE '"slurm_job_id":"[0-9]+"' | grep -oE '[0-9]+')
  if [ "$status" -eq 0 ] && [ -n "$JOB" ] && [ -n "$SID" ]; then ok "$1: submitted as ring-coord job $JOB, Slurm job $SID"
  else bad "$1: submit: exit $status: $output $errout"; fi
}
steps_of() { [ -f "$1/steps.jsonl" ] && wc -l <"$1/steps.jsonl" || echo 0; }
last_step() { [ -f "$1/steps.jsonl" ] && tail -n 1 "$1/steps.jsonl" | grep -oE '"step":[0-9]+' | cut -d: -f2 || echo 0; }
latest_ckpt() { ls "$1/checkpoints" 2>/dev/null | grep -oE '^step-[0-9]+$' | sort | tail -n 1 | grep -oE '[0-9]+$' | sed 's/^0*//'; }
# wait_for TIMEOUT_S CMD...: polls every 0.2 s
has_steps() { [ "$(steps_of "$1")" -ge "$2" ]; }
has_ckpt() { local c; c=$(latest_ckpt "$1"); [ -n "$c" ] && [ "$c" -ge "$2" ]; }
slurm_state() { scontrol show job "$1" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2; }
is_state() { [ "$(slurm_state "$1")" = "$2" ]; }
restarts_at_least() { [ "$(job_field "$1" Restarts)" -ge "$2" ] 2>/dev/null; }
no_procs() { ! pgrep -f "$1" >/dev/null; }
coord_field() {   # coord_field JOB KEY: a top-level field of `ringctl status JOB --json`
  "$RINGCTL" status "$1" --json 2>/dev/null |
    python3 -c 'import json,sys; v=json.load(sys.stdin).get(sys.argv[1], ""); print("" if v is None else v)' "$2"
}
coord_is() { [ "$(coord_field "$1" "$2")" = "$3" ]; }

# crash_node NODE SLURMID: what a node failure does to the job: the node's slurmd stops answering
# and every process of the job on it is gone (kill -9 of its slurmstepd, ringd and workers, found
# by SLURM_JOB_ID and SLURMD_NODENAME in their environment).
crash_node() {
  "$CLUSTER" node-stop "$1" --state-dir "$RING_SLURM_STATE" >/dev/null 2>&1
  local p pids=""
  for p in /proc/[0-9]*; do
    [ -r "$p/environ" ] || continue
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "SLURM_JOB_ID=$2" || continue
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "SLURMD_NODENAME=$1" || continue
    pids+=" ${p#/proc/}"
    local pp; pp=$(awk '{print $4}' "$p/stat" 2>/dev/null)
    [[ $(cat "/proc/$pp/comm" 2>/dev/null) == slurmstepd ]] && pids+=" $pp"
  done
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  echo "crashed $1: killed$pids"
}

# --- 1. submit on 2 nodes: completes, loss reported, checkpoints exist ---------------------------
mkspec complete 6
runo "$RINGCTL" submit "$T/complete.yaml" --job-dir "$T/jobs/dry" --local-job-dir-ok --ringd "$RINGD" --dry-run
assert_contains "dry-run prints the script" "$output" "#SBATCH --nodes=$NN"
check "dry-run submits nothing" test ! -e "$T/jobs/dry"
submit complete
assert_eq "complete: ring-coord has the Slurm id" "$SID" "$(coord_field "$JOB" slurm_job_id)"
st=$(wait_job "$SID" 90)
assert_eq "complete: Slurm state" COMPLETED "$st"
assert_eq "complete: last step" 6 "$(last_step "$JD")"
check "complete: steps carry a loss" grep -q '"loss":[0-9]' "$JD/steps.jsonl"
check "complete: checkpoint of step 6" test -d "$JD/checkpoints/step-00000006"
check "complete: Slurm output in the job dir" grep -q "ringd finished on every node" "$JD/slurm-$SID.out"
run "$RINGCTL" status "$JOB"
assert_contains "complete: status shows Slurm's view" "$output" "COMPLETED"
if [ "$RC" = on ]; then
  # (ring-coord hears the end from ringd just before Slurm does: allow for a loaded machine)
  wait_for 20 coord_is "$JOB" state completed || true
  assert_eq "complete: ring-coord state" completed "$(coord_field "$JOB" state)"
  # the loss ring-coord reports is the last step's loss from ringd (steps.jsonl), and the
  # table shows it in the LOSS column
  want=$(tail -n 1 "$JD/steps.jsonl" | python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["loss"])')
  got=$(coord_field "$JOB" loss)
  check "complete: ring-coord has the loss of the last step ($want)" \
    python3 -c 'import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 1e-4)' "${got:-nan}" "$want"
  assert_contains "complete: status table shows the loss" "$output" "$want"
fi
check "complete: no ringd or worker left" wait_for 10 no_procs "$JD"

# --- 2. cancel a running job ---------------------------------------------------------------------
mkspec cancel 400
submit cancel
check "cancel: training started" wait_for 60 has_steps "$JD" 2
run "$RINGCTL" cancel "$JOB"
assert_succeeds "cancel: ringctl cancel"
st=$(wait_job "$SID" 30)
assert_eq "cancel: Slurm state" CANCELLED "$st"
check "cancel: ring-coord shows cancelled" wait_for 20 coord_is "$JOB" state cancelled
check "cancel: no ringd or worker left" wait_for 15 no_procs "$JD"

# --- 3. ringctl restart of a running job resumes from the latest checkpoint ---------------------
mkspec restart 400
submit restart
check "restart: a checkpoint exists" wait_for 60 has_ckpt "$JD" 4
ck=$(latest_ckpt "$JD")
run "$RINGCTL" restart "$JOB"
assert_succeeds "restart: ringctl restart"
check "restart: Slurm requeued it" wait_for 30 restarts_at_least "$SID" 1
check "restart: started again" wait_for 90 grep -q "start 2," "$JD/slurm-$SID.out"
before=$(steps_of "$JD")
check "restart: training goes on" wait_for 60 has_steps "$JD" $((before + 2))
first_new=$(sed -n "$((before + 1))p" "$JD/steps.jsonl" | grep -oE '"step":[0-9]+' | cut -d: -f2)
if [ -n "$first_new" ] && [ "$first_new" -gt 1 ] && [ "$first_new" -ge "$((ck + 1))" ]; then
  ok "restart: resumed at step $first_new (checkpoint $ck at the restart), not from step 1"
else bad "restart: first step after the restart is [$first_new], checkpoint was $ck"; fi
if [ "$RC" = on ]; then check "restart: ring-coord recorded attempt 2" test "$(coord_field "$JOB" attempt)" -ge 2; fi
check "restart: the start is in ring-coord's events" bash -c "'$RINGCTL' events $JOB 2>/dev/null | grep -q slurm_started"
scancel "$SID"; wait_job "$SID" 30 >/dev/null

# --- 4. preemption by the high partition: checkpoint on the signal, requeue, finish ------------
mkspec preempt 200
submit preempt
check "preempt: a checkpoint exists" wait_for 60 has_ckpt "$JD" 4
hi=$(sbatch --parsable -p high -N3 -o "$T/high-%j.out" --wrap "sleep 2" 2>&1)   # needs every node
check "preempt: requeued by the high job" wait_for 30 restarts_at_least "$SID" 1
assert_eq "preempt: high job" COMPLETED "$(wait_job "$hi" 60)"
st=$(wait_job "$SID" 120)
assert_eq "preempt: finished" COMPLETED "$st"
assert_eq "preempt: last step" 200 "$(last_step "$JD")"
# Every ringd takes the SIGTERM as a stop: every node finishes the same step, checkpoints it and
# exits 75 (docs/slurm.md). Slurm 22.05 has no GraceTime for PreemptMode=REQUEUE; the bound is
# its SIGKILL KillWait (5 s) after the SIGTERM.
# (ringd's own log: what reaches slurm-*.out goes through srun, which is being stopped too)
check "preempt: ringd took the signal as a stop" grep -q "Terminated: finishing the step, checkpoint, then stop" "$JD/logs/ringd-0.log" "$JD/logs/ringd-1.log"
# The stop checkpoint: the step node 0 committed after the signal and before the next attempt.
stop_ck=$(awk '/Terminated: finishing the step/ {t = 1} t && /is starting, attempt/ {exit}
  t && /checkpoint step [0-9]+ saved: .*step-[0-9]+( |$)/ {n = $0; sub(/.*checkpoint step /, "", n); sub(/ .*/, "", n)}
  END {print n}' "$JD/logs/ringd-0.log")
stopped=$(grep -oE 'stopped at step [0-9]+ on request' "$JD/logs/ringd-0.log" | head -n 1 | grep -oE '[0-9]+')
resumed=$(grep -oE 'resuming from [^ ]+ \(step [0-9]+\)' "$JD/logs/ringd-0.log" | head -n 1 | grep -oE '[0-9]+\)$' | tr -d ')')
if grep -q "stopped after a checkpoint (exit 75" "$JD/slurm-$SID.out"; then
  # (no new checkpoint when the step the signal stopped at had just had its periodic one)
  echo "note preempt: ringd stopped at step $stopped with its checkpoint${stop_ck:+ (written on the signal)} and exited 75; resumed from step $resumed"
elif [ -n "$stop_ck" ] && [ "$stop_ck" = "$resumed" ]; then
  echo "note preempt: ringd checkpointed step $stop_ck on the signal; Slurm's SIGKILL cut the exit short; resumed from step $resumed"
else
  echo "note preempt: no checkpoint of the stopped step ${stopped:-?}; resumed from step ${resumed:-?}"
fi
stop_step=${stopped:-$stop_ck}
check "preempt: checkpointed on the signal (stopped at step ${stop_step:-?}, resumed from ${resumed:-?})" \
  test -n "$stop_step" -a "$stop_step" = "$resumed"
check "preempt: resumed from a checkpoint" grep -qiE "resum|from step [1-9]" "$JD/logs/ringd-0.log"

# --- 5. one node's slurmd dies: Slurm requeues, the job finishes from a checkpoint, and the node
# never runs the job again (issue 31, point 16): ring-coord excludes it (status, events), and a
# later requeue (`ringctl restart`, with the node back and free) adds it to Slurm's ExcNodeList.
# 3000 steps (about 75 s on two cores): long enough to go on after the failure, the node's return
# and a `ringctl restart`.
mkspec nodefail 3000
submit nodefail
check "nodefail: a checkpoint exists" wait_for 60 has_ckpt "$JD" 2
victim=$(scontrol show hostnames "$(job_field "$SID" NodeList)" | tail -n 1)
crash_node "$victim" "$SID"
check "nodefail: Slurm requeued it after $victim went down" wait_for 60 restarts_at_least "$SID" 1
check "nodefail: started again" wait_for 90 grep -q "start 2," "$JD/slurm-$SID.out"
# ring-coord judges at the start (ringctl slurm-started, after the "start 2" line) with the node
# still down: bring it back only once that start is recorded.
recorded_twice() { [ "$(grep -c "ringmaster: ring-coord job $JOB is " "$JD/slurm-$SID.out")" -ge 2 ]; }
check "nodefail: ring-coord recorded the second start" wait_for 60 recorded_twice
assert_not_contains "nodefail: the second start is not on the dead node" "$(scontrol show hostnames "$(job_field "$SID" NodeList)")" "$victim"
# The node is repaired and returns to service (ReturnToService=2).
"$CLUSTER" node-start "$victim" --state-dir "$RING_SLURM_STATE" >/dev/null 2>&1
check "nodefail: ring-coord excludes $victim" wait_for 30 coord_is "$JOB" excluded_nodes "['$victim']"
check "nodefail: status names it" bash -c "'$RINGCTL' status $JOB | grep -E '^excluded: +$victim '"
check "nodefail: a node_excluded event" bash -c "'$RINGCTL' events $JOB | grep node_excluded | grep -q $victim"
check "nodefail: $victim back" wait_for 40 bash -c "sinfo -h -n $victim -o %t | grep -qE '^(idle|mix)'"
# Slurm would place the requeued job on the lowest free nodes, $victim among them.
runo "$RINGCTL" restart "$JOB"
assert_succeeds "nodefail: ringctl restart"
assert_contains "nodefail: restart excludes $victim" "$output" "ExcNodeList=$victim"
check "nodefail: Slurm's ExcNodeList holds $victim" bash -c "scontrol show job $SID | grep -q 'ExcNodeList=$victim'"
check "nodefail: requeued again" wait_for 60 restarts_at_least "$SID" 2
check "nodefail: started a third time" wait_for 90 grep -q "start 3," "$JD/slurm-$SID.out"
assert_not_contains "nodefail: the third start is not on $victim" "$(scontrol show hostnames "$(job_field "$SID" NodeList)")" "$victim"
st=$(wait_job "$SID" 400)
assert_eq "nodefail: finished" COMPLETED "$st"
assert_eq "nodefail: last step" 3000 "$(last_step "$JD")"
check "nodefail: no ringd or worker left" wait_for 30 no_procs "$JD"

finish
