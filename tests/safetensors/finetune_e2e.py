#!/usr/bin/python3
"""Fine-tuning an imported model end to end: `ringctl import` -> `model.init_from` ->
`ringctl run` (ring-coord, ringd, two ring-worker context ranks, CPU AdamW) on a token dataset.

Usage: finetune_e2e.py RINGCTL [WORKDIR]

A random Llama in the Hugging Face layout (GQA, untied head, yarn RoPE scaling x4 over an
original context of 64 so the context-extension knobs matter at the 256-token sequence), in
bf16 as published models are, is written with numpy (hf_parity.py's writer), imported (the
checkpoint keeps bf16 master tensors, which ringd widens to its fp32 masters), and trained for a few steps from a token
dataset holding one document of exactly seq_len ids (written here from docs/data.md's layout),
so every step's sequence is that document. Checked:
- step 1's loss (the forward of the imported weights, before any update) equals the PyTorch
  reference forward's mean next-token cross-entropy on the same ids within 1e-5 relative;
- training lowers it (the last step's loss is below step 1's);
- the job's checkpoint after training holds master tensors that differ from the import (the
  optimizer ran on the imported weights, not on a random init).
Exit 0 on success, 1 on a mismatch, 77 when torch cannot be imported (skip).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_parity as hf  # noqa: E402  (exits 77 itself when numpy/torch are missing)

import numpy as np  # noqa: E402
import torch  # noqa: E402

TOL = 1e-5
SEQ = 256
STEPS = 8


def write_token_dataset(prefix, ids, vocab):
    """<prefix>.bin (uint16 ids) and <prefix>.idx (docs/data.md: 48-byte header + offsets)."""
    ids = np.asarray(ids, dtype="<u2")
    ids.tofile(prefix + ".bin")
    offsets = np.array([0, len(ids)], dtype="<u8")
    with open(prefix + ".idx", "wb") as f:
        f.write(b"RINGTOK\0")
        f.write(struct.pack("<IIQQQQ", 1, 2, 1, len(ids), vocab, 0))
        f.write(offsets.tobytes())


def main():
    ringctl = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="finetune-e2e-")
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "vocab_size": 301,
         "rms_norm_eps": 1e-5, "max_position_embeddings": 1024, "attention_bias": False,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "tie_word_embeddings": False, "rope_theta": 10000.0, "torch_dtype": "float32",
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                          "original_max_position_embeddings": 64,
                          "beta_fast": 32.0, "beta_slow": 1.0}}
    rng = np.random.default_rng(7)
    w = hf.make_model(rng, c)
    # Stored as bf16, as published models are: the import keeps the checkpoint's master tensors
    # bf16 and ringd widens them to its fp32 masters. The reference uses the same bf16 values.
    w = {k: hf.bf16_bits_to_f32(hf.to_bf16_bits(v)) for k, v in w.items()}
    hf_dir, ck = os.path.join(work, "hf"), os.path.join(work, "imported")
    hf.save_hf(hf_dir, c, w, "BF16")
    hf.run([ringctl, "import", hf_dir, "-o", ck])

    ids = rng.integers(0, c["vocab_size"], size=SEQ)
    write_token_dataset(os.path.join(work, "tokens"), ids, c["vocab_size"])
    model_section = open(os.path.join(ck, "model.yaml")).read()
    spec = f"""{model_section}
job:
  name: finetune-e2e
data:
  source: tokens
  paths: [{os.path.join(work, "tokens")}]
  seq_len: {SEQ}
  seed: 1
parallel:
  context_ranks: 2
  ring_order: natural
optimizer:
  lr: 3.0e-3
  lr_warmup_steps: 0
  weight_decay: 0.0
  offload: cpu
train:
  steps: {STEPS}
  seed: 1
  log_every: 1
checkpoint:
  dir: checkpoints
  every_steps: 0
resources:
  nodes: 1
  workers_per_node: 2
  backend: cpu
  cpus_per_worker: 1
restart:
  max_restarts: 0
"""
    spec_path = os.path.join(work, "finetune.yaml")
    open(spec_path, "w").write(spec)
    job_dir = os.path.join(work, "job")
    env = dict(os.environ, RING_COORD=f"ipc://{work}/sock/coord.sock",
               RING_STATE_DIR=os.path.join(work, "state"), UCX_TLS="self,posix",
               UCX_NET_DEVICES="lo")
    r = subprocess.run([ringctl, "run", spec_path, "--job-dir", job_dir], env=env,
                       capture_output=True, text=True, timeout=540)
    if r.returncode != 0:
        print(f"ringctl run failed ({r.returncode}):\n{r.stdout}{r.stderr}", file=sys.stderr)
        for log in sorted(os.listdir(os.path.join(job_dir, "logs"))) if os.path.isdir(
                os.path.join(job_dir, "logs")) else []:
            print(f"--- {log}\n" + open(os.path.join(job_dir, "logs", log)).read()[-3000:],
                  file=sys.stderr)
        return 1
    steps = [json.loads(line) for line in open(os.path.join(job_dir, "steps.jsonl"))
             if line.strip()]
    steps = [s for s in steps if "loss" in s]
    if len(steps) != STEPS:
        print(f"expected {STEPS} step records, got {len(steps)}", file=sys.stderr)
        return 1

    with torch.no_grad():
        x = torch.from_numpy(ids.astype(np.int64))[None]
        logits = hf.hf_forward(c, w, x)[0]
        ref = torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()
    first, last = steps[0]["loss"], steps[-1]["loss"]
    rel = abs(first - ref) / abs(ref)
    failures = 0
    print(f"step 1 loss {first:.8f} vs PyTorch {ref:.8f} (rel {rel:.2e}, tolerance {TOL:.0e})")
    failures += rel > TOL
    print(f"loss after {STEPS} steps: {last:.6f} ({'lower' if last < first else 'NOT lower'})")
    failures += not last < first

    # The final checkpoint's master weights moved away from the import.
    final = hf.ckpt_tensors(os.path.join(job_dir, "checkpoints"))
    start = hf.ckpt_tensors(ck)
    moved = [n for n in start if n.startswith("master/") and final[n][1] != start[n][1]]
    print(f"{len(moved)} of {len(start)} master tensors changed by training")
    failures += len(moved) != len([n for n in start if n.startswith("master/")])
    if len(sys.argv) <= 2 and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
