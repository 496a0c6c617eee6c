#!/usr/bin/env bash
# Chaos trials: kill -9 a random ringmaster process at a random moment of a small job, resume it,
# and check what a user relies on after a crash.
#
#   scripts/chaos.sh                         # 10 trials, random seed
#   scripts/chaos.sh --trials 3 --seed 1     # what the chaos_test ctest runs
#   scripts/chaos.sh --keep                  # keep every trial's directory (default: failed ones)
#   scripts/chaos.sh --scenario restart_from # only that scenario (default: each trial draws one)
#
# Scenarios (each trial draws one; the checks below apply to each unless said):
#   kill          kill -9 of a random process at a random moment (below).
#   restart_from  `ringctl restart 1 --from N` (N: the checkpoint before the newest) right after
#                 a random step among 11-15; the job must complete bit-identical to the reference (a resume
#                 from step N of the same lineage), with a lineage_branched event (check lineage).
#   second_job    a second `ringctl run` of the same spec with the same --job-dir while the first
#                 runs: refused at once naming the holder, the first one unharmed (check second).
#   disk_full     (root) the checkpoint directory is a small tmpfs, filled at a random step: the
#                 checkpoints fail naming ENOSPC, the run ends without losing its newest complete
#                 checkpoint; space freed, --resume completes bit-identical (check diskfull).
#   kv_kill       a generate job (the reference run's weights) whose KV cache spills to a disk
#                 tier; kill -9 of a worker at a random moment of decoding: no page file left in
#                 the disk tier's directory (check kvfiles), no process, segment or socket left.
#
# The job: tests/chaos/chaos.yaml (CPU backend, tiny model, 3 workers, a checkpoint every 5 of 40
# steps, automatic restarts), run with `ringctl run`, which starts its own ring-coord and ringd,
# which starts the workers. One uninterrupted reference run comes first. Each trial then starts
# the same job in a fresh directory (its own coordinator endpoint and state dir, job name
# chaos-<trial tag>), waits for a random moment (in start-up, or after a random step), kills one
# random process among ring-worker, ringd, ring-coord and the `ringctl run` process (kill -9),
# lets the rest react, and runs `ringctl run --resume` until the job completes (at most 3 times).
# Checks per trial (each counted separately in the summary):
#   exact     the final checkpoint's tensors (master weights, optimizer moments, ...) have the
#             same xxh3 as the reference run's (bit-identical), and steps.jsonl reaches the end
#   verify    `ringctl checkpoints DIR --verify` accepts the job's checkpoint directory
#   orphans   no process of the trial (its session, or its directory on the command line) is
#             left once the last run has ended
#   shm       no /dev/shm/ringmaster-chaos-<tag>-* segment is left
#   tmpdirs   no control-socket directory of the trial's ringd processes (read from their
#             listening sockets: <runtime>/ringd/ringd-<pid>, formerly /tmp/ringd-XXXXXX) is left
#   coord     a ring-coord started afterwards on the trial's state dir shows every job of the
#             trial in a terminal state (completed, failed, cancelled, stopped: not pending, starting,
#             running, restarting, completing or cancelling with nothing left running)
# Prints one line per trial and a summary; exit status 1 if any check failed in any trial.
# Nothing here assumes timing: the kill moment is random, every wait polls with a generous
# deadline.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=$(pwd)

trials=10
seed=""
only_scenario=""
all_scenarios="kill restart_from second_job disk_full kv_kill"
build="${RING_BUILD:-$ROOT_DIR/build}"
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) trials="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --scenario) only_scenario="$2"; shift 2 ;;
    *) echo "usage: $0 [--trials N] [--seed S] [--build DIR] [--keep] [--scenario NAME]" >&2; exit 2 ;;
  esac
done
case "$trials" in ''|*[!0-9]*) echo "chaos: --trials must be a number" >&2; exit 2 ;; esac
if [ -n "$only_scenario" ]; then
  case " $all_scenarios " in *" $only_scenario "*) ;; *)
    echo "chaos: --scenario '$only_scenario' is not one of: $all_scenarios" >&2; exit 2 ;; esac
