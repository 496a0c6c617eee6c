#!/usr/bin/env bash
# generate_job_slurm_test: a generation job (job.kind generate) through `ringctl submit` on the
# local cluster, as training runs there: sbatch starts one ringd per node (2 nodes), each spawns
# its `ring-worker --generate` rank, the ranks prefill with ring attention across the nodes and
# decode with the cache sharded, rank 0 writes the output. The output equals `ringctl generate`
# in one process (greedy text, and sampled tokens with --json); ring-coord records the job
# completed with its events. `ringctl restart` requeues a running one, which generates again
# from the start under the new attempt; `ringctl cancel` ends it.
#
# Environment: the cluster fixture's (tests/slurm/CMakeLists.txt) plus RINGCTL, RINGD,
# RING_COORD_BIN and GEN_CKPT_WRITER (tests/generate/write_test_checkpoint).
source "$(dirname "$0")/common.bash"
require_cluster
for b in "${RINGCTL:-}" "${RINGD:-}" "${RING_COORD_BIN:-}" "${GEN_CKPT_WRITER:-}"; do
  [ -n "$b" ] && [ -x "$b" ] || { echo "SKIP: ringctl, ringd, ring-coord and write_test_checkpoint must be built ($b)"; exit 77; }
done
export UCX_TLS=self,posix,tcp UCX_NET_DEVICES=lo
T=$(mktemp -d /tmp/ring-slurm-genjob.XXXXXX)
chmod 0755 "$T"
cd "$T" || exit 1
COORD_PID=
cleanup() {
  for j in $(squeue -h -o %i -n slurm-gen-greedy,slurm-gen-sampled,slurm-gen-long 2>/dev/null); do scancel "$j"; done
  [ -n "$COORD_PID" ] && kill "$COORD_PID" 2>/dev/null && wait "$COORD_PID" 2>/dev/null
  if [ "$T_FAIL" -eq 0 ]; then rm -rf "$T"; else echo "kept $T for inspection"; fi
}
trap cleanup EXIT

export RING_COORD=ipc://$T/coord/sock/coord.sock
"$RING_COORD_BIN" --state-dir "$T/coord" --endpoint "$RING_COORD" --heartbeat-interval 0.5 \
  --heartbeat-timeout 20 >"$T/coord.log" 2>&1 &
COORD_PID=$!
for _ in $(seq 300); do [ -S "$T/coord/sock/coord.sock" ] && break; sleep 0.1; done
check "ring-coord listens" test -S "$T/coord/sock/coord.sock"

run "$GEN_CKPT_WRITER" "$T/ckpt"
assert_succeeds "the test checkpoint is written"
python3 -c "print('The quick brown fox jumps over the lazy dog. ' * 16, end='')" >"$T/a.txt"
python3 -c "print('The quick brown fox jumps over the lazy dog. ' * 12 + 'And then?', end='')" >"$T/b.txt"

# mkspec NAME EXTRA: a 2-node generate spec (one rank per node); relative paths, made absolute
# by ringctl submit (the batch job runs in the job directory).
mkspec() {
  cat >"$T/$1.yaml" <<SPEC
job:
  name: slurm-gen-$1
  kind: generate
model: {layers: 2, d_model: 64, heads: 4, kv_heads: 2, head_dim: 16, mlp_hidden: 128, vocab: 256}
generate:
  checkpoint: ckpt
  prompts: [a.txt, b.txt]
  max_new_tokens: 16
  page_tokens: 64
$2
parallel: {context_ranks: 2}
resources: {nodes: 2, workers_per_node: 1, cpus_per_worker: 1}
SPEC
}
coord_field() {   # coord_field JOB KEY: a top-level field of `ringctl status JOB --json`
  "$RINGCTL" status "$1" --json 2>/dev/null |
    python3 -c 'import json,sys; v=json.load(sys.stdin).get(sys.argv[1], ""); print("" if v is None else v)' "$2"
}
coord_is() { [ "$(coord_field "$1" state)" = "$2" ]; }
# submit NAME: sets JOB (ring-coord id), SID (Slurm id), JD (job dir)
submit() {
  JD=$T/jobs/$1
  runo "$RINGCTL" submit "$T/$1.yaml" --job-dir "$JD" --local-job-dir-ok --ringd "$RINGD" --json
  JOB=$(printf '%s' "$output" | grep -oE '"job":[0-9]+' | cut -d: -f2)
  SID=$(printf '%s' "$output" | grep -oE '"slurm_job_id":"[0-9]+"' | grep -oE '[0-9]+')
  if [ "$status" -eq 0 ] && [ -n "$JOB" ] && [ -n "$SID" ]; then ok "$1: submitted as ring-coord job $JOB, Slurm job $SID"
  else bad "$1: submit: exit $status: $output $errout"; fi
}
tokens() { python3 -c 'import json,sys; print([p["tokens"] for p in json.load(open(sys.argv[1]))["prompts"]])' "$1" 2>&1; }

