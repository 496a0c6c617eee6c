#!/usr/bin/python3
"""Logits parity of `ringctl import` against an independent PyTorch Hugging Face Llama forward,
and the export -> import round trip.

Usage: hf_parity.py RINGCTL ST_FORWARD [WORKDIR]

For each case (GQA or not, tied or untied embeddings, two rope_theta values, bf16, fp16 and
fp32 storage, RoPE scaling none / linear / llama3 / yarn) this writes a small random Llama in the
Hugging Face layout (config.json, two
.safetensors shards and model.safetensors.index.json, written here with numpy from the format's
definition), imports it with `ringctl import`, runs ringmaster's forward on the imported master
weights (st_forward, CPU backend, fp32) and compares the logits and the per-sequence mean
next-token loss with the forward below, written from the published Llama architecture (RMSNorm,
rotate-half RoPE with rope_theta, grouped-query attention, SwiGLU MLP, tied/untied head) in fp32.
Tolerance: max |logit difference| <= 1e-5 x max |logit|, loss relative difference <= 1e-5.

st_forward takes the model from the checkpoint's record (ckpt::read_checkpoint_model), so the
parity also checks that the record carries rope_theta, the scaling and rms_norm_eps.

Then `ringctl export --dtype fp32` (and, without --dtype, the model's dtype bf16 for the bf16 case): the exported tensors must equal
the source tensors bit for bit (fp32: the same bytes; a bf16 source exported as bf16: the same
bytes); the import must keep the source's precision in the checkpoint (bf16 / f16 master
tensors for a 16-bit source); importing the fp32 export must give master tensors of the same
values as the first import, and importing a bf16 export of a bf16 source the same bytes. Exit 0 on success, 1 on a mismatch, 77 when torch cannot be imported (skip).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except Exception as e:  # pragma: no cover
    print(f"hf_parity.py: cannot import numpy/torch ({e}); skipping", file=sys.stderr)
    sys.exit(77)

TOL = 1e-5


# ---- safetensors, from the format's definition ---------------------------------------------

def to_bf16_bits(a):
    """fp32 -> bf16 bits, round to nearest even (as torch does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, fp32 array); dtype 'F32', 'BF16' or 'F16'."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors:
        raw = (np.ascontiguousarray(a, dtype="<f4").tobytes() if dtype == "F32"
               else np.ascontiguousarray(a, dtype="<f2").tobytes() if dtype == "F16"
               else to_bf16_bits(a).astype("<u2").tobytes())
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[name] = (v["dtype"], tuple(v["shape"]), data[8 + n + b:8 + n + e])
    return out


def read_model_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx)
             else ["model.safetensors"])
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(d, f)))
    return out


# ---- a random Hugging Face Llama --------------------------------------------------------------

def make_model(rng, c):
    d, hd, H, KH, F, V = c["hidden_size"], c["head_dim"], c["num_attention_heads"], \
        c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]
    s = 0.15
    w = {"model.embed_tokens.weight": rng.standard_normal((V, d)) * 0.5}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
        w[p + "self_attn.q_proj.weight"] = rng.standard_normal((H * hd, d)) * s
        w[p + "self_attn.k_proj.weight"] = rng.standard_normal((KH * hd, d)) * s
        w[p + "self_attn.v_proj.weight"] = rng.standard_normal((KH * hd, d)) * s
        w[p + "self_attn.o_proj.weight"] = rng.standard_normal((d, H * hd)) * s
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
        w[p + "mlp.gate_proj.weight"] = rng.standard_normal((F, d)) * s
        w[p + "mlp.up_proj.weight"] = rng.standard_normal((F, d)) * s
        w[p + "mlp.down_proj.weight"] = rng.standard_normal((d, F)) * s
    w["model.norm.weight"] = 1 + 0.1 * rng.standard_normal(d)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.standard_normal((V, d)) * s
    return {k: v.astype(np.float32) for k, v in w.items()}