fi
# disk_full mounts a tmpfs: root only (it is left out of the draw otherwise, and said).
if [ "$(id -u)" != 0 ]; then
  all_scenarios="kill restart_from second_job kv_kill"
  [ "$only_scenario" = disk_full ] && { echo "chaos: disk_full needs root (it mounts a tmpfs)" >&2; exit 2; }
fi
[ -n "$seed" ] || seed=$(( $(date +%s) % 100000 ))
RANDOM=$seed

RINGCTL="$build/cli/ringctl"
RING_COORD="$build/coordinator/ring-coord"
for b in "$RINGCTL" "$RING_COORD" "$build/daemon/ringd/ringd" "$build/worker/ring-worker"; do
  [ -x "$b" ] || { echo "chaos: $b is missing: build first (scripts/test.sh or ring_build)" >&2; exit 2; }
done
# CHAOS_SPEC: another job spec of the same shape (e.g. tests/chaos/chaos-bf16.yaml); job.name chaos.
SPEC_TEMPLATE="${CHAOS_SPEC:-$ROOT_DIR/tests/chaos/chaos.yaml}"
STEPS=$(sed -n 's/^  steps: *\([0-9]*\)$/\1/p' "$SPEC_TEMPLATE")
FINAL=$(printf 'step-%08d' "$STEPS")

ROOT=$(mktemp -d /tmp/ring-chaos-XXXXXX)
chmod 0700 "$ROOT"
echo "chaos: seed $seed, $trials trials, directory $ROOT"

log() { echo "chaos: $*"; }
now_ms() { date +%s%3N; }

# The processes of a trial: ringmaster binaries in one of its sessions, or with its directory on
# the command line (a process that left the session still names its job dir, spec or socket).
# Zombies do not count. Prints "pid comm" lines.
trial_procs() {  # $1: sessions (space separated), $2: trial dir
  local pid sid stat comm s m
  while read -r pid sid stat comm; do
    case "$comm" in ringctl|ring-coord|ringd|ring-worker) ;; *) continue ;; esac
    case "$stat" in Z*) continue ;; esac
    m=0
    for s in $1; do [ "$sid" = "$s" ] && m=1; done
    if [ $m = 0 ] && { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "$2/"; then m=1; fi
    [ $m = 1 ] && echo "$pid $comm"
  done < <(ps -eo pid=,sid=,stat=,comm=)
}

