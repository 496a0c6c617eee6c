#!/bin/bash
# The walkthrough of docs/finetune.md, run end to end in a temporary directory: a byte-level BPE
# tokenizer.json, a random Llama in the Hugging Face layout with that vocab, `ringctl import`,
# chat data, `ringctl eval` before, `ringctl run` (full fine-tuning from the import, 2 CPU
# workers, context_ranks 2), `ringctl eval` after, `ringctl export`, the export read back and
# re-imported, and `ringctl generate` answering a chat prompt. Prints the time and peak memory
# of each step and the losses that docs/finetune.md quotes.
#   scripts/finetune_walkthrough.sh [BUILD_DIR]        (KEEP=1: keep the directory)
# Exits non-zero when a step fails, or when the loss after fine-tuning is not lower than before
# on the training conversations (or on the held-out ones).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
ringctl=$build/cli/ringctl
py=/usr/bin/python3  # Debian's, with numpy and torch (the helper reuses hf_parity.py's writer)
[ -x "$ringctl" ] || { echo "finetune_walkthrough.sh: no $ringctl (build ringctl first)" >&2; exit 1; }
$py -c 'import numpy, torch' 2>/dev/null || {
  echo "finetune_walkthrough.sh: $py cannot import numpy and torch (python3-torch); skipping" >&2
  exit 77
}

work=$(mktemp -d "${TMPDIR:-/tmp}/finetune-walkthrough.XXXXXX")
[ "${KEEP:-0}" = 1 ] && echo "work directory: $work (kept)" || trap 'rm -rf "$work"' EXIT
cd "$work"
# A coordinator of our own (ringctl run starts one and stops it at the end), not the default
# endpoint another user's jobs may be using; its socket directory must be private.
mkdir -m 700 sock
export RING_COORD="ipc://$work/sock/coord.sock" RING_STATE_DIR="$work/state"
export UCX_TLS=self,posix UCX_NET_DEVICES=lo

figures=()
# measure NAME COMMAND...: runs it, its stdout to NAME.out (and shown), stderr to NAME.err;
# records wall time and peak RSS (GNU time's %M: the largest process among it and its waited-for
# descendants).
measure() {
  local name=$1; shift
  echo "== $name: $*"
  local rc=0
  /usr/bin/time -f "%e %M" -o "$name.time" "$@" > "$name.out" 2> "$name.err" || rc=$?
  cat "$name.out"
  if [ "$rc" -ne 0 ]; then
    echo "finetune_walkthrough.sh: step '$name' failed (exit $rc):" >&2
    tail -n 30 "$name.err" >&2
    exit 1
  fi
  local t m
  read -r t m < <(tail -n 1 "$name.time")
  figures+=("$(printf '%-22s %7.2f s %8.1f MiB' "$name" "$t" "$(echo "$m / 1024" | bc -l)")")
}
loss_of() { awk '/^loss [0-9]/{print $2}' "$1.out"; }

# 1. The tokenizer: byte-level BPE (Llama 3's split regex), merges learned from a corpus, with the
#    llama3 chat template's special tokens.
measure tokenizer $py "$root/tests/worker/bpe_train.py" --style bytelevel \
  --corpus /usr/share/common-licenses --out tok --merges 2000
# 2. A random Llama in the Hugging Face layout with that vocab.
measure hf-model $py "$here/finetune_helper.py" model tok hf
# 3. Import: checkpoint step 0 and the spec's model section (ckpt/model.yaml).
measure import "$ringctl" import hf -o ckpt
# 4. Chat data: 180 training and 20 held-out conversations.
$py "$here/finetune_helper.py" chat data

# The fine-tuning spec: the model section import wrote (with init_from), then the rest.
cat > rest.yaml <<'EOF'
job:
  name: finetune-walkthrough
data:
  source: chat                    # JSONL conversations (docs/data.md, "Chat and instruction data")
  paths: [data/train.jsonl]       # relative: to the directory ringctl runs in
  tokenizer: hf/tokenizer.json    # the model's own tokenizer.json
  chat_template: llama3           # built in; its special tokens must be in the tokenizer
  seq_len: 512                    # tokens per sequence; conversations are packed into it
  pack: true
  min_doc_len: 1
  seed: 1
parallel:
  context_ranks: 2                # each 512-token sequence split over 2 workers (ring attention)
  causal_balance: zigzag
  ring_order: natural
optimizer:
  lr: 3.0e-3                      # a tiny model: a high rate; real models want ~1e-5..2e-4
  lr_warmup_steps: 5
  offload: cpu                    # AdamW in ringd, on the CPU
train:
  steps: 40
  log_every: 10
checkpoint:
  dir: checkpoints                # relative: <job dir>/checkpoints
  every_steps: 0                  # only the final step
resources:
  nodes: 1
  workers_per_node: 2
  backend: cpu
  cpus_per_worker: 1
  host_memory_gb: 4
restart:
  max_restarts: 0
EOF
{ grep -v '^#' ckpt/model.yaml; cat rest.yaml; } > ft.yaml
"$ringctl" validate ft.yaml

