#!/usr/bin/python3
"""`ringctl eval` on an imported random model against a float64 reference (issue 36).

Usage: eval_test.py RINGCTL ST_FORWARD [WORKDIR]

A random Llama in the Hugging Face layout (GQA, untied head, vocab 300, rope_theta 5e5 with
llama3 scaling and rms_norm_eps 1e-6: imported_settings.py's model) is written, imported, and its
model.yaml removed (the checkpoint's record alone says the model). A token dataset of three
documents (1100, 64 and 23 ids; one crosses the 1K position bucket) is evaluated. Checked:
- the mean loss equals the float64 reference's mean next-token cross-entropy over every
  document within 1e-6 relative, and the perplexity is exp(loss);
- --logits is a real .npy of float32 [tokens, vocab] (numpy reads it) whose rows equal the
  float64 reference's logits within 4e-6 x max|logit| (fp32 compute over 2 layers; measured
  1.1e-6), and the rows of the 64-token document are bit for bit those of st_forward
  (the same fp32 forward, one document at a time);
- position buckets: [0, 1K) holds every labelled position below 1024 and [1K, 4K) the rest,
  each bucket's mean equals the reference's mean over those positions within 1e-6 relative,
  and the buckets' sums weighted by counts give the mean;
- over 4 ranks (--ranks 4, ring attention over UCX) the loss equals one process's within 1e-6
  relative and the logits within 4e-6 x max|logit|;
- bad input: a missing checkpoint, a dataset whose ids need a larger vocab than the model's,
  and bad --passkey depths, each refused naming the flag or file and the sizes.
Exit 0 on success, 1 on a mismatch, 77 when numpy/torch cannot be imported (skip).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "safetensors"))
import hf_parity as hf  # noqa: E402  (exits 77 itself when numpy/torch are missing)
import imported_settings as ims  # noqa: E402

import numpy as np  # noqa: E402

LOSS_TOL = 1e-6
LOGIT_TOL = 4e-6
UCX_LOCAL = {"UCX_TLS": "self,posix", "UCX_NET_DEVICES": "lo"}


def write_tokens(prefix, docs, vocab):
    """<prefix>.bin (uint16) and .idx (docs/data.md: 48-byte header + offsets), several docs."""
    ids = np.concatenate([np.asarray(d) for d in docs]).astype("<u2")
    ids.tofile(prefix + ".bin")
    offsets = np.cumsum([0] + [len(d) for d in docs]).astype("<u8")
    with open(prefix + ".idx", "wb") as f:
        f.write(b"RINGTOK\0")
        f.write(struct.pack("<IIQQQQ", 1, 2, len(docs), len(ids), vocab, 0))
        f.write(offsets.tobytes())


def ringctl_eval(ringctl, args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([ringctl, "eval"] + args, capture_output=True, text=True, env=e,
                          timeout=500)


def rel(a, b):
    return abs(a - b) / abs(b)


def main():
    ringctl, fwd = sys.argv[1], sys.argv[2]
    work = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="eval-test-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "vocab_size": 300,
         "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "attention_bias": False,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "tie_word_embeddings": False, "rope_theta": 500000.0, "torch_dtype": "float32",
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}
    rng = np.random.default_rng(3636)
    w = {k: v.astype(np.float32) for k, v in hf.make_model(rng, c).items()}
    hf_dir, ck = os.path.join(work, "hf"), os.path.join(work, "imported")
    hf.save_hf(hf_dir, c, w, "F32")
    hf.run([ringctl, "import", hf_dir, "-o", ck])
    os.remove(os.path.join(ck, "model.yaml"))  # the checkpoint alone says the model
    V = c["vocab_size"]
    docs = [rng.integers(0, V, size=n) for n in (1100, 64, 23)]
    data = os.path.join(work, "tokens")
    write_tokens(data, docs, V)
    failures = 0

    # The float64 reference: logits and per-position cross-entropy of each document.
    ref_logits, ref_ce, ref_pos = [], [], []
    for d in docs:
        lg = ims.forward64(c, w, d)
        z = lg[:-1] - lg[:-1].max(-1, keepdims=True)
        ce = np.log(np.exp(z).sum(-1)) - z[np.arange(len(d) - 1), d[1:]]
        ref_logits.append(lg)
        ref_ce.append(ce)
        ref_pos.append(np.arange(len(d) - 1))
    ref_ce, ref_pos = np.concatenate(ref_ce), np.concatenate(ref_pos)
    ref_loss = float(ref_ce.mean())
    ref_all = np.concatenate(ref_logits)
    scale = np.abs(ref_all).max()

    def run_eval(name, extra, env=None):
        npy = os.path.join(work, name + ".npy")
        r = ringctl_eval(ringctl, ["--checkpoint", ck, "--data", data, "--source", "tokens",
                                   "--json", "--threads", "2", "--logits", npy] + extra, env)
        if r.returncode != 0:
            print(f"ringctl eval ({name}) failed:\n{r.stdout}{r.stderr}", file=sys.stderr)
            sys.exit(1)
        return json.loads(r.stdout), np.load(npy), r.stderr

    one, lg1, err1 = run_eval("p1", [])
    # 1. Loss and perplexity.
    lr = rel(one["loss"], ref_loss)
    print(f"loss {one['loss']:.10f} vs float64 {ref_loss:.10f}: rel {lr:.2e} (tolerance {LOSS_TOL:.0e})")
    failures += not lr <= LOSS_TOL
    failures += not abs(one["perplexity"] - np.exp(one["loss"])) <= 1e-12 * np.exp(one["loss"])
    failures += one["scored_tokens"] != len(ref_ce) or one["data"]["documents"] != 3
    failures += "eval: document 3/3" not in err1  # progress on stderr
    # 2. Logits: a real .npy [tokens, vocab] float32.
    ok_shape = lg1.dtype == np.float32 and lg1.shape == (sum(len(d) for d in docs), V)
    print(f"--logits: {lg1.dtype} {lg1.shape} ({'ok' if ok_shape else 'WRONG'})")
    failures += not ok_shape
    if ok_shape:
        lerr = np.abs(lg1 - ref_all).max() / scale
        print(f"logits vs float64: max|diff|/max|ref| = {lerr:.2e} (bound {LOGIT_TOL:.0e})")
        failures += not lerr <= LOGIT_TOL
        docs[1].astype(np.int32).tofile(os.path.join(work, "doc1.i32"))
        hf.run([fwd, ck, os.path.join(work, "doc1.i32"), os.path.join(work, "fwd"), "64"])
        st = np.fromfile(os.path.join(work, "fwd.logits.f32"), dtype=np.float32).reshape(64, V)
        same = np.array_equal(st, lg1[1100:1164])
        print(f"document 2's rows vs st_forward: {'bit for bit' if same else 'DIFFER'}")
        failures += not same
    # 3. Position buckets.
    b = {x["range"]: x for x in one["buckets"]}
    for name, lo, hi in (("[0, 1K)", 0, 1024), ("[1K, 4K)", 1024, 4096)):
        sel = (ref_pos >= lo) & (ref_pos < hi)
        want_n, want = int(sel.sum()), float(ref_ce[sel].mean())
        got_n, got = b[name]["tokens"], b[name]["loss"]
        print(f"bucket {name}: {got_n} tokens (want {want_n}), loss {got:.8f} vs {want:.8f}")
        failures += got_n != want_n or not rel(got, want) <= LOSS_TOL
    others = sum(x["tokens"] for x in one["buckets"] if x["range"] not in ("[0, 1K)", "[1K, 4K)"))
    weighted = sum(x["loss"] * x["tokens"] for x in one["buckets"] if x["tokens"])
    print(f"buckets weighted by counts: {weighted / one['scored_tokens']:.10f} (mean {one['loss']:.10f})")
    failures += others != 0 or not rel(weighted / one["scored_tokens"], one["loss"]) <= 1e-12
    # 4. Over 4 ranks.
    four, lg4, _ = run_eval("p4", ["--ranks", "4"], UCX_LOCAL)
    l4 = rel(four["loss"], one["loss"])
    e4 = np.abs(lg4 - lg1).max() / scale
    print(f"4 ranks: loss {four['loss']:.10f} (rel {l4:.2e} to 1 rank), logits {e4:.2e} x max|logit|")
    failures += four["ranks"] != 4 or not l4 <= LOSS_TOL or not e4 <= LOGIT_TOL

    # 5. Bad input.
    def refused(args, code, *needles):
        r = ringctl_eval(ringctl, args)
        out = r.stdout + r.stderr
        ok = r.returncode == code and all(n in out for n in needles)
        print(f"refused {' '.join(args[-4:])}: {'ok' if ok else 'NOT AS EXPECTED'}")
        if not ok:
            print(f"  exit {r.returncode}: {out}", file=sys.stderr)
        return not ok

    missing = os.path.join(work, "no-such-ckpt")
    failures += refused(["--checkpoint", missing, "--data", data, "--source", "tokens"], 1,
                        f"--checkpoint {missing}")
    big = os.path.join(work, "big")
    write_tokens(big, [rng.integers(0, 400, size=30)], 400)
    needed = int(np.fromfile(big + ".bin", dtype="<u2").max()) + 1
    failures += refused(["--checkpoint", ck, "--data", big, "--source", "tokens"], 1,
                        f"--data {big}", f"vocab of {needed}", "has vocab 300")
    failures += refused(["--checkpoint", ck, "--passkey", "0.1,1.5", "--passkey-len", "256"], 2,
                        "--passkey", "'1.5'", "outside [0, 1]")
    failures += refused(["--checkpoint", ck, "--passkey", "0.1,deep", "--passkey-len", "256"], 2,
                        "--passkey", "'deep'")
    failures += refused(["--checkpoint", ck, "--passkey", "0.5"], 2, "--passkey-len")
    if len(sys.argv) <= 3 and not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
