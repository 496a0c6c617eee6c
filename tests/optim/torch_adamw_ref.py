#!/usr/bin/python3
"""Reference for tests/optim/node_optimizer_test.cc (OptimTorch): torch.optim.AdamW on the same
flat parameters and gradients as NodeOptimizer, with global-norm clipping as the Trainer does it.

Usage: torch_adamw_ref.py DIR
DIR/meta.txt: "n steps lr beta1 beta2 eps weight_decay grad_clip"
DIR/decay.bin: uint8 [n] (1: weight decay applies); DIR/params.bin: float32 [n];
DIR/grads.bin: float32 [steps, n]. Writes DIR/out.bin: float32 [n], the parameters after
`steps` AdamW steps (constant lr).
"""
import os
import sys

import numpy as np
import torch


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "meta.txt")) as f:
        fields = f.read().split()
    n, steps = int(fields[0]), int(fields[1])
    lr, b1, b2, eps, wd, clip = (float(x) for x in fields[2:8])
    decay = np.fromfile(os.path.join(d, "decay.bin"), dtype=np.uint8).astype(bool)
    p0 = torch.from_numpy(np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32))
    grads = torch.from_numpy(
        np.fromfile(os.path.join(d, "grads.bin"), dtype=np.float32).reshape(steps, n))
    dmask = torch.from_numpy(decay)
    pd = torch.nn.Parameter(p0[dmask].clone())
    pn = torch.nn.Parameter(p0[~dmask].clone())
    opt = torch.optim.AdamW([{"params": [pd], "weight_decay": wd},
                             {"params": [pn], "weight_decay": 0.0}],
                            lr=lr, betas=(b1, b2), eps=eps)
    for s in range(steps):
        g = grads[s]
        pd.grad = g[dmask].clone()
        pn.grad = g[~dmask].clone()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_([pd, pn], clip)
        opt.step()
    out = torch.empty(n, dtype=torch.float32)
    out[dmask] = pd.detach()
    out[~dmask] = pn.detach()
    out.numpy().tofile(os.path.join(d, "out.bin"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
