#!/usr/bin/python3
"""PyTorch 1.13 reference of ringmaster's decoder-only transformer (worker/model/model.h).

Usage: torch_model.py DIR [float64|float32]

Reads from DIR (written by tests/worker/model_test.cc):
  config.json   model hyper-parameters, the flat parameter layout (name, shape, offset), the token
                count T and global_valid; "bf16": true for the mixed precision of
                docs/precision.md (below)
  params.f32    [total] float32, the flat parameter buffer
  ids.i32 labels.i32 docs.i32 [T] int32, pos.i64 [T] int64
Writes to DIR:
  loss.f64      [1] float64, sum of cross-entropy over valid labels / global_valid
  grads.f64     [total] float64, d loss / d params in the same flat layout (gaps are 0)

Written with PyTorch's own ops and autograd (no fused attention or rms_norm: neither exists in
1.13): RMSNorm written out, RoPE on interleaved pairs at the given global positions, attention as
an explicit masked softmax with the causal (pos_k <= pos_q) and same-document mask, GQA by
repeating K/V heads. Exits with status 3 and a message when torch cannot be imported.

bf16 (the rounding points of worker/model/model.h, computed here in float64 between them): every
weight is used rounded to bf16; every matmul reads its input rounded to bf16 and the gradient
arriving at its output is rounded to bf16 before the matmul's backward (what the bf16 GEMMs read);
Q and K are rounded after RoPE, V after its projection, the attention output O after attention
(what the wo matmul reads, and what the model keeps for the backward: the attention backward's
rowsum(dO * O) uses the rounded O, written out in SavedBf16Attention). The weights' and
activations' own gradients pass the forward roundings straight through. Rounding is float -> float32 -> bfloat16
(round to nearest even), as the C++ side rounds its fp32 values.
"""
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # pragma: no cover - reported by the C++ test
    print(f"torch_model.py: cannot import torch/numpy ({e}); install python3-torch", file=sys.stderr)
    sys.exit(3)


def bf16(x):
    return x.to(torch.float32).to(torch.bfloat16).to(x.dtype)


class RoundForward(torch.autograd.Function):
    """Rounds the value to bf16; the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x):
        return bf16(x)

    @staticmethod
    def backward(ctx, g):
        return g


class RoundGradient(torch.autograd.Function):
    """The value unchanged; the gradient arriving here rounded to bf16."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return bf16(g)


