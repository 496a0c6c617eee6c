#!/usr/bin/env bash
# Passkey retrieval end to end through `ringctl eval` (issue 36): train the passkey-4k model
# (scripts/passkey_train.sh: the training evaluation scores 32 held-out 4096-token samples at the
# end), then evaluate the saved checkpoint with `ringctl eval --passkey` on
#   random      the training evaluation's own samples (same generator, same held-out seed):
#               its digit and key accuracy must EQUAL what training reported;
#   0.1,0.5,0.9 the same samples with the key line moved to that depth of the filler.
#
#   bench/passkey_eval.sh [BUILD_DIR] [CHECKPOINT_DIR]
#
# Without CHECKPOINT_DIR it trains first (10-22 minutes on 2 cores; STEPS=N shortens the run for
# a quick check: the accuracies are lower but must still agree). Exit 1 when they disagree.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
ck="${2:-}"
for b in "$build/cli/ringctl" "$build/worker/ring-worker"; do
  [[ -x "$b" ]] || { echo "passkey_eval.sh: no $b (cmake --build $build)" >&2; exit 2; }
done
spec="$src/scripts/passkey_4k.yaml"
work="$(mktemp -d "${TMPDIR:-/tmp}/passkey-eval-XXXXXX")"
trap 'rm -rf "$work"' EXIT
train_line=""
if [[ -z "$ck" ]]; then
  ck="$work/weights"
  extra=(--save-weights "$ck")
  [[ -n "${STEPS:-}" ]] && extra+=(--steps "$STEPS")
  echo "training the passkey-4k model (scripts/passkey_train.sh ${extra[*]}) ..."
  "$src/scripts/passkey_train.sh" "$build" "$work/train.jsonl" "${extra[@]}" | tail -n 2
  train_line=$(grep '"eval_step"' "$work/train.jsonl" | tail -n 1 || true)
fi

echo "== ringctl eval --passkey random,0.1,0.5,0.9 (32 samples of 4096 tokens each) =="
"$build/cli/ringctl" eval --checkpoint "$ck" --spec "$spec" --passkey random,0.1,0.5,0.9 \
  --passkey-samples 32 --threads "${THREADS:-2}" --json -o "$work/eval.json" -q
TRAIN="$train_line" /usr/bin/python3 - "$work/eval.json" <<'PY'
import json, os, sys
ev = json.load(open(sys.argv[1]))
rows = ev["passkey"]["results"]
for r in rows:
    print(f"depth {r['depth']!s:>7}  len {r['seq_len']}  digit accuracy {r['digit_accuracy']:.3f}"
          f"  key accuracy {r['key_accuracy']:.3f}  ({r['samples']} samples)")
train = os.environ.get("TRAIN")
if train:
    t = json.loads(train)
    rnd = [r for r in rows if str(r["depth"]) == "random"][0]
    ok = (abs(rnd["digit_accuracy"] - t["digit_accuracy"]) < 1e-12 and
          abs(rnd["key_accuracy"] - t["key_accuracy"]) < 1e-12)
    print(f"training's final evaluation: digit {t['digit_accuracy']:.3f}, key "
          f"{t['key_accuracy']:.3f}; eval 'random': {'equal' if ok else 'DIFFERENT'}")
    sys.exit(0 if ok else 1)
PY