# Records the directories of the control sockets of the trial's ringd processes (their listening
# unix sockets) into $T/ringd-dirs, so that leftovers can be checked after the trial.
note_ringd_dirs() {  # $1 sessions, $2 trial dir
  local pid comm inodes
  while read -r pid comm; do
    [ "$comm" = ringd ] || continue
    inodes=$(ls -l "/proc/$pid/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\].*/\1/p' | sort -u)
    [ -n "$inodes" ] || continue
    awk -v ids=" $(echo $inodes) " 'NR > 1 && $8 != "" && index(ids, " " $7 " ") { print $8 }' \
      /proc/net/unix | while read -r path; do
        # Only path names: an abstract socket ("@...", e.g. the transport's) has no directory.
        case "$path" in /*) dirname "$path" ;; esac
      done >>"$2/ringd-dirs"
  done < <(trial_procs "$1" "$2")
  # Workers name ringd's socket on their command line (--ringd PATH): catches a ringd killed
  # between two samples.
  while read -r pid comm; do
    [ "$comm" = ring-worker ] || continue
    { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | awk 'p { print; p = 0 } $0 == "--ringd" { p = 1 }' |
      while read -r path; do case "$path" in /*) dirname "$path" ;; esac; done >>"$2/ringd-dirs"
  done < <(trial_procs "$1" "$2")
}

# Starts `ringctl run` for trial dir $1 in a new session (ringctl's pid is the session id);
# extra arguments follow. A subshell waits for it and writes its exit status to $1/rc, so that
# bash has no killed job of its own to report. Sets RUN_SUB (the subshell) and RUN_PID.
start_run() {
  local t=$1 i; shift
  rm -f "$t/rc"
  ( setsid env RING_COORD="ipc://$t/sock/coord.sock" RING_STATE_DIR="$t/state" \
      UCX_TLS=self,posix UCX_NET_DEVICES=lo NO_COLOR=1 \
      "$RINGCTL" run "$t/spec.yaml" --job-dir "$t/job" "$@" >>"$t/run.out" 2>&1 </dev/null
    echo $? >"$t/rc" ) 2>/dev/null &  # the subshell's own "Killed" report: the trial line says it
  RUN_SUB=$!
  RUN_PID=""
  for i in $(seq 1 1000); do
    RUN_PID=$(ps -o pid= --ppid "$RUN_SUB" | tr -d ' ' | head -n 1)
    [ -n "$RUN_PID" ] || [ ! -d "/proc/$RUN_SUB" ] && break
    sleep 0.01
  done
  [ -n "$RUN_PID" ] && echo "$RUN_PID" >>"$t/sessions"
}

# Whether the run started last is still going.
run_alive() { [ -d "/proc/$RUN_SUB" ] && ! grep -q '^State:.*Z' "/proc/$RUN_SUB/status" 2>/dev/null; }

# Waits for the run to end (deadline $2 s), sampling ringd's socket dirs meanwhile. Sets RUN_RC
# (124: still running at the deadline, then killed).
wait_run() {  # $1 trial dir, $2 deadline s
  local t=$1 end=$(( $(date +%s) + $2 ))
  while run_alive; do
    note_ringd_dirs "$(cat "$t/sessions")" "$t"
    [ -n "${FIRST_STEP_MS-x}" ] || { [ "$(step_lines "$t")" -gt 0 ] && FIRST_STEP_MS=$(now_ms); }
    if [ "$(date +%s)" -ge "$end" ]; then
      [ -n "$RUN_PID" ] && kill -9 "$RUN_PID" 2>/dev/null
      wait "$RUN_SUB" 2>/dev/null
      RUN_RC=124
      return
    fi
    sleep 0.1
  done
  wait "$RUN_SUB" 2>/dev/null
  RUN_RC=$(cat "$t/rc" 2>/dev/null || echo 125)
}

# Waits until no process of the trial is left (deadline $2 s). Returns 1 and prints them if some
# are.
wait_no_procs() {  # $1 trial dir, $2 deadline s
  local t=$1 end=$(( $(date +%s) + $2 )) left
  while :; do
    left=$(trial_procs "$(cat "$t/sessions")" "$t")
    [ -z "$left" ] && return 0
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "$left"
      return 1
    fi
    sleep 0.2
  done
}

# Steps the first run of the trial has reported so far: ringctl flushes one "step N/M" line per
# step (steps.jsonl is written in blocks, too coarse for choosing a moment).
step_lines() {
  local n
  n=$(grep -c '^step [0-9]*/' "$1/run.out" 2>/dev/null)
  echo "${n:-0}"
}

# "name xxh3" per tensor of node 0's shard of checkpoint step dir $1 (empty if unreadable).
tensor_hashes() {
  python3 - "$1/node-00000.json" <<'EOF' 2>/dev/null
import json, sys
for t in json.load(open(sys.argv[1]))["tensors"]:
    print(t["name"], t["xxh3"])
EOF
}

# The states of every job the coordinator of trial dir $1 knows, one per line ("id state").
job_states() {
  env RING_COORD="ipc://$1/sock/coord.sock" "$RINGCTL" status --json --timeout 5 2>/dev/null |
    python3 -c '
import json, sys
d = json.load(sys.stdin)
jobs = d if isinstance(d, list) else d.get("jobs", [])
for j in jobs:
    print(j.get("job"), j.get("state"))
' 2>/dev/null
}

# A ring-coord on the trial's state dir, then every job's state until none is in a live state
# with nothing left running (deadline 60 s: a node the coordinator has not heard from is lost
# after its heartbeat timeout, 10 s by default). Prints the offending "id state" lines and returns 1, or 0.
check_coord() {  # $1 trial dir
  local t=$1 cpid end states bad
  ( exec setsid env RING_STATE_DIR="$t/state" "$RING_COORD" --endpoint "ipc://$t/sock/coord.sock" ) \
    >>"$t/check-coord.log" 2>&1 </dev/null &
  cpid=$!
  echo "$cpid" >>"$t/sessions"
  end=$(( $(date +%s) + 60 ))
  while :; do
    states=$(job_states "$t")
    bad=$(echo "$states" | awk 'NF == 2 && $2 ~ /^(pending|starting|running|restarting|completing|cancelling)$/')
    if [ -n "$states" ] && [ -z "$bad" ]; then break; fi
    if [ "$(date +%s)" -ge "$end" ] || [ ! -d "/proc/$cpid" ]; then
      [ -n "$states" ] || bad="(no answer from ring-coord: $(tail -n 2 "$t/check-coord.log" | tr '\n' ' '))"
      break
    fi
    sleep 1
  done
  kill -TERM "$cpid" 2>/dev/null
  local i
  for i in $(seq 1 300); do [ -d "/proc/$cpid" ] && ! grep -q '^State:.*Z' "/proc/$cpid/status" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$cpid" 2>/dev/null
  wait "$cpid" 2>/dev/null
  if [ -n "$bad" ]; then echo "$bad" | paste -sd, -; return 1; fi
  return 0
}

new_trial_dir() {  # $1 name -> prints the dir
  local t="$ROOT/$1"
  mkdir -p "$t/sock" "$t/job"
  chmod 0700 "$t/sock"
  : >"$t/sessions"
  : >"$t/ringd-dirs"
  sed "s/^  name: chaos$/  name: chaos-$1-$(basename "$ROOT" | cut -d- -f3)/" "$SPEC_TEMPLATE" >"$t/spec.yaml"
  echo "$t"
}

# ---- reference run ---------------------------------------------------------------------------
REF=$(new_trial_dir ref)
t0=$(now_ms)
start_run "$REF"
FIRST_STEP_MS=""
wait_run "$REF" 1800
ref_ms=$(( $(now_ms) - t0 ))
ref_startup_ms=$(( ${FIRST_STEP_MS:-$(now_ms)} - t0 ))
ref_step_ms=$(( (ref_ms - ref_startup_ms) / STEPS ))
if [ "$RUN_RC" != 0 ] || [ ! -d "$REF/job/checkpoints/$FINAL" ]; then
  log "the reference run failed (exit $RUN_RC); see $REF/run.out"
  tail -n 20 "$REF/run.out"
  exit 1
fi
REF_HASHES=$(tensor_hashes "$REF/job/checkpoints/$FINAL")
[ -n "$REF_HASHES" ] || { log "cannot read the reference checkpoint $REF/job/checkpoints/$FINAL"; exit 1; }
wait_no_procs "$REF" 60 >/dev/null || log "warning: processes of the reference run outlived it"
log "reference run: $STEPS steps in $(( ref_ms / 1000 )).$(( ref_ms % 1000 / 100 )) s (start-up $ref_startup_ms ms, then about $ref_step_ms ms a step), $(echo "$REF_HASHES" | wc -l) tensors"

# The size of one checkpoint (disk_full sizes its tmpfs from it).
CKPT_BYTES=$(du -sb "$REF/job/checkpoints/$FINAL" | awk '{print $1}')

# Whether trial dir $1 has a complete checkpoint of its current lineage (else a resume has
# nothing to load and fails, by design: the next run starts afresh instead).
has_checkpoint() {
  env RING_COORD="ipc://$1/sock/coord.sock" "$RINGCTL" checkpoints "$1/job/checkpoints" --json \
      2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if any(c.get("status") == "complete" and c.get("lineage") == "current" for c in d) else 1)
' 2>/dev/null
}