def save_hf(d, c, w, dtype):
    os.makedirs(d, exist_ok=True)
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    names = list(w)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    wm = {}
    for i, part in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(d, fn), [(n, w[n]) for n in part], dtype)
        for n in part:
            wm[n] = fn
    json.dump({"metadata": {"total_size": 0}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)


# ---- the reference forward (Hugging Face Llama, fp32) -----------------------------------------

def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(c, hd):
    """inv_freq [hd/2] (fp32) and the cos/sin factor of config c, with transformers' semantics
    (modeling_rope_utils: default, linear, llama3, yarn), computed here in fp64 from the
    published formulas."""
    base = c["rope_theta"]
    inv = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    r = c.get("rope_scaling") or {}
    kind, factor, att = r.get("rope_type", "default"), r.get("factor", 1.0), 1.0
    if kind == "linear":
        inv = inv / factor
    elif kind == "llama3":
        old = r["original_max_position_embeddings"]
        lo, hi = r["low_freq_factor"], r["high_freq_factor"]
        wavelen = 2 * np.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = np.where(wavelen > old / lo, inv / factor, np.where(wavelen < old / hi, inv, mid))
    elif kind == "yarn":
        old = r["original_max_position_embeddings"]
        bf, bs = r.get("beta_fast", 32), r.get("beta_slow", 1)

        def corr(rot):  # the dimension whose wavelength makes `rot` turns over `old` positions
            return hd * np.log(old / (rot * 2 * np.pi)) / (2 * np.log(base))
        low, high = max(np.floor(corr(bf)), 0), min(np.ceil(corr(bs)), hd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(hd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        inv = inv / factor * (1 - extrapolation) + inv * extrapolation
        att = 0.1 * np.log(factor) + 1.0 if factor > 1 else 1.0
    return torch.from_numpy(inv.astype(np.float32)), att


def hf_forward(c, w, ids):
    """ids: [B, T] int64 -> logits [B, T, V] fp32."""
    W = {k: torch.from_numpy(v) for k, v in w.items()}
    B, T = ids.shape
    H, KH, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    inv_freq, att = rope_inv_freq(c, hd)
    pos = torch.arange(T, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * att)[None, None], (emb.sin() * att)[None, None]  # [1, 1, T, hd]
    mask = torch.full((T, T), float("-inf")).triu(1)
    x = W["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, KH, hd).transpose(1, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, KH, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KH, dim=1)
        v = v.repeat_interleave(H // KH, dim=1)
        s = q @ k.transpose(-1, -2) / (hd ** 0.5) + mask
        o = torch.softmax(s, dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, T, H * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["embed_tokens" if False else "model.embed_tokens.weight"] if c["tie_word_embeddings"] \
        else W["lm_head.weight"]
    return x @ head.T


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAILED: {' '.join(cmd)}\n{r.stdout}{r.stderr}", file=sys.stderr)
        sys.exit(1)
    return r


def ckpt_tensors(ckpt):
    """name -> (shape, the values as fp32 bytes): a master tensor kept as bf16 or f16 (an import
    of a 16-bit model) compares equal to the same values in fp32."""
    step = open(os.path.join(ckpt, "latest")).read().strip()
    man = json.load(open(os.path.join(ckpt, step, "node-00000.json")))
    data = open(os.path.join(ckpt, step, man.get("data_file", "node-00000.bin")), "rb").read()
    out = {}
    for t in man["tensors"]:
        raw = data[t["offset"]:t["offset"] + t["bytes"]]
        if t["dtype"] == "bf16":
            raw = bf16_bits_to_f32(np.frombuffer(raw, "<u2")).tobytes()
        elif t["dtype"] == "f16":
            raw = np.frombuffer(raw, "<f2").astype("<f4").tobytes()
        out[t["name"]] = (tuple(t["shape"]), raw)
    return out


def ckpt_raw(ckpt):
    """name -> (dtype, the bytes on disk)."""
    step = open(os.path.join(ckpt, "latest")).read().strip()
    man = json.load(open(os.path.join(ckpt, step, "node-00000.json")))
    data = open(os.path.join(ckpt, step, man.get("data_file", "node-00000.bin")), "rb").read()
    return {t["name"]: (t["dtype"], data[t["offset"]:t["offset"] + t["bytes"]]) for t in man["tensors"]}


def ckpt_dtypes(ckpt):
    return {n: v[0] for n, v in ckpt_raw(ckpt).items()}


def main():
    ringctl, fwd = sys.argv[1], sys.argv[2]
    work = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="hf-parity-")
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
            "vocab_size": 301, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
            "attention_bias": False, "rope_scaling": None, "torch_dtype": "float32"}
    # Context-extension scalings, with an original context (16) below the test's 40 positions.
    linear = {"rope_type": "linear", "factor": 4.0}
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0}
    cases = [
        # name, heads, kv_heads, head_dim, tied, theta, storage, rope_scaling
        ("mha_untied_1e4_f32", 4, 4, 16, False, 10000.0, "F32", None),
        ("gqa_tied_5e5_f32", 4, 2, 32, True, 500000.0, "F32", None),
        ("gqa_untied_1e4_bf16", 8, 2, 8, False, 10000.0, "BF16", None),
        ("mha_tied_5e5_bf16", 4, 4, 16, True, 500000.0, "BF16", None),
        ("gqa_untied_1e4_f16", 4, 2, 16, False, 10000.0, "F16", None),
        ("gqa_linear4_f32", 4, 2, 16, False, 10000.0, "F32", linear),
        ("gqa_llama3x8_f32", 4, 2, 32, True, 500000.0, "F32", llama3),
        ("gqa_yarn4_f32", 4, 2, 32, False, 10000.0, "F32", yarn),
    ]
    B, T = 2, 40
    failures = 0
    for ci, (name, H, KH, hd, tied, theta, dtype, scaling) in enumerate(cases):
        rng = np.random.default_rng(1000 + ci)
        c = dict(base, num_attention_heads=H, num_key_value_heads=KH, head_dim=hd,
                 tie_word_embeddings=tied, rope_theta=theta, rope_scaling=scaling,
                 torch_dtype={"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype])
        if name.startswith("mha"):
            del c["head_dim"]  # derived: hidden_size / heads
            c["_hd"] = hd
        w = make_model(rng, dict(c, head_dim=hd))
        if dtype == "BF16":  # what the file holds, as fp32
            w = {k: bf16_bits_to_f32(to_bf16_bits(v)) for k, v in w.items()}
        if dtype == "F16":
            w = {k: v.astype(np.float16).astype(np.float32) for k, v in w.items()}
        hf_dir, ck = os.path.join(work, name, "hf"), os.path.join(work, name, "ckpt")
        shutil.rmtree(os.path.join(work, name), ignore_errors=True)
        cfg = {k: v for k, v in c.items() if k != "_hd"}
        save_hf(hf_dir, cfg, w, dtype)
        run([ringctl, "import", hf_dir, "-o", ck])
        ids = rng.integers(0, c["vocab_size"], size=(B, T)).astype(np.int32)
        ids.tofile(os.path.join(work, name, "ids.i32"))
        out = os.path.join(work, name, "ring")
        run([fwd, ck, os.path.join(work, name, "ids.i32"), out, str(T)])
        ring_logits = np.fromfile(out + ".logits.f32", dtype=np.float32).reshape(B, T, -1)
        ring_loss = np.fromfile(out + ".loss.f64", dtype=np.float64)
        with torch.no_grad():
            ref = hf_forward(dict(c, head_dim=hd), w, torch.from_numpy(ids.astype(np.int64)))
            ref_loss = [torch.nn.functional.cross_entropy(ref[b, :-1], torch.from_numpy(
                ids[b, 1:].astype(np.int64))).item() for b in range(B)]
        ref = ref.numpy()
        rel = np.abs(ring_logits - ref).max() / np.abs(ref).max()
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(ring_loss, ref_loss))
        ok = rel <= TOL and loss_rel <= TOL
        print(f"{name}: logits max|diff|/max|ref| = {rel:.2e}, loss {ring_loss[0]:.6f} vs "
              f"{ref_loss[0]:.6f} (rel {loss_rel:.2e}) {'ok' if ok else 'FAIL'}")
        failures += not ok

        # Export (fp32, forced into several files) and import again.
        exp = os.path.join(work, name, "export")
        run([ringctl, "export", ck, "-o", exp, "--dtype", "fp32", "--shard-size", "0.00005"])
        src, got = read_model_dir(hf_dir), read_model_dir(exp)
        if set(src) != set(got):
            print(f"{name}: export names differ: {sorted(set(src) ^ set(got))}")
            failures += 1
        for n, (dt, shape, raw) in src.items():
            want = (raw if dt == "F32" else
                    np.frombuffer(raw, "<f2").astype("<f4").tobytes() if dt == "F16" else
                    bf16_bits_to_f32(np.frombuffer(raw, "<u2")).tobytes())
            if n in got and (got[n][1] != shape or got[n][2] != want):
                print(f"{name}: exported {n} differs from the source")
                failures += 1
        if dtype == "BF16":
            exp16 = os.path.join(work, name, "export-bf16")
            run([ringctl, "export", ck, "-o", exp16])  # the model's dtype (bf16), one file
            got16 = read_model_dir(exp16)
            bad = [n for n in src if got16.get(n, (0, 0, b""))[2] != src[n][2]]
            if bad:
                print(f"{name}: bf16 export differs from the bf16 source: {bad[:3]}")
                failures += 1
        # The import keeps the source's precision: bf16 in, bf16 master tensors.
        want_dt = {"F32": "f32", "BF16": "bf16", "F16": "f16"}[dtype]
        kept = set(ckpt_dtypes(ck).values())
        if kept != {want_dt}:
            print(f"{name}: a {dtype} import stored master tensors as {sorted(kept)}")
            failures += 1
        ck2 = os.path.join(work, name, "ckpt2")
        run([ringctl, "import", exp, "-o", ck2])
        a, b = ckpt_tensors(ck), ckpt_tensors(ck2)
        same = a.keys() == b.keys() and all(a[k] == b[k] for k in a)
        print(f"{name}: export fp32 ({len(got)} tensors, "
              f"{len([f for f in os.listdir(exp) if f.endswith('.safetensors')])} files) -> import: "
              f"{'bit-identical' if same else 'DIFFERENT'} master values")
        failures += not same
        if dtype == "BF16":  # bf16 out and in again: the same bytes on disk
            ck3 = os.path.join(work, name, "ckpt3")
            run([ringctl, "import", exp16, "-o", ck3])
            same16 = ckpt_raw(ck) == ckpt_raw(ck3)
            print(f"{name}: export bf16 -> import: {'bit-identical' if same16 else 'DIFFERENT'}")
            failures += not same16
    if len(sys.argv) <= 3:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
