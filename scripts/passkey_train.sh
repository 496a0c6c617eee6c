#!/bin/sh
# Trains the passkey-4k model (scripts/passkey_4k.yaml) on one CPU rank and reports retrieval
# accuracy on 32 held-out 4096-token samples every 250 steps and at the end.
#
# Recipe (docs/performance.md, "Passkey retrieval at 4K"): loss on the answer digits only, a
# length curriculum with several samples per step while samples are short:
#   steps    1-800   16 samples of  128 tokens per step
#   steps  801-1100   4 samples of  512 tokens
#   steps 1101-1300   2 samples of 1024 tokens
#   steps 1301-1500   1 sample  of 4096 tokens
# 10-22 minutes with one thread on a busy 2-core machine. THREADS (default 1) sets the CPU
# threads: on a busy 2-core machine one thread per process beats two.
#   scripts/passkey_train.sh [BUILD_DIR] [LOG_JSON] [extra ring-worker args...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
log=${2:-passkey_4k.jsonl}
[ $# -ge 2 ] && shift 2 || shift $#
out=$(mktemp)
trap 'rm -f "$out" "$out.rc"' EXIT
start=$(date +%s)
{
  rc=0
  "$build/worker/ring-worker" --spec "$here/passkey_4k.yaml" --threads "${THREADS:-1}" \
    --passkey-labels answer --passkey-curriculum 128:800:16,512:300:4,1024:200:2 \
    --eval-every 250 --eval-samples 32 --log-json "$log" "$@" || rc=$?
  echo "$rc" > "$out.rc"
} | tee "$out"
end=$(date +%s)
rc=$(cat "$out.rc")
[ "$rc" -eq 0 ] || { echo "passkey_train.sh: ring-worker failed (exit $rc)" >&2; exit "$rc"; }
final=$(grep '^eval step' "$out" | tail -n 1)
echo "passkey 4K final: ${final#eval } | wall $((end - start)) s (chance: digit accuracy 0.100)"