# Memory of full fine-tuning: the plan of this spec, and of the same job at Llama-3.2-1B's shape
# (16 layers, d_model 2048, 32/8 heads of 64, SwiGLU 8192, vocab 128256, tied) and 4096 tokens.
measure plan "$ringctl" plan ft.yaml
measure plan-1b "$ringctl" plan ft.yaml --set model.layers=16 --set model.d_model=2048 \
  --set model.heads=32 --set model.kv_heads=8 --set model.head_dim=64 \
  --set model.mlp_hidden=8192 --set model.vocab=128256 --set model.tie_embeddings=true \
  --set 'model.init_from=""' --set data.seq_len=4096

# 5. Eval before: loss over the assistant tokens only.
measure eval-before-train "$ringctl" eval -q --checkpoint ckpt --spec ft.yaml
measure eval-before-held "$ringctl" eval -q --checkpoint ckpt --spec ft.yaml --data data/held-out.jsonl

# 6. Fine-tune (full fine-tuning: every weight is trained), then eval the trained checkpoint.
measure train "$ringctl" run ft.yaml --job-dir job
measure eval-after-train "$ringctl" eval -q --checkpoint job/checkpoints --spec ft.yaml
measure eval-after-held "$ringctl" eval -q --checkpoint job/checkpoints --spec ft.yaml --data data/held-out.jsonl

# The same held-out set pre-tokenized (ids + loss mask) gives the same loss.
measure tokenize "$ringctl" tokenize -q --tokenizer hf/tokenizer.json --chat-template llama3 \
  -o held-out-tokens data/held-out.jsonl
measure eval-after-tokens "$ringctl" eval -q --checkpoint job/checkpoints \
  --data held-out-tokens --source tokens

# 7. Export, read back, re-import; generate with the same tokenizer.
measure export "$ringctl" export job/checkpoints -o exported
cp hf/tokenizer.json hf/tokenizer_config.json exported/  # export writes only the model
measure check-export $py "$here/finetune_helper.py" check-export hf exported
measure reimport "$ringctl" import exported -o reimported
measure eval-reimported "$ringctl" eval -q --checkpoint reimported --spec ft.yaml --data data/held-out.jsonl
printf '%s' '<|begin_of_text|><|start_header_id|>system<|end_header_id|>

Answer in one sentence.<|eot_id|><|start_header_id|>user<|end_header_id|>

What colour is the kettle?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

' > prompt.txt
measure generate "$ringctl" generate --checkpoint job/checkpoints --spec ft.yaml \
  --max-tokens 12 prompt.txt
echo

tb=$(loss_of eval-before-train); ta=$(loss_of eval-after-train)
hb=$(loss_of eval-before-held); ha=$(loss_of eval-after-held)
ht=$(loss_of eval-after-tokens); hr=$(loss_of eval-reimported)
echo "== figures (this machine: $(nproc) cores; wall time, peak RSS of the largest process)"
printf '%s\n' "${figures[@]}"
echo "model: $(grep -o 'vocab [0-9]*, [0-9]* parameters' hf-model.out)"
echo "training: $(grep -o 'steps 1-.*' train.out)"
echo "loss, training conversations (assistant tokens): before $tb, after $ta"
echo "loss, held-out conversations (assistant tokens): before $hb, after $ha"
echo "held-out after, from the tokenized dataset: $ht; from the re-imported export: $hr"
totals() {  # the plan's per-worker total (the first) and per-node total (the last)
  echo "per worker $(grep -E '^  total ' "$1.out" | head -n 1 | awk '{print $2, $3}'), per node $(
    grep -E '^  total ' "$1.out" | tail -n 1 | awk '{print $2, $3}')"
}
echo "plan, this model: $(totals plan)"
echo "plan, Llama-3.2-1B shape at 4096 tokens: $(totals plan-1b), of which ringd's fp32 master + AdamW m, v $(
  grep 'master + AdamW' plan-1b.out | grep -oE '[0-9.]+ [kMG]?B' | head -n 1)"
echo "exported config.json max_position_embeddings: $(grep -o '"max_position_embeddings": [0-9]*' exported/config.json | grep -o '[0-9]*$')"
echo "generate: $(cat generate.out)"
awk -v b="$tb" -v a="$ta" -v hb="$hb" -v ha="$ha" 'BEGIN { exit !(a < b && ha < hb) }' || {
  echo "finetune_walkthrough.sh: the loss did not drop (training $tb -> $ta, held-out $hb -> $ha)" >&2
  exit 1
}
mp=$(grep -o '"max_position_embeddings": [0-9]*' exported/config.json | grep -o '[0-9]*$')
[ "$mp" = 2048 ] || {
  echo "finetune_walkthrough.sh: the export says max_position_embeddings $mp, the imported model 2048" >&2
  exit 1
}
[ "$hr" = "$ha" ] || {
  echo "finetune_walkthrough.sh: the re-imported export's loss $hr differs from the trained checkpoint's $ha" >&2
  exit 1
}
echo "finetune_walkthrough.sh: ok"
