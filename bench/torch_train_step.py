#!/usr/bin/python3
"""The same model as ringmaster's worker/model in PyTorch 1.13 (float32), timed for a full
training step (forward, backward, torch.optim.AdamW) for bench/train_step_bench.

Usage: torch_train_step.py DIR THREADS REPS
DIR holds the files tests/worker/torch_model.py reads (config.json, params.f32, ids.i32,
labels.i32, pos.i64, docs.i32). The model is tests/worker/torch_model.py's model_loss: explicit
masked-softmax attention (PyTorch 1.13 has no fused attention), so attention memory is
[heads, T, T] per layer. Prints one line:
  torch_train_step tokens=T threads=N median_s=.. min_s=.. max_s=.. loss=.. vmhwm_kb=..
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "worker"))


def vmhwm_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def main():
    d, threads, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        import json
        import numpy as np
        import torch
        import torch_model
    except Exception as e:
        print(f"torch_train_step.py: cannot import torch ({e!r}); install python3-torch",
              file=sys.stderr)
        return 3
    torch.set_num_threads(threads)
    cfg = json.load(open(os.path.join(d, "config.json")))
    flat = np.fromfile(os.path.join(d, "params.f32"), dtype=np.float32)
    P = {}
    for v in cfg["params"]:
        t = torch.from_numpy(flat[v["offset"]:v["offset"] + v["size"]].copy())
        P[v["name"]] = torch.nn.Parameter(t.view(*v["shape"]))
    ids = torch.from_numpy(np.fromfile(os.path.join(d, "ids.i32"), dtype=np.int32))
    labels = torch.from_numpy(np.fromfile(os.path.join(d, "labels.i32"), dtype=np.int32))
    pos = torch.from_numpy(np.fromfile(os.path.join(d, "pos.i64"), dtype=np.int64))
    docs = torch.from_numpy(np.fromfile(os.path.join(d, "docs.i32"), dtype=np.int32))
    decay = [p for n, p in P.items() if not n.endswith(".gain")]
    no_decay = [p for n, p in P.items() if n.endswith(".gain")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    gv = float(cfg["global_valid"])
    times, loss = [], 0.0
    for i in range(reps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        out = torch_model.model_loss(cfg, P, ids, labels, pos, docs, gv)
        out.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        loss = out.item()
        if i >= 1 or reps == 0:
            times.append(dt)
    print(f"torch_train_step tokens={ids.shape[0]} threads={threads} "
          f"median_s={statistics.median(times):.4f} min_s={min(times):.4f} "
          f"max_s={max(times):.4f} loss={loss:.6f} vmhwm_kb={vmhwm_kb()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
