#!/usr/bin/python3
"""Independent attention reference for tests/kernels/attention_test.cc (PyTorch 1.13, float64).

Usage: torch_attention.py DIR [DIR...]   (one case per directory; one torch import for all)

Each DIR holds meta.txt ("q_len kv_len heads kv_heads head_dim causal has_docs scale") and raw
little-endian files written by the test: q.bin [q_len, heads, head_dim], k.bin and v.bin
[kv_len, kv_heads, head_dim], dout.bin [q_len, heads, head_dim] (float32), q_pos.bin / k_pos.bin
(int64), q_doc.bin / k_doc.bin (int32, when has_docs). Writes out.bin, lse.bin, dq.bin, dk.bin,
dv.bin (float32) computed by an explicit masked softmax attention in float64 with torch autograd
for the gradients of loss = sum(out * dout). Exits 3 with a message if torch cannot be imported.
"""
import array
import os
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure must be reported, not skipped
    print(f"torch_attention.py: cannot import torch ({e!r}); install python3-torch "
          "(scripts/install-deps.sh)", file=sys.stderr)
    sys.exit(3)


def load(d, name, dtype, shape):
    with open(os.path.join(d, name), "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=dtype).reshape(shape).clone()


def run_case(d):
    with open(os.path.join(d, "meta.txt")) as f:
        fields = f.read().split()
    q_len, kv_len, heads, kv_heads, hd, causal, has_docs = (int(x) for x in fields[:7])
    scale = float(fields[7])
    group = heads // kv_heads

    q = load(d, "q.bin", torch.float32, (q_len, heads, hd)).double().requires_grad_()
    k = load(d, "k.bin", torch.float32, (kv_len, kv_heads, hd)).double().requires_grad_()
    v = load(d, "v.bin", torch.float32, (kv_len, kv_heads, hd)).double().requires_grad_()
    dout = load(d, "dout.bin", torch.float32, (q_len, heads, hd)).double()
    q_pos = load(d, "q_pos.bin", torch.int64, (q_len,))
    k_pos = load(d, "k_pos.bin", torch.int64, (kv_len,))

    allowed = torch.ones(q_len, kv_len, dtype=torch.bool)
    if causal:
        allowed &= k_pos[None, :] <= q_pos[:, None]
    if has_docs:
        q_doc = load(d, "q_doc.bin", torch.int32, (q_len,))
        k_doc = load(d, "k_doc.bin", torch.int32, (kv_len,))
        allowed &= q_doc[:, None] == k_doc[None, :]

    # GQA: query head h uses kv head h // group.
    k_rep = k.repeat_interleave(group, dim=1)  # [kv_len, heads, hd]
    v_rep = v.repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k_rep) * scale  # [heads, q_len, kv_len]
    # A large finite fill (not -inf) keeps fully masked rows NaN-free in autograd; their
    # probabilities are zeroed by the mask below and their lse reported as -inf.
    s = s.masked_fill(~allowed[None], -1e300)
    lse = torch.logsumexp(s, dim=-1)  # [heads, q_len]
    p = torch.exp(s - lse[..., None]) * allowed[None]
    out = torch.einsum("hij,jhd->ihd", p, v_rep)
    (out * dout).sum().backward()

    row_any = allowed.any(dim=1)  # [q_len]
    lse = torch.where(row_any[None, :], lse, torch.tensor(float("-inf"), dtype=torch.float64))
    outputs = {
        "out.bin": out.detach(),
        "lse.bin": lse.detach().t().contiguous(),  # [q_len, heads]
        "dq.bin": q.grad,
        "dk.bin": k.grad,
        "dv.bin": v.grad,
    }
    for name, t in outputs.items():
        with open(os.path.join(d, name), "wb") as f:
            array.array("f", t.float().flatten().tolist()).tofile(f)  # native = little endian


def main():
    if len(sys.argv) < 2:
        print("usage: torch_attention.py DIR [DIR...]", file=sys.stderr)
        sys.exit(2)
    for d in sys.argv[1:]:
        run_case(d)


if __name__ == "__main__":
    main()