# 1. greedy text over 2 nodes
mkspec greedy ""
submit greedy
st=$(wait_job "$SID" 180)
assert_eq "greedy: Slurm state" COMPLETED "$st"
wait_for 20 coord_is "$JOB" completed
assert_eq "greedy: ring-coord state" completed "$(coord_field "$JOB" state)"
run "$RINGCTL" generate --checkpoint "$T/ckpt" "$T/a.txt" "$T/b.txt" --max-tokens 16 --page-tokens 64 -o "$T/one.out"
assert_succeeds "one process, greedy"
check "greedy: the job's output equals one process's" cmp "$T/one.out" "$JD/generate.out"
check "greedy: both ringd ran a generate rank" grep -q "generate" "$JD/logs/ringd-1.log"
run "$RINGCTL" events "$JOB"
assert_contains "greedy: ring-coord's events" "$output" "job_completed"
assert_contains "greedy: ... of both nodes' workers" "$output" "worker_exited"

# 2. sampled, JSON
mkspec sampled "  temperature: 1.2
  top_p: 0.95
  seed: 4
  json: true"
submit sampled
st=$(wait_job "$SID" 180)
assert_eq "sampled: Slurm state" COMPLETED "$st"
wait_for 20 coord_is "$JOB" completed
run "$RINGCTL" generate --checkpoint "$T/ckpt" "$T/a.txt" "$T/b.txt" --max-tokens 16 --page-tokens 64 \
  --temperature 1.2 --top-p 0.95 --seed 4 --json -o "$T/one.json"
assert_succeeds "one process, sampled"
assert_eq "sampled: the job's tokens equal one process's" "$(tokens "$T/one.json")" "$(tokens "$JD/generate.json")"
assert_eq "sampled: rank 0 records 2 ranks" "2" \
  "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"]["ranks"])' "$JD/generate.json" 2>&1)"

# 3. ringctl restart of a running generate job: Slurm requeues it, ringd generates again from
# the start under ring-coord's new attempt; then ringctl cancel ends it
mkspec long ""
sed -i 's/max_new_tokens: 16/max_new_tokens: 100000000/' "$T/long.yaml"
submit long
[ -n "$JOB" ] && [ -n "$SID" ] || { bad "long: not submitted: the rest of this case cannot run"; finish; exit; }
decoding() { grep -q "generate: decode" "$JD/logs/ringd-0.log" 2>/dev/null; }
check "long: decoding" wait_for 90 decoding
check "long: ring-coord shows it running" wait_for 20 coord_is "$JOB" running
run "$RINGCTL" restart "$JOB"
assert_succeeds "long: ringctl restart"
check "long: started again" wait_for 90 grep -q "start 2," "$JD/slurm-$SID.out"
again() { grep -q "generating from the start" "$JD/logs/ringd-0.log" 2>/dev/null; }
check "long: ringd generates again from the start" wait_for 90 again
check "long: ring-coord's attempt 2" test "$(coord_field "$JOB" attempt)" -ge 2
check "long: running again" wait_for 30 coord_is "$JOB" running
run "$RINGCTL" cancel "$JOB"
assert_succeeds "long: ringctl cancel"
st=$(wait_job "$SID" 60)
assert_eq "long: Slurm state" CANCELLED "$st"
check "long: ring-coord shows cancelled" wait_for 20 coord_is "$JOB" cancelled
no_procs() { ! pgrep -f "$1" >/dev/null; }
check "long: no ringd or worker left" wait_for 15 no_procs "$JD"
check "long: no output" test ! -e "$JD/generate.out"
finish
