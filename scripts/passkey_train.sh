#!/bin/sh
# Trains the passkey-4k model on one CPU rank and reports retrieval accuracy on held-out samples
# every 100 steps. THREADS (default 1) sets the CPU threads: on a busy 2-core machine one
# thread per process beats two (no barrier waits on descheduled threads).
#   scripts/passkey_train.sh [BUILD_DIR] [LOG_JSON] [extra ring-worker args...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
log=${2:-passkey_4k.jsonl}
[ $# -ge 2 ] && shift 2 || shift $#
exec "$build/worker/ring-worker" --spec "$here/passkey_4k.yaml" --threads "${THREADS:-1}" --eval-every 100 \
  --eval-samples 16 --log-json "$log" "$@"
