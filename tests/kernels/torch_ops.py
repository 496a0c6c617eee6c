#!/usr/bin/python3
"""PyTorch 1.13 oracle for tests/kernels/ops_test.cc.

Usage: torch_ops.py DIR

DIR holds raw little-endian arrays written by the test (NAME.f32 = float32, NAME.i32 = int32,
NAME.i64 = int64) and params.txt ("key value" per line: sizes and hyper-parameters). This script
computes every op with PyTorch in float32 (the way a PyTorch model would), forward and backward
(autograd), and writes out_NAME.f32 (and out_NAME.f64 for fp64 scalars) into DIR.

Exit status: 0 on success; 3 when torch cannot be imported (the test fails with this message);
1 on any other error.
"""
import os
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: torch_ops.py DIR", file=sys.stderr)
        return 1
    try:
        import numpy as np
        import torch
    except Exception as e:  # ImportError, or a broken install
        print(f"torch_ops.py: cannot import torch/numpy ({e!r}); install python3-torch "
              "(scripts/install-deps.sh)", file=sys.stderr)
        return 3
    d = sys.argv[1]
    torch.set_num_threads(1)
    params = {}
    with open(os.path.join(d, "params.txt")) as f:
        for line in f:
            k, v = line.split()
            params[k] = float(v) if "." in v or "e" in v else int(v)

    def load(name, dtype, shape):
        ext = {np.float32: "f32", np.int32: "i32", np.int64: "i64"}[dtype]
        a = np.fromfile(os.path.join(d, f"{name}.{ext}"), dtype=dtype)
        return torch.from_numpy(a.reshape(shape).copy())

    def save(name, t):
        t = t.detach().contiguous()
        if t.dtype == torch.float64:
            t.numpy().tofile(os.path.join(d, f"out_{name}.f64"))
        else:
            t.to(torch.float32).numpy().tofile(os.path.join(d, f"out_{name}.f32"))

    F = torch.nn.functional

    # RMSNorm, written out: y = x * rsqrt(mean(x^2) + eps) * gain.
    n, dim = params["rms_n"], params["rms_d"]
    x = load("rms_x", np.float32, (n, dim)).requires_grad_()
    gain = load("rms_gain", np.float32, (dim,)).requires_grad_()
    dy = load("rms_dy", np.float32, (n, dim))
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + params["rms_eps"])
    y = x * rstd * gain
    y.backward(dy)
    save("rms_y", y)
    save("rms_rstd", rstd.squeeze(-1))
    save("rms_dx", x.grad)
    save("rms_dgain", gain.grad)

    # GELU (exact erf form) and SwiGLU (silu(gate) * up).
    n = params["act_n"]
    x = load("act_x", np.float32, (n,)).requires_grad_()
    dout = load("act_dout", np.float32, (n,))
    out = F.gelu(x)
    out.backward(dout)
    save("gelu_out", out)
    save("gelu_dx", x.grad)
    gate = load("act_x", np.float32, (n,)).requires_grad_()
    up = load("act_up", np.float32, (n,)).requires_grad_()
    out = F.silu(gate) * up
    out.backward(dout)
    save("swiglu_out", out)
    save("swiglu_dgate", gate.grad)
    save("swiglu_dup", up.grad)

    # Cross-entropy, label -1 ignored, summed; gradient scaled by grad_scale.
    n, vocab = params["ce_n"], params["ce_vocab"]
    logits = load("ce_logits", np.float32, (n, vocab)).requires_grad_()
    labels = load("ce_labels", np.int32, (n,)).long()
    loss = F.cross_entropy(logits, labels, ignore_index=-1, reduction="sum")
    (loss * params["ce_scale"]).backward()
    save("ce_loss", loss.to(torch.float64).reshape(1))
    save("ce_dlogits", logits.grad)

    # Embedding forward and backward (dtable = scatter-add of dout).
    n, vocab, dim = params["emb_n"], params["emb_vocab"], params["emb_d"]
    table = load("emb_table", np.float32, (vocab, dim)).requires_grad_()
    ids = load("emb_ids", np.int32, (n,)).long()
    dout = load("emb_dout", np.float32, (n, dim))
    out = F.embedding(ids, table)
    out.backward(dout)
    save("emb_out", out)
    save("emb_dtable", table.grad)

    # RoPE, written out: pairs (2j, 2j+1) rotated by pos * theta^(-2j/head_dim), fp64 angles.
    n, heads, hd = params["rope_n"], params["rope_heads"], params["rope_hd"]
    x = load("rope_x", np.float32, (n, heads, hd))
    pos = load("rope_pos", np.int64, (n,))
    inv_freq = params["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]  # [n, hd/2]
    cos = torch.cos(ang).to(torch.float32)[:, None, :]
    sin = torch.sin(ang).to(torch.float32)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    save("rope_out", out)

    # RoPE scaling, independently of kernels/rope.h: the inverse frequencies and attention
    # factor of transformers' rope init functions (modeling_rope_utils.py: linear, llama3, yarn),
    # written out here in float64 (transformers computes them in float32, which at positions of
    # 1e4+ moves angles by far more than the 1e-6 compared), applied to interleaved pairs. The
    # backward is autograd's gradient of the forward.
    import math
    n, heads, hd = params["rs_n"], params["rs_heads"], params["rs_hd"]
    base, factor = float(params["rs_theta"]), float(params["rs_factor"])
    orig = float(params["rs_orig"])
    x = load("rs_x", np.float32, (n, heads, hd)).to(torch.float64)
    dout = load("rs_dout", np.float32, (n, heads, hd)).to(torch.float64)
    pos = load("rs_pos", np.int64, (n,)).to(torch.float64)

    def default_inv_freq():
        return 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def linear():
        return default_inv_freq() / factor, 1.0

    def llama3():
        inv_freq = default_inv_freq()
        low_freq_factor, high_freq_factor = float(params["rs_low"]), float(params["rs_high"])
        low_freq_wavelen = orig / low_freq_factor
        high_freq_wavelen = orig / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama), 1.0

    def yarn():
        beta_fast, beta_slow = float(params["rs_beta_fast"]), float(params["rs_beta_slow"])
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

        def find_correction_dim(num_rotations):
            return (hd * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(find_correction_dim(beta_fast)), 0)
        high = min(math.ceil(find_correction_dim(beta_slow)), hd - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(hd // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        extrapolation = 1.0 / pos_freqs
        interpolation = 1.0 / (factor * pos_freqs)
        extrapolation_factor = 1 - ramp
        inv_freq = (interpolation * (1 - extrapolation_factor) +
                    extrapolation * extrapolation_factor)
        return inv_freq, attention_factor

    for name, fn in (("linear", linear), ("llama3", llama3), ("yarn", yarn)):
        inv_freq, attention_factor = fn()
        ang = pos[:, None] * inv_freq[None, :]
        cos = (torch.cos(ang) * attention_factor)[:, None, :]
        sin = (torch.sin(ang) * attention_factor)[:, None, :]
        xi = x.clone().requires_grad_(True)
        x0, x1 = xi[..., 0::2], xi[..., 1::2]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).reshape(x.shape)
        out.backward(dout)
        save(f"rs_{name}_out", out.to(torch.float32))
        save(f"rs_{name}_dx", xi.grad.to(torch.float32))

    # AdamW: one step of torch.optim.AdamW from given (m, v) at step `adam_step`.
    n = params["adam_n"]
    p = torch.nn.Parameter(load("adam_p", np.float32, (n,)))
    p.grad = load("adam_g", np.float32, (n,))
    opt = torch.optim.AdamW([p], lr=params["adam_lr"], betas=(params["adam_b1"],
                            params["adam_b2"]), eps=params["adam_eps"],
                            weight_decay=params["adam_wd"], foreach=False)
    st = opt.state[p]
    st["step"] = torch.tensor(float(params["adam_step"] - 1))
    st["exp_avg"] = load("adam_m", np.float32, (n,))
    st["exp_avg_sq"] = load("adam_v", np.float32, (n,))
    opt.step()
    save("adam_p", p)
    save("adam_m", st["exp_avg"])
    save("adam_v", st["exp_avg_sq"])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception as e:
        import traceback
        traceback.print_exc()
        print(f"torch_ops.py: failed: {e!r}", file=sys.stderr)
        sys.exit(1)
