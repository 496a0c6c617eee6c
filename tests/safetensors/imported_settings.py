#!/usr/bin/python3
"""An imported model's settings follow it everywhere (issue 36): rope_theta 5e5, llama3 RoPE
scaling and rms_norm_eps 1e-6 reach `ringctl generate` (no --spec), the forward that reads the
checkpoint's record (st_forward) and `model.init_from` (ring-worker alone), each checked against
a float64 reference written here from the published Llama architecture and transformers' llama3
rope formula.

Usage: imported_settings.py RINGCTL RING_WORKER ST_FORWARD [WORKDIR]

A random Llama (GQA, untied head, head_dim 16, vocab 300, llama3 factor 8 over an original
context of 16, so most pairs are rescaled at the test's 40-64 positions) is written in the
Hugging Face layout (hf_parity.py's writer, fp32), imported, and its model.yaml removed (the
checkpoint alone must say the model). Checked:
- st_forward (the model from ckpt::read_checkpoint_model) gives the float64 logits within
  1e-5 x max |logit| (fp32 compute);
- `ringctl generate --json` (greedy, byte prompt) gives the float64 reference's greedy tokens
  (each step's top-2 gap in the reference is reported, and must exceed 1e-3 x max |logit| so
  that fp32 rounding cannot flip it); the reference with the settings lost (rope_theta 10000,
  no scaling, eps 1e-5: what generate assumed before) is shown to disagree;
- ring-worker alone with model.init_from (the spec's model section as import wrote it) gives a
  step-1 loss equal to the float64 reference's mean next-token cross-entropy within 1e-5
  relative, and a spec that says rope_theta 10000 is refused naming rope_theta and both values.
Exit 0 on success, 1 on a mismatch, 77 when numpy/torch cannot be imported (skip).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_parity as hf  # noqa: E402  (exits 77 itself when numpy/torch are missing)
import finetune_e2e as fe  # noqa: E402

import numpy as np  # noqa: E402

TOL = 1e-5


def inv_freq64(c, hd):
    """transformers' default and llama3 inv_freq, float64."""
    inv = 1.0 / (c["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    r = c.get("rope_scaling") or {}
    if r.get("rope_type", "default") == "llama3":
        f, old = r["factor"], r["original_max_position_embeddings"]
        lo, hi = r["low_freq_factor"], r["high_freq_factor"]
        wl = 2 * np.pi / inv
        s = (old / wl - lo) / (hi - lo)
        inv = np.where(wl > old / lo, inv / f, np.where(wl < old / hi, inv, (1 - s) * inv / f + s * inv))
    return inv


def forward64(c, w, ids):
    """ids [T] -> logits [T, V], float64, rotate-half RoPE as Hugging Face Llama."""
    W = {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}
    T = len(ids)
    H, KH, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq64(c, hd)[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rot(x):  # [heads, T, hd]
        return np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)

    x = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd).transpose(1, 0, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KH, hd).transpose(1, 0, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KH, hd).transpose(1, 0, 2)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = np.repeat(k, H // KH, 0), np.repeat(v, H // KH, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        x = x + o.transpose(1, 0, 2).reshape(T, H * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = norm(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def greedy64(c, w, prompt, n):
    ids, gaps = list(prompt), []
    for _ in range(n):
        logits = forward64(c, w, np.array(ids))[-1]
        top = np.sort(logits)[-2:]
        gaps.append((top[1] - top[0]) / np.abs(logits).max())
        ids.append(int(np.argmax(logits)))
    return ids[len(prompt):], min(gaps)


def main():
    ringctl, worker, fwd = sys.argv[1], sys.argv[2], sys.argv[3]
    work = sys.argv[4] if len(sys.argv) > 4 else tempfile.mkdtemp(prefix="imported-settings-")
    os.makedirs(work, exist_ok=True)
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "vocab_size": 300,
         "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "attention_bias": False,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "tie_word_embeddings": False, "rope_theta": 500000.0, "torch_dtype": "float32",
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}
    rng = np.random.default_rng(36)
    w = {k: v.astype(np.float32) for k, v in hf.make_model(rng, c).items()}
    hf_dir, ck = os.path.join(work, "hf"), os.path.join(work, "imported")
    shutil.rmtree(work, ignore_errors=True)
    hf.save_hf(hf_dir, c, w, "F32")
    hf.run([ringctl, "import", hf_dir, "-o", ck])
    model_section = open(os.path.join(ck, "model.yaml")).read()
    os.remove(os.path.join(ck, "model.yaml"))  # the checkpoint alone says the model
    failures = 0

    # 1. The forward that reads the checkpoint's record: logits.
    T = 48
    ids = rng.integers(0, c["vocab_size"], size=T).astype(np.int32)
    ids.tofile(os.path.join(work, "tokens.i32"))
    hf.run([fwd, ck, os.path.join(work, "tokens.i32"), os.path.join(work, "fwd"), str(T)])
    got = np.fromfile(os.path.join(work, "fwd.logits.f32"), dtype=np.float32).reshape(T, -1)
    ref = forward64(c, w, ids)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    print(f"st_forward logits vs float64: max|diff|/max|ref| = {rel:.2e} (tolerance {TOL:.0e})")
    failures += not rel <= TOL

    # 2. generate, no --spec: greedy tokens.
    prompt = b"The settings of an imported model follow it."
    open(os.path.join(work, "prompt.txt"), "wb").write(prompt)
    N = 12
    r = subprocess.run([ringctl, "generate", "--checkpoint", ck, os.path.join(work, "prompt.txt"),
                        "--json", "--max-tokens", str(N), "--threads", "2"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"ringctl generate failed:\n{r.stdout}{r.stderr}", file=sys.stderr)
        return 1
    tokens = json.loads(r.stdout)["prompts"][0]["tokens"]
    want, gap = greedy64(c, w, list(prompt), N)
    print(f"generate tokens {tokens}\nfloat64 greedy  {want} (smallest top-2 gap "
          f"{gap:.2e} x max|logit|)")
    failures += tokens != want or not gap > 1e-3
    lost = dict(c, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5)
    wrong, _ = greedy64(lost, w, list(prompt), N)
    print(f"with the settings lost  {wrong} ({'differs' if wrong != want else 'SAME: no teeth'})")
    failures += wrong == want

    # 3. model.init_from in ring-worker alone: step 1's loss, and a contradicting spec refused.
    fe.write_token_dataset(os.path.join(work, "tokens"), ids, c["vocab_size"])

    def worker_run(name, section):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        spec = os.path.join(d, "spec.yaml")
        open(spec, "w").write(f"""{section}
job:
  name: imported-settings
data:
  source: tokens
  paths: [{os.path.join(work, "tokens")}]
  seq_len: {T}
  seed: 1
optimizer:
  lr: 1.0e-3
  lr_warmup_steps: 0
train:
  steps: 1
  seed: 1
  log_every: 1
""")
        return subprocess.run([worker, "--spec", spec, "--single-rank", "--steps", "1",
                               "--threads", "2", "--log-json", os.path.join(d, "steps.jsonl")],
                              capture_output=True, text=True, timeout=300), d

    r, d = worker_run("init", model_section)
    if r.returncode != 0:
        print(f"ring-worker failed:\n{r.stdout}{r.stderr}", file=sys.stderr)
        return 1
    losses = [json.loads(x)["loss"] for x in open(os.path.join(d, "steps.jsonl"))
              if x.strip() and "loss" in json.loads(x)]
    z = ref[:-1] - ref[:-1].max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    ref_loss = float(np.mean(lse - z[np.arange(T - 1), ids[1:]]))
    lrel = abs(losses[0] - ref_loss) / abs(ref_loss)
    print(f"init_from step 1 loss {losses[0]:.8f} vs float64 {ref_loss:.8f} (rel {lrel:.2e})")
    failures += not lrel <= TOL
    bad = model_section.replace("rope_theta: 500000", "rope_theta: 10000")
    assert bad != model_section
    r, _ = worker_run("refused", bad)
    named = r.returncode != 0 and "rope_theta 500000.0 (this job: 10000.0)" in r.stdout + r.stderr
    print(f"init_from with rope_theta 10000: {'refused naming rope_theta' if named else 'NOT refused'}")
    if not named:
        print(r.stdout + r.stderr, file=sys.stderr)
    failures += not named
    if len(sys.argv) <= 4 and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
