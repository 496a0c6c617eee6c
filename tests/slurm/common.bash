# tests/slurm/common.bash - shared by the slurm-labelled tests (source it). Each check prints
# one line ("ok" or "FAIL" with what was expected and what happened); finish() prints the
# count and sets the exit status. Tests assert what happened (job states, node names, variable
# values, messages, files), not only exit codes.
#
# Environment (set by tests/slurm/CMakeLists.txt): RING_SLURM_STATE (the fixture's state dir),
# RING_SOURCE_DIR, RING_SPANK_SO (empty when the plugin is not built).
set -u
RING_SOURCE_DIR=${RING_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
CLUSTER="$RING_SOURCE_DIR/slurm/cluster.sh"
export SLURM_CONF=$RING_SLURM_STATE/etc/slurm.conf
T_PASS=0 T_FAIL=0
T_START=$SECONDS

ok()   { echo "ok   $*"; T_PASS=$((T_PASS + 1)); }
bad()  { echo "FAIL $*"; T_FAIL=$((T_FAIL + 1)); }

# run CMD...: runs it with a 60 s limit; sets $status and $output (stdout and stderr)
run() {
  errout=""
  output=$(timeout 60 "$@" 2>&1)
  status=$?
  return 0
}
# runo CMD...: like run, but $output is stdout only (stderr in $errout): for comparing what
# tasks print without srun's informational lines ("job N queued and waiting for resources")
runo() {
  local e; e=$(mktemp)
  output=$(timeout 60 "$@" 2>"$e")
  status=$?
  errout=$(cat "$e"); rm -f "$e"
  return 0
}
# check NAME CMD...: ok when CMD succeeds
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
assert_eq() {   # assert_eq WHAT EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: expected [$2], got [$3]"; fi
}
assert_contains() {   # assert_contains WHAT HAYSTACK NEEDLE
  if [[ $2 == *"$3"* ]]; then ok "$1"; else bad "$1: expected to contain [$3], got: $(printf '%s' "$2" | head -c 600)"; fi
}
assert_not_contains() {
  if [[ $2 != *"$3"* ]]; then ok "$1"; else bad "$1: expected NOT to contain [$3], got: $(printf '%s' "$2" | head -c 600)"; fi
}
assert_fails() {   # assert_fails WHAT: the last run() exited non-zero
  if [ "$status" -ne 0 ]; then ok "$1 (exit $status)"; else bad "$1: expected a failure, exit 0: $output"; fi
}
assert_succeeds() {
  if [ "$status" -eq 0 ]; then ok "$1"; else bad "$1: exit $status: $(printf '%s %s' "$output" "${errout:-}" | tail -c 600)"; fi
}

# skip_unless_cluster_possible: exit 77 (CTest SKIP_RETURN_CODE) with the reason
skip_unless_cluster_possible() {
  if [ "$(id -u)" != 0 ]; then echo "SKIP: the local Slurm cluster needs root (slurm/README.md)"; exit 77; fi
  for b in slurmctld slurmd srun munged; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] ||
      { echo "SKIP: $b not installed (scripts/install-deps.sh)"; exit 77; }
  done
}
require_cluster() {
  skip_unless_cluster_possible
  "$CLUSTER" status --state-dir "$RING_SLURM_STATE" >/dev/null 2>&1 || {
    # A test killed at its TIMEOUT (SIGKILL: no EXIT trap) may have left a slurmd stopped.
    local n
    for n in 1 2 3; do "$CLUSTER" node-start "node$n" --state-dir "$RING_SLURM_STATE" --quiet >/dev/null 2>&1; done
    "$CLUSTER" status --state-dir "$RING_SLURM_STATE" >/dev/null 2>&1
  } || { echo "FAIL: no running cluster in $RING_SLURM_STATE (the slurm_cluster_up fixture failed?)"; exit 1; }
  # ... or a test plugstack.conf: start from the fixture's (the plugin, no arguments).
  if [ -n "${RING_SPANK_SO:-}" ] && [ -f "$RING_SPANK_SO" ]; then
    "$CLUSTER" plugstack --quiet --state-dir "$RING_SLURM_STATE" --spank "$RING_SPANK_SO" ||
      { echo "FAIL: cannot restore plugstack.conf in $RING_SLURM_STATE"; exit 1; }
  fi
}

# wait_job JOBID TIMEOUT_S: waits until the job left the queue; prints its JobState
# wait_for SECONDS CMD...: polls CMD every 0.2 s until it succeeds (then once more at the end)
wait_for() { local n=$(($1 * 5)); shift; for ((; n > 0; n--)); do "$@" && return 0; sleep 0.2; done; "$@"; }
wait_job() {
  local i
  for ((i = 0; i < $2 * 5; i++)); do
    [ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ] && break
    sleep 0.2
  done
  scontrol show job "$1" 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2
}
job_field() {   # job_field JOBID FIELD -> value from scontrol show job
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | grep -E "^$2=" | head -n1 | cut -d= -f2-
}

finish() {
  echo "$T_PASS passed, $T_FAIL failed in $((SECONDS - T_START)) s"
  [ "$T_FAIL" -eq 0 ]
}