def rmsnorm(x, g, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g


def rope(x, pos, theta, scaling=None):
    # x: [T, H, hd]; rotates (x[2j], x[2j+1]) by pos * theta^(-2j/hd). scaling: None, or
    # {"type": "linear"|"yarn", "factor", "original", "beta_fast", "beta_slow"} with the
    # transformers semantics (yarn: ramped interpolation, cos and sin times 0.1 ln(factor) + 1).
    hd = x.shape[-1]
    j = torch.arange(hd // 2, dtype=torch.float64)
    inv = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -2.0 * j / hd)
    mscale = 1.0
    if scaling and scaling["type"] == "linear":
        inv = inv / scaling["factor"]
    elif scaling and scaling["type"] == "yarn":
        import math
        factor, orig = scaling["factor"], scaling["original"]

        def corr(rot):
            return (hd * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

        low = max(math.floor(corr(scaling["beta_fast"])), 0)
        high = min(math.ceil(corr(scaling["beta_slow"])), hd - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((j - low) / (high - low), 0, 1)
        inv = inv / factor * ramp + inv * (1 - ramp)
        mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    c = (torch.cos(ang) * mscale).to(x.dtype)[:, None, :]
    s = (torch.sin(ang) * mscale).to(x.dtype)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


def attention(q, k, v, pos, docs, scale):
    # q: [T, H, hd]; k, v: [T, KH, hd] -> [T, H, hd]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    allowed = (pos[None, :] <= pos[:, None]) & (docs[:, None] == docs[None, :])
    s = s.masked_fill(~allowed[None, :, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hij,jhd->ihd", p, v)


class SavedBf16Attention(torch.autograd.Function):
    """attention() whose backward uses O rounded to bf16, as the bf16 model keeps it.

    FlashAttention's backward (kernels/, worker/model/model.h): dV = P^T dO, dP = dO V^T,
    D = rowsum(dO * O), dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q. Autograd through
    attention() computes D from the exact O; the model computes it from the O it kept in bf16.
    GQA: the K/V heads' gradients are summed over their query heads.
    """

    @staticmethod
    def forward(ctx, q, k, v, pos, docs, scale):
        group = q.shape[1] // k.shape[1]
        kr = k.repeat_interleave(group, dim=1)
        vr = v.repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", q, kr) * scale
        allowed = (pos[None, :] <= pos[:, None]) & (docs[:, None] == docs[None, :])
        s = s.masked_fill(~allowed[None, :, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("hij,jhd->ihd", p, vr)
        ctx.save_for_backward(q, kr, vr, p, bf16(o))
        ctx.scale, ctx.group = scale, group
        return o

    @staticmethod
    def backward(ctx, do):
        q, kr, vr, p, o_kept = ctx.saved_tensors
        scale, group = ctx.scale, ctx.group
        dvr = torch.einsum("hij,ihd->jhd", p, do)
        dp = torch.einsum("ihd,jhd->hij", do, vr)
        delta = (do * o_kept).sum(-1).t()  # [H, T]
        ds = p * (dp - delta[:, :, None])
        dq = torch.einsum("hij,jhd->ihd", ds, kr) * scale
        dkr = torch.einsum("hij,ihd->jhd", ds, q) * scale
        T, H, hd = dkr.shape
        dk = dkr.view(T, H // group, group, hd).sum(2)
        dv = dvr.view(T, H // group, group, hd).sum(2)
        return dq, dk, dv, None, None, None


def model_loss(cfg, P, ids, labels, pos, docs, global_valid):
    T = ids.shape[0]
    H, KH, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    eps, theta = cfg["norm_eps"], cfg["rope_theta"]
    mixed = cfg.get("bf16", False)
    if mixed:
        P = {n: RoundForward.apply(w) for n, w in P.items()}

    def lin(x, w):
        if not mixed:
            return x @ w.t()
        return RoundGradient.apply(RoundForward.apply(x) @ w.t())

    def rnd(x):
        return RoundForward.apply(x) if mixed else x

    x = P["embedding.weight"][ids.long()]
    for l in range(cfg["layers"]):
        p = f"layers.{l}."
        h = rmsnorm(x, P[p + "attn_norm.gain"], eps)
        q = lin(h, P[p + "attn.wq"]).view(T, H, hd)
        k = lin(h, P[p + "attn.wk"]).view(T, KH, hd)
        v = rnd(lin(h, P[p + "attn.wv"])).view(T, KH, hd)
        scaling = cfg.get("rope_scaling")
        q, k = rnd(rope(q, pos, theta, scaling)), rnd(rope(k, pos, theta, scaling))
        att = SavedBf16Attention.apply if mixed else attention
        o = rnd(att(q, k, v, pos, docs, 1.0 / (hd ** 0.5))).reshape(T, H * hd)
        x = x + lin(o, P[p + "attn.wo"])
        h = rmsnorm(x, P[p + "mlp_norm.gain"], eps)
        if cfg["mlp"] == "swiglu":
            a = F.silu(lin(h, P[p + "mlp.w_gate"])) * lin(h, P[p + "mlp.w_up"])
        else:
            a = F.gelu(lin(h, P[p + "mlp.w_up"]))
        x = x + lin(a, P[p + "mlp.w_down"])
    x = rmsnorm(x, P["final_norm.gain"], eps)
    w = P["embedding.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    logits = lin(x, w)
    return F.cross_entropy(logits, labels.long(), ignore_index=-1, reduction="sum") / global_valid


def main():
    d = sys.argv[1]
    dtype = torch.float64 if (len(sys.argv) < 3 or sys.argv[2] == "float64") else torch.float32
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))
    cfg = json.load(open(os.path.join(d, "config.json")))
    flat = np.fromfile(os.path.join(d, "params.f32"), dtype=np.float32)
    P = {}
    for v in cfg["params"]:
        t = torch.from_numpy(flat[v["offset"]:v["offset"] + v["size"]].copy()).to(dtype)
        P[v["name"]] = t.view(*v["shape"]).requires_grad_(True)
    ids = torch.from_numpy(np.fromfile(os.path.join(d, "ids.i32"), dtype=np.int32))
    labels = torch.from_numpy(np.fromfile(os.path.join(d, "labels.i32"), dtype=np.int32))
    pos = torch.from_numpy(np.fromfile(os.path.join(d, "pos.i64"), dtype=np.int64))
    docs = torch.from_numpy(np.fromfile(os.path.join(d, "docs.i32"), dtype=np.int32))
    loss = model_loss(cfg, P, ids, labels, pos, docs, float(cfg["global_valid"]))
    loss.backward()
    grads = np.zeros(cfg["total"], dtype=np.float64)
    for v in cfg["params"]:
        grads[v["offset"]:v["offset"] + v["size"]] = P[v["name"]].grad.reshape(-1).double().numpy()
    np.array([loss.item()], dtype=np.float64).tofile(os.path.join(d, "loss.f64"))
    grads.tofile(os.path.join(d, "grads.f64"))


if __name__ == "__main__":
    main()
