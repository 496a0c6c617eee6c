#!/usr/bin/env bash
# ringd against a worker that sends wrongly typed control lines and a NaN loss ("loss_sum": null)
# every step (fake_worker.py): with only the NaN loss ringd trains both steps and exits 0; with the
# wrongly typed lines it fails that worker with a protocol error naming the field (exit 1). Before the shared parser (common/contract/control.h) it ended with "ringd: fatal: [json.exception.
# type_error.302] type must be number, but is null" (or "... but is string").
#   ringd_worker_lines_test.sh RINGD
set -euo pipefail
ringd=$1
here=$(cd "$(dirname "$0")" && pwd)
t=$(mktemp -d /tmp/ringd-lines-XXXXXX)
trap 'rm -rf "$t"' EXIT
cat >"$t/spec.yaml" <<'YAML'
job:
  name: ringd-lines
model:
  layers: 2
  d_model: 64
  heads: 4
  mlp: swiglu
  vocab: 256
data:
  source: text
  paths: [/usr/share/common-licenses]
  seq_len: 64
  seed: 1
parallel:
  context_ranks: 1
optimizer:
  lr: 1.0e-3
  offload: cpu
train:
  steps: 2
  seed: 1
checkpoint:
  every_steps: 0
resources:
  nodes: 1
  workers_per_node: 1
  backend: cpu
restart:
  max_restarts: 0
YAML
# $1: 1 with the wrongly typed lines, 0 with only the NaN loss. $RING_FAKE_PROTO: the control
# protocol version the worker says in hello (default this build's).
run() {
  local rc=0
  rm -rf "$t/job"
  RING_FAKE_HOSTILE=$1 RING_FAKE_BUCKETS=4 timeout 300 "$ringd" --spec "$t/spec.yaml" \
    --job-dir "$t/job" --json --worker-bin "$here/fake_worker.py" >"$t/out" 2>"$t/err" || rc=$?
  fail() {
    echo "FAIL (malformed lines: $1): $2"
    echo "--- ringd stdout"; tail -n 20 "$t/out"
    echo "--- ringd stderr"; tail -n 20 "$t/err"
    for f in "$t"/job/logs/*; do echo "--- $f"; tail -n 20 "$f"; done
    exit 1
  }
  ! grep -q fatal "$t/err" || fail "$1" "ringd reported a fatal error"
  if [ "$1" = 0 ]; then
    [ "$rc" = 0 ] || fail "$1" "ringd exited $rc"
    [ "$(grep -c '"step"' "$t/job/steps.jsonl")" = 2 ] || fail "$1" "steps.jsonl does not have 2 steps"
    grep -q '"loss":null' "$t/job/steps.jsonl" || fail "$1" "the NaN loss is not in steps.jsonl as null"
  else
    # The worker that broke the protocol fails (max_restarts 0: the job fails, exit 1); ringd
    # itself ends through its normal failure path and names the field.
    [ "$rc" = 1 ] || fail "$1" "ringd exited $rc, expected 1 (the worker failed)"
    # grep reads the files itself: `cat | grep -q` under pipefail fails when grep stops early
    # and cat gets SIGPIPE.
    grep -q "protocol error: sent a malformed message" "$t/err" "$t"/job/logs/* 2>/dev/null ||
      fail "$1" "ringd did not name the malformed worker line"
  fi
}
run 0
run 1
# A worker of another control protocol version: ringd refuses its hello naming both versions,
# and the worker fails (exit 1), never trained against.
rc=0
rm -rf "$t/job"
RING_FAKE_PROTO=999 RING_FAKE_HOSTILE=0 RING_FAKE_BUCKETS=4 timeout 300 "$ringd" --spec "$t/spec.yaml" \
  --job-dir "$t/job" --json --worker-bin "$here/fake_worker.py" >"$t/out" 2>"$t/err" || rc=$?
if [ "$rc" != 1 ] ||
   ! grep -q "hello': proto: the worker speaks control protocol 999, ringd speaks 1" \
       "$t/err" "$t"/job/logs/* 2>/dev/null; then
  echo "FAIL (protocol 999): ringd exited $rc or did not name both versions"
  echo "--- ringd stderr"; tail -n 20 "$t/err"
  for f in "$t"/job/logs/*; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
fi
if grep -q '"step"' "$t/job/steps.jsonl" 2>/dev/null; then
  echo "FAIL (protocol 999): ringd trained with a worker of another protocol"; exit 1
fi
echo "ok: ringd trained 2 steps with a NaN loss, failed the worker that sent malformed lines, and refused a worker of another protocol version"
