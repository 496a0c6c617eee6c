#!/usr/bin/env bash
# Passkey retrieval through `ringctl generate`, against the training-time evaluation of the same
# model on the same held-out samples, with the two opt-in inexact modes beside exact.
#
#   bench/passkey_generate.sh [BUILD_DIR] [CHECKPOINT_DIR]
#
# Without CHECKPOINT_DIR it first trains the passkey-4k model (scripts/passkey_train.sh, 10-22
# minutes on 2 cores) and keeps its weights (ring-worker --save-weights) in a temporary
# directory. Then, on the 32 held-out 4096-token samples the training evaluation uses:
#   1. bench/passkey_generate (the library): the training forward's accuracy; for exact,
#      int8 host pages and approximate 0.001 / 0.01 / 0.05: teacher-forced digit and key
#      accuracy, KL(exact || mode) at the answer positions, the skipped-mass bound;
#   2. `ringctl generate --max-tokens 5` on the prompts, all 32 in one batch (free-running
#      greedy decoding, as a user runs it; the fast tier holds each prompt's window), exact /
#      --host-int8 / --approximate 0.01: digit and key accuracy.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
ck="${2:-}"
for b in "$build/cli/ringctl" "$build/bench/passkey_generate" "$build/worker/ring-worker"; do
  [[ -x "$b" ]] || { echo "passkey_generate.sh: no $b (cmake --build $build)" >&2; exit 2; }
done
spec="$src/scripts/passkey_4k.yaml"
work="$(mktemp -d "${TMPDIR:-/tmp}/passkey-gen-XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [[ -z "$ck" ]]; then
  ck="$work/weights"
  echo "training the passkey-4k model (scripts/passkey_train.sh) ..."
  "$src/scripts/passkey_train.sh" "$build" "$work/train.jsonl" --save-weights "$ck" | tail -n 2
fi

echo "== the library, teacher-forced (as the training evaluation scores) =="
"$build/bench/passkey_generate" --spec "$spec" --checkpoint "$ck" --samples 32 \
  --prompts-dir "$work/prompts"

echo "== ringctl generate --max-tokens 5, free-running greedy =="
mapfile -t prompts < <(ls "$work"/prompts/prompt-*.txt)
for mode in exact int8 approximate; do
  extra=()
  [[ $mode == int8 ]] && extra=(--host-int8)
  [[ $mode == approximate ]] && extra=(--approximate 0.01)
  "$build/cli/ringctl" generate --checkpoint "$ck" --spec "$spec" --max-tokens 5 --threads 1 \
    --page-tokens 256 --fast-bytes 64MiB --json "${extra[@]}" "${prompts[@]}" \
    > "$work/gen-$mode.json" 2> "$work/gen-$mode.err" \
    || { cat "$work/gen-$mode.err" >&2; exit 1; }
  /usr/bin/python3 - "$work/gen-$mode.json" "$work/prompts/answers.txt" "$mode" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
answers = [a.strip() for a in open(sys.argv[2]) if a.strip()]
texts = [p["text"] for p in out["prompts"]]
assert len(texts) == len(answers), (len(texts), len(answers))
digits = sum(sum(a == b for a, b in zip(t[:len(k)], k)) for t, k in zip(texts, answers))
total = sum(len(k) for k in answers)
keys = sum(t[:len(k)] == k for t, k in zip(texts, answers))
label = {"exact": "exact", "int8": "int8 host pages", "approximate": "approximate 0.01"}[sys.argv[3]]
print(f"{label:<22} digit accuracy {digits / total:.3f} | key accuracy {keys / len(answers):.3f}"
      f" | {len(answers)} prompts, attention {out['attention'].get('mode', '?')}")
PY
done
