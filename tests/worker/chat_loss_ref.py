#!/usr/bin/python3
"""PyTorch 1.13 reference of the loss of a chat batch (tests/worker/chat_loss_test.cc).

Usage: chat_loss_ref.py DIR

DIR holds what tests/worker/torch_model.py reads (config.json, params.f32, ids.i32, docs.i32,
pos.i64), except that labels.i32 are the UNMASKED next-token labels (-1 only at the end of each
segment), plus target.u8 [T]: 1 where the label's token is an assistant target (computed by the
test from the rendered text, not by the loader). The reference applies the mask itself:
  loss.f64        [1] cross-entropy over the positions with target 1 / their count (float64)
  grads.f64       [total] its gradient (torch_model.py's layout)
  masked.f64      [total] the gradient of the cross-entropy over the OTHER valid positions, summed
                  and divided by the same count: what the masked labels would add if they leaked
Exits with status 3 when torch cannot be imported.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402  (exits 3 without torch)

import json  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main():
    d = sys.argv[1]
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))
    cfg = json.load(open(os.path.join(d, "config.json")))
    flat = np.fromfile(os.path.join(d, "params.f32"), dtype=np.float32)

    def params():
        P = {}
        for v in cfg["params"]:
            t = torch.from_numpy(flat[v["offset"]:v["offset"] + v["size"]].copy()).double()
            P[v["name"]] = t.view(*v["shape"]).requires_grad_(True)
        return P

    def read(name, dtype):
        return torch.from_numpy(np.fromfile(os.path.join(d, name), dtype=dtype).astype(np.int64))

    ids, labels = read("ids.i32", np.int32), read("labels.i32", np.int32)
    pos, docs = read("pos.i64", np.int64), read("docs.i32", np.int32)
    target = read("target.u8", np.uint8).bool()
    valid = labels >= 0
    count = float((valid & target).sum())
    out = {}
    for name, keep in (("grads", valid & target), ("masked", valid & ~target)):
        P = params()
        lab = torch.where(keep, labels, torch.full_like(labels, -1))
        loss = torch_model.model_loss(cfg, P, ids, lab, pos, docs, count)
        loss.backward()
        g = np.zeros(cfg["total"], dtype=np.float64)
        for v in cfg["params"]:
            g[v["offset"]:v["offset"] + v["size"]] = P[v["name"]].grad.reshape(-1).numpy()
        g.tofile(os.path.join(d, name + ".f64"))
        out[name] = loss.item()
    np.array([out["grads"]], dtype=np.float64).tofile(os.path.join(d, "loss.f64"))


if __name__ == "__main__":
    main()
