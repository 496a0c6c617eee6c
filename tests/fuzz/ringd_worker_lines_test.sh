#!/usr/bin/env bash
# ringd against a worker that sends wrongly typed control lines and a NaN loss ("loss_sum": null)
# every step (fake_worker.py): ringd drops the bad lines with a log line, trains both steps and
# exits 0. Before worker/offload/control.h it ended with "ringd: fatal: [json.exception.
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
# $1: 1 with the wrongly typed lines, 0 with only the NaN loss.
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
  [ "$rc" = 0 ] || fail "$1" "ringd exited $rc"
  ! grep -q fatal "$t/err" || fail "$1" "ringd reported a fatal error"
  [ "$(grep -c '"step"' "$t/job/steps.jsonl")" = 2 ] || fail "$1" "steps.jsonl does not have 2 steps"
  grep -q '"loss":null' "$t/job/steps.jsonl" || fail "$1" "the NaN loss is not in steps.jsonl as null"
  if [ "$1" = 1 ]; then
    cat "$t/err" "$t"/job/logs/* 2>/dev/null | grep -q "malformed control message dropped" ||
      fail "$1" "ringd did not say it dropped the malformed lines"
  fi
}
run 0
run 1
echo "ok: ringd trained 2 steps with a NaN loss, and dropped the malformed worker lines"
