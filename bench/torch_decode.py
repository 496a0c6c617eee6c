#!/usr/bin/python3
"""PyTorch 1.13 baseline of bench/decode_bench.cc: one decode step of the same model (2 layers,
d_model 256, 4 query heads over 2 K/V heads, head_dim 64, swiglu 512, vocab 256, RMSNorm, RoPE)
with a KV cache held as preallocated tensors [kv_heads, capacity, head_dim] per layer, attention
as two batched matrix products per layer (GQA without copying K/V: the query heads of one K/V
head form the rows). Prints one line per context length: "LEN MEDIAN_SECONDS"."""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--lens", default="32768,131072")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    layers, d, h, kvh, hd, f, vocab = 2, 256, 4, 2, 64, 512, 256
    g = h // kvh
    W = [dict(wq=torch.randn(h * hd, d) * 0.02, wk=torch.randn(kvh * hd, d) * 0.02,
              wv=torch.randn(kvh * hd, d) * 0.02, wo=torch.randn(d, h * hd) * 0.02,
              wg=torch.randn(f, d) * 0.02, wu=torch.randn(f, d) * 0.02,
              wd=torch.randn(d, f) * 0.02, n1=torch.ones(d), n2=torch.ones(d))
         for _ in range(layers)]
    emb = torch.randn(vocab, d) * 0.02
    nf = torch.ones(d)
    inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)

    def rms(x, gain):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain

    def rope(x, pos):  # x [heads, hd]
        ang = (pos * inv).float()
        c, s = torch.cos(ang), torch.sin(ang)
        x0, x1 = x[:, 0::2], x[:, 1::2]
        out = torch.empty_like(x)
        out[:, 0::2] = x0 * c - x1 * s
        out[:, 1::2] = x0 * s + x1 * c
        return out

    for n in [int(x) for x in a.lens.split(",")]:
        cap = n + a.reps + 2
        K = [torch.randn(kvh, cap, hd) for _ in range(layers)]
        V = [torch.randn(kvh, cap, hd) for _ in range(layers)]
        length = n
        tok = 1
        times = []
        with torch.no_grad():
            for r in range(a.reps + 1):
                t0 = time.perf_counter()
                x = emb[tok]
                for l, w in enumerate(W):
                    hh = rms(x, w["n1"])
                    q = rope((w["wq"] @ hh).view(h, hd), length)
                    k = rope((w["wk"] @ hh).view(kvh, hd), length)
                    v = (w["wv"] @ hh).view(kvh, hd)
                    K[l][:, length] = k
                    V[l][:, length] = v
                    kk, vv = K[l][:, :length + 1], V[l][:, :length + 1]
                    qg = q.view(kvh, g, hd)
                    s = torch.bmm(qg, kk.transpose(1, 2)) / hd ** 0.5  # [kvh, g, L]
                    p = torch.softmax(s, dim=-1)
                    o = torch.bmm(p, vv).reshape(h * hd)
                    x = x + w["wo"] @ o
                    h2 = rms(x, w["n2"])
                    x = x + w["wd"] @ (torch.nn.functional.silu(w["wg"] @ h2) * (w["wu"] @ h2))
                logits = emb @ rms(x, nf)
                tok = int(torch.argmax(logits))
                length += 1
                if r > 0:
                    times.append(time.perf_counter() - t0)
        times.sort()
        print(n, times[len(times) // 2], flush=True)


if __name__ == "__main__":
    main()