# A generate job over the reference run's weights whose KV cache spills to a disk tier in $1/kv.
write_generate_spec() {  # $1 trial dir, $2 job name
  cat >"$1/gen.yaml" <<EOF
job:
  name: $2
  kind: generate
model:
  layers: 2
  d_model: 128
  heads: 4
  mlp: swiglu
  vocab: 256
generate:
  checkpoint: $REF/job/checkpoints
  prompts: [/usr/share/common-licenses/GPL-3]
  max_new_tokens: 4000
  temperature: 0
  page_tokens: 64
  fast_gb: 0.0001
  host_gb: 0.0000001
  disk_dir: $1/kv
  output: $1/gen.out
parallel:
  context_ranks: 3
resources:
  nodes: 1
  workers_per_node: 3
  backend: cpu
  cpus_per_worker: 1
EOF
}

# ---- trials ----------------------------------------------------------------------------------
checks="completed exact verify orphans shm tmpdirs coord lineage second diskfull kvfiles"
declare -A pass fail
for c in $checks; do pass[$c]=0; fail[$c]=0; done
declare -A killed
declare -A drawn
any_fail=0

for n in $(seq 1 "$trials"); do
  T=$(new_trial_dir "t$n")
  job_name=$(sed -n 's/^  name: //p' "$T/spec.yaml" | head -n 1)
  declare -A res=()
  notes=""
  if [ -n "$only_scenario" ]; then scenario=$only_scenario; else
    nsc=$(echo $all_scenarios | wc -w)
    scenario=$(echo $all_scenarios | tr ' ' '\n' | sed -n "$(( RANDOM % nsc + 1 ))p")
  fi
  drawn[$scenario]=$(( ${drawn[$scenario]:-0} + 1 ))
  for c in lineage second diskfull kvfiles; do res[$c]=skip; done
  mnt=""
  # The moment, chosen uniformly among STEPS: k = 0, a random time within the reference run's
  # start-up (before its first step); else right after step k was reported, plus up to one
  # reference step's time. Counting steps instead of seconds keeps the spread under any load.
  k=$(( RANDOM % STEPS ))
  # The other scenarios act early enough that the job (about 3 s on a quiet machine) is still
  # running: right after step k, k among the first half.
  case "$scenario" in
    restart_from) k=$(( 11 + RANDOM % 5 )) ;;  # a checkpoint past step 10 exists
    disk_full) k=$(( 6 + RANDOM % 5 )) ;;
    second_job) k=$(( 2 + RANDOM % 18 )) ;;  # the first run is past its start-up
  esac
  if [ "$scenario" = disk_full ]; then
    # Room for about five checkpoints (keep_last 3, the one being written, a partial one).
    mnt="$T/job/checkpoints"
    mkdir -p "$mnt"
    if ! mount -t tmpfs -o "size=$(( CKPT_BYTES * 5 + 65536 )),mode=0700" tmpfs "$mnt"; then
      notes="cannot mount a tmpfs on $mnt"; mnt=""
    fi
  fi
  if [ "$scenario" = kv_kill ]; then
    write_generate_spec "$T" "$job_name"
    mkdir -p "$T/kv"
    chmod 0700 "$T/kv"
    cp "$T/gen.yaml" "$T/spec.yaml"
    k=0
  fi
  start_run "$T"
  t0=$(now_ms)
  if [ "$k" = 0 ]; then extra_ms=$(( (RANDOM * 32768 + RANDOM) % (ref_startup_ms + 1) ))
  else extra_ms=$(( (RANDOM * 32768 + RANDOM) % (ref_step_ms + 1) )); fi
  case "$scenario" in
    kv_kill) extra_ms=$(( 500 + (RANDOM * 32768 + RANDOM) % 4000 )) ;;
    restart_from|disk_full|second_job) extra_ms=0 ;;
  esac
  t_k=""
  while run_alive; do
    if [ -z "$t_k" ] && [ "$(step_lines "$T")" -ge "$k" ]; then t_k=$(now_ms); fi
    if [ -n "$t_k" ] && [ $(( $(now_ms) - t_k )) -ge "$extra_ms" ]; then break; fi
    # (Sampling ringd's directories takes a while: not while waiting for an early step.)
    case "$scenario" in kill|kv_kill) note_ringd_dirs "$(cat "$T/sessions")" "$T" ;; esac
    sleep 0.01
  done
  at_ms=$(( $(now_ms) - t0 ))
  victim="none"
  case "$scenario" in
    kill|kv_kill)
      # The victim: a kind among those alive now (kv_kill: a worker), then one of that kind.
      procs=$(trial_procs "$(cat "$T/sessions")" "$T")
      [ "$scenario" = kv_kill ] && procs=$(echo "$procs" | awk '$2 == "ring-worker"')
      kinds=$(echo "$procs" | awk 'NF == 2 { print $2 }' | sort -u)
      if [ -n "$kinds" ]; then
        nk=$(echo "$kinds" | wc -l)
        kind=$(echo "$kinds" | sed -n "$(( RANDOM % nk + 1 ))p")
        pids=$(echo "$procs" | awk -v k="$kind" '$2 == k { print $1 }')
        np=$(echo "$pids" | wc -l)
        vpid=$(echo "$pids" | sed -n "$(( RANDOM % np + 1 ))p")
        step_at=$(step_lines "$T")
        kill -9 "$vpid" 2>/dev/null && victim="$kind" || victim="none"
        [ "$victim" != none ] && notes="killed $kind (pid $vpid) at $(( at_ms / 1000 )).$(( at_ms % 1000 / 100 )) s, after step $step_at"
      fi
      [ "$victim" = none ] && notes="nothing to kill after step $k (the run had ended)"
      ;;
    restart_from)
      # From the checkpoint before the newest (every 5 steps, 3 kept: still there; an older step
      # than the head: a branch).
      at=$(step_lines "$T")
      from=$(( at / 5 * 5 - 5 ))
      r=$(env RING_COORD="ipc://$T/sock/coord.sock" "$RINGCTL" restart 1 --from "$from" 2>&1)
      # The job may have gone on meanwhile and retention removed that step: the refusal lists
      # the steps it can restart from; the oldest of them is still a branch.
      if ! echo "$r" | grep -q restarting; then
        alt=$(echo "$r" | sed -n 's/.*it can restart from step \([0-9]*\).*/\1/p')
        if [ -n "$alt" ]; then
          from=$alt
          r=$(env RING_COORD="ipc://$T/sock/coord.sock" "$RINGCTL" restart 1 --from "$from" 2>&1)
        fi
      fi
      notes="restart --from $from after step $at: $(echo "$r" | head -n 1)"
      victim="restart"
      ;;
    second_job)
      ( setsid env RING_COORD="ipc://$T/sock/coord.sock" RING_STATE_DIR="$T/state" \
          UCX_TLS=self,posix UCX_NET_DEVICES=lo NO_COLOR=1 \
          timeout 120 "$RINGCTL" run "$T/spec.yaml" --job-dir "$T/job" >"$T/second.out" 2>&1 </dev/null
        echo $? >"$T/second.rc" ) 2>/dev/null
      src=$(cat "$T/second.rc" 2>/dev/null)
      if [ "$src" = 1 ] && grep -q "is in use by" "$T/second.out"; then
        res[second]=ok
        notes="a second run with the same job dir after step $(step_lines "$T"): refused"
      else
        res[second]=fail
        notes="second run exit ${src:-?}: $(tail -n 2 "$T/second.out" | tr '\n' ' ')"
      fi
      victim="second"
      ;;
    disk_full)
      if [ -n "$mnt" ]; then
        dd if=/dev/zero of="$mnt/filler" bs=64k 2>/dev/null
        fill_step=$(step_lines "$T")
        notes="filled the checkpoint directory after step $fill_step"
      fi
      victim="diskfull"
      ;;
  esac
  killed[$victim]=$(( ${killed[$victim]:-0} + 1 ))

  # Let the run end by itself (a killed worker is restarted by ringd; a killed ringd or
  # ring-coord ends or outlives `ringctl run` as the product decides), then resume until done.
  wait_run "$T" 900
  rc=$RUN_RC
  runs=1
  if ! left=$(wait_no_procs "$T" 120); then
    notes="$notes; still running after the run ended: $(echo "$left" | awk '{print $2 "(" $1 ")"}' | tr '\n' ' ')"
    echo "$left" | awk '{print $1}' | xargs -r kill -9 2>/dev/null
    wait_no_procs "$T" 30 >/dev/null
    res[orphans]=fail
  fi
  if [ "$scenario" = disk_full ] && [ -n "$mnt" ]; then
    if grep -qi "no space left on device" "$T/job/logs/ringd-0.log" 2>/dev/null && has_checkpoint "$T"; then
      res[diskfull]=ok
    elif [ "${fill_step:-0}" -ge "$STEPS" ] && [ "$rc" = 0 ] && has_checkpoint "$T"; then
      # The fast job had taken its last step (and may have written its final checkpoint) before
      # the disk filled: nothing was left to write, so no ENOSPC is the right outcome.
      res[diskfull]=ok
      notes="$notes (the last step: nothing left to write)"
    else
      res[diskfull]=fail
      notes="$notes; no ENOSPC named, or no complete checkpoint left"
    fi
    rm -f "$mnt/filler"
  fi
  if [ "$scenario" = kv_kill ]; then
    left_kv=$(ls -A "$T/kv" 2>/dev/null)
    if [ -z "$left_kv" ]; then res[kvfiles]=ok; else
      res[kvfiles]=fail
      notes="$notes; left in the disk tier's directory: $(echo "$left_kv" | tr '\n' ' ')"
    fi
    notes="$notes; the generate run exited $rc"
    res[completed]=skip  # a generate job is not restarted: it ends, failed or not
    res[exact]=skip
    res[verify]=skip
  else
    while { [ "$rc" != 0 ] || [ ! -d "$T/job/checkpoints/$FINAL" ]; } && [ "$runs" -le 3 ]; do
      # --resume when there is something to resume, else afresh (a resume that loads nothing
      # fails by design).
      if has_checkpoint "$T"; then how="--resume"; else how=""; fi
      echo "--- run $((runs + 1)) ${how:-afresh} (previous exit $rc)" >>"$T/run.out"
      start_run "$T" $how
      wait_run "$T" 900
      rc=$RUN_RC
      runs=$(( runs + 1 ))
      if ! left=$(wait_no_procs "$T" 120); then
        notes="$notes; left after resume: $(echo "$left" | awk '{print $2 "(" $1 ")"}' | tr '\n' ' ')"
        echo "$left" | awk '{print $1}' | xargs -r kill -9 2>/dev/null
        wait_no_procs "$T" 30 >/dev/null
        res[orphans]=fail
      fi
    done
    notes="$notes; $(( runs - 1 )) more run(s), last exit $rc"
    [ "$rc" = 0 ] && res[completed]=ok || res[completed]=fail

    # exact: the final checkpoint equals the reference run's, tensor by tensor.
    got=$(tensor_hashes "$T/job/checkpoints/$FINAL")
    last_step=$(tail -n 1 "$T/job/steps.jsonl" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("step"))' 2>/dev/null)
    if [ -n "$got" ] && [ "$got" = "$REF_HASHES" ] && [ "$last_step" = "$STEPS" ]; then
      res[exact]=ok
    else
      res[exact]=fail
      diff_names=$(diff <(echo "$REF_HASHES") <(echo "$got") | awk '/^>/ {print $2}' | tr '\n' ' ')
      notes="$notes; final checkpoint differs (${diff_names:-missing}), last step ${last_step:-none}"
    fi

    # verify: every complete checkpoint's checksums.
    if env RING_COORD="ipc://$T/sock/coord.sock" "$RINGCTL" checkpoints "$T/job/checkpoints" --verify \
         >"$T/verify.out" 2>&1; then
      res[verify]=ok
    else
      res[verify]=fail
      notes="$notes; checkpoints --verify: $(grep -v '^ *$' "$T/verify.out" | tail -n 2 | tr '\n' ' ')"
    fi
  fi
  if [ "$scenario" = restart_from ]; then
    # The branch: ring-coord recorded it, and the final checkpoint is the head of the lineage.
    ev=$(env RING_COORD="ipc://$T/sock/coord.sock" RING_STATE_DIR="$T/state" "$RINGCTL" events 1 2>/dev/null)
    if echo "$ev" | grep -q "lineage_branched" &&
       [ "$(cat "$T/job/checkpoints/latest" 2>/dev/null)" = "$FINAL" ]; then
      res[lineage]=ok
    else
      res[lineage]=fail
      notes="$notes; no lineage_branched event, or latest is $(cat "$T/job/checkpoints/latest" 2>/dev/null)"
    fi
  fi

  # coord: what the coordinator says about the trial's jobs once nothing runs.
  if bad=$(check_coord "$T"); then res[coord]=ok; else res[coord]=fail; notes="$notes; coordinator: $bad"; fi

  # orphans: nothing of the trial left (the check's ring-coord included).
  if ! left=$(wait_no_procs "$T" 60); then
    res[orphans]=fail
    notes="$notes; orphans: $(echo "$left" | awk '{print $2 "(" $1 ")"}' | tr '\n' ' ')"
    echo "$left" | awk '{print $1}' | xargs -r kill -9 2>/dev/null
  fi
  [ -n "${res[orphans]:-}" ] || res[orphans]=ok
  [ -n "$mnt" ] && umount -l "$mnt" 2>/dev/null

  # shm: the trial's segments (named after its job) are gone.
  segs=$(ls /dev/shm 2>/dev/null | grep -F "ringmaster-$job_name-" || true)
  if [ -z "$segs" ]; then res[shm]=ok; else
    res[shm]=fail
    notes="$notes; shared memory left: $(echo "$segs" | tr '\n' ' ')"
    echo "$segs" | while read -r s; do rm -f "/dev/shm/$s"; done
  fi

  # tmpdirs: ringd's control-socket directories are gone.
  leftdirs=""
  for d in $(sort -u "$T/ringd-dirs"); do
    [ -e "$d" ] && leftdirs="$leftdirs $d"
  done
  if [ -z "$leftdirs" ]; then res[tmpdirs]=ok; else
    res[tmpdirs]=fail
    notes="$notes; temp dirs left:$leftdirs"
    # Remove what the trial's ringd made (a ringd-* control directory), nothing else.
    for d in $leftdirs; do case "$(basename "$d")" in ringd-*) rm -rf -- "$d" ;; esac; done
  fi

  line="trial $n/$trials ($scenario):"
  failed_here=0
  for c in $checks; do
    case "${res[$c]}" in
      ok) pass[$c]=$(( pass[$c] + 1 )); line="$line $c=ok" ;;
      skip) ;;
      *) fail[$c]=$(( fail[$c] + 1 )); line="$line $c=FAIL"; failed_here=1 ;;
    esac
  done
  echo "$line | $notes"
  if [ $failed_here = 1 ]; then any_fail=1; echo "  kept: $T"; elif [ $keep = 0 ]; then rm -rf "$T"; fi
  unset res
done

echo "chaos: summary of $trials trials (seed $seed):"
for c in $checks; do printf "chaos:   %-9s %3d ok %3d failed\n" "$c" "${pass[$c]}" "${fail[$c]}"; done
printf "chaos:   scenarios:"
for k in "${!drawn[@]}"; do printf " %s %d" "$k" "${drawn[$k]}"; done
echo
printf "chaos:   killed:"
for k in "${!killed[@]}"; do printf " %s %d" "$k" "${killed[$k]}"; done
echo
if [ $any_fail = 0 ] && [ $keep = 0 ]; then rm -rf "$ROOT"; fi
if [ $any_fail = 1 ]; then echo "chaos: FAILED (trial directories kept under $ROOT)"; exit 1; fi
echo "chaos: all checks passed"
