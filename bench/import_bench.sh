#!/usr/bin/env bash
# `ringctl import` and `ringctl export` throughput against a plain copy of the same bytes, in the
# same run: a synthetic Llama in the Hugging Face layout (bf16, two shards + index; 8 layers,
# d_model 1024, 16 heads / 4 kv heads, hidden 2816, vocab 32000, untied: 156 M parameters,
# 311 MB of bf16, 623 MB as fp32 master weights) is
#   import    ringctl import (read + RoPE row permutation + checkpoint write, fsynced; the
#             master tensors keep the source's bf16) vs a copy of the source shards
#   export    ringctl export --dtype fp32 / bf16 of a checkpoint with fp32 master tensors, as
#             training writes them (checksums checked in place + inverse permutation +
#             safetensors write, fsynced) vs a copy of that checkpoint's data file (the bytes read)
# The fp32 checkpoint is made once, outside the timing, by exporting the import to fp32 and
# importing that. Two copies as baselines: `cp` + `sync` of the copies (coreutils 9 cp copies
# inside the kernel, copy_file_range) and `dd bs=4M conv=fsync` (read + write through user
# space). Each REPS times (default 5), alternating; prints the median seconds, the median and
# spread (min..max) of the per-repetition ratio (ours / copy) and MB/s of the bytes read.
#
#   bench/import_bench.sh [BUILD_DIR] [REPS]          needs ringctl built; ~3 GB in $TMPDIR
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
reps="${2:-5}"
ringctl="$build/cli/ringctl"
[[ -x "$ringctl" ]] || { echo "import_bench: no $ringctl (cmake --build BUILD --target ringctl)" >&2; exit 2; }
work="$(mktemp -d "${TMPDIR:-/tmp}/import-bench-XXXXXX")"
[[ -n "${KEEP:-}" ]] && echo "import_bench: keeping $work" >&2 || trap 'rm -rf "$work"' EXIT

/usr/bin/python3 - "$ringctl" "$work" "$reps" <<'PY'
import json, os, shutil, statistics, struct, subprocess, sys, time
import numpy as np

ringctl, work, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
       "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
       "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
       "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
       "max_position_embeddings": 8192}
d, F, L, H, KH, V = 1024, 2816, 8, 16, 4, 32000
hd = d // H
shapes = {"model.embed_tokens.weight": (V, d)}
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (H * hd, d),
                   p + "self_attn.k_proj.weight": (KH * hd, d), p + "self_attn.v_proj.weight": (KH * hd, d),
                   p + "self_attn.o_proj.weight": (d, H * hd), p + "post_attention_layernorm.weight": (d,),
                   p + "mlp.gate_proj.weight": (F, d), p + "mlp.up_proj.weight": (F, d),
                   p + "mlp.down_proj.weight": (d, F)})
shapes["model.norm.weight"] = (d,)
shapes["lm_head.weight"] = (V, d)
hf = os.path.join(work, "hf")
os.makedirs(hf)
json.dump(cfg, open(os.path.join(hf, "config.json"), "w"))
rng = np.random.default_rng(0)
names = list(shapes)
parts = [names[: len(names) // 2], names[len(names) // 2:]]
wm = {}
for k, part in enumerate(parts):
    fn = f"model-{k + 1:05d}-of-00002.safetensors"
    header, off = {}, 0
    for n in part:
        b = int(np.prod(shapes[n])) * 2
        header[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [off, off + b]}
        off += b
        wm[n] = fn
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(hf, fn), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n in part:
            x = (rng.standard_normal(int(np.prod(shapes[n])), dtype=np.float32) * 0.02)
            f.write((x.view(np.uint32) >> 16).astype("<u2").tobytes())
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(hf, "model.safetensors.index.json"), "w"))
src_bytes = sum(os.path.getsize(os.path.join(hf, f)) for f in os.listdir(hf) if f.endswith(".safetensors"))
params = sum(int(np.prod(s)) for s in shapes.values())

def settle(dst=None):
    """Before every timed run: remove its output (unlinking a large file inside the timing costs
    time that is not the command's) and flush what earlier runs left dirty."""
    if dst:
        shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["sync"], check=True)

def timed(cmd, dst=None):
    settle(dst)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t

def copy_and_sync(files, dst):
    settle(dst)
    os.makedirs(dst)
    t = time.perf_counter()
    subprocess.run(["cp"] + files + [dst], check=True)
    subprocess.run(["sync"] + [os.path.join(dst, os.path.basename(f)) for f in files], check=True)
    return time.perf_counter() - t

def dd_copy(files, dst):
    settle(dst)
    os.makedirs(dst)
    t = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", f"of={os.path.join(dst, os.path.basename(f))}", "bs=4M",
                        "conv=fsync", "status=none"], check=True)
    return time.perf_counter() - t

ck = os.path.join(work, "ck")
shards = sorted(os.path.join(hf, f) for f in os.listdir(hf) if f.endswith(".safetensors"))
# A checkpoint with fp32 master tensors (what training writes), made outside the timing.
ck32 = os.path.join(work, "ck32")
for cmd in ([ringctl, "import", hf, "-o", ck], [ringctl, "export", ck, "-o", os.path.join(work, "hf32"),
            "--dtype", "fp32"], [ringctl, "import", os.path.join(work, "hf32"), "-o", ck32]):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
shutil.rmtree(os.path.join(work, "hf32"))
res = {k: [] for k in ("cp_src", "dd_src", "import", "cp_bin", "dd_bin", "export_fp32", "export_bf16")}
for r in range(reps):
    res["cp_src"].append(copy_and_sync(shards, os.path.join(work, "copy")))
    res["dd_src"].append(dd_copy(shards, os.path.join(work, "copy")))
    res["import"].append(timed([ringctl, "import", hf, "-o", ck], ck))
    binf = os.path.join(ck32, "step-00000000", "node-00000.bin")
    res["cp_bin"].append(copy_and_sync([binf], os.path.join(work, "copy")))
    res["dd_bin"].append(dd_copy([binf], os.path.join(work, "copy")))
    res["export_fp32"].append(timed([ringctl, "export", ck32, "-o", os.path.join(work, "e32"), "--dtype", "fp32"],
                                       os.path.join(work, "e32")))
    res["export_bf16"].append(timed([ringctl, "export", ck32, "-o", os.path.join(work, "e16"), "--dtype", "bf16"],
                                       os.path.join(work, "e16")))
bin_bytes = os.path.getsize(binf)
if os.environ.get("VERBOSE"):
    for k, v in res.items():
        print(f"{k:<12} " + " ".join(f"{x:.2f}" for x in v))
ck_bytes = os.path.getsize(os.path.join(ck, "step-00000000", "node-00000.bin"))
print(f"model: {params / 1e6:.0f} M parameters; source {src_bytes / 1e6:.0f} MB bf16 (2 shards), "
      f"imported checkpoint data {ck_bytes / 1e6:.0f} MB (bf16 kept), fp32 checkpoint data "
      f"{bin_bytes / 1e6:.0f} MB; {reps} repetitions")
def line(name, ours, base, nbytes):
    med = statistics.median(res[ours])
    out = f"{name:<24} {med:6.2f} s {nbytes / med / 1e6:6.0f} MB/s"
    for b in base:
        ratios = [x / y for x, y in zip(res[ours], res[b])]
        out += (f" | {b.split('_')[0]} {statistics.median(res[b]):5.2f} s ratio {statistics.median(ratios):4.2f}"
                f" ({min(ratios):.2f}..{max(ratios):.2f})")
    print(out)
print("ours: median s, MB/s of the bytes read; per baseline (cp = cp + sync, dd = dd bs=4M conv=fsync):")
print("  its median s, the median ratio ours / copy (min..max over repetitions)")
line("import (bf16)", "import", ["cp_src", "dd_src"], src_bytes)
line("export fp32 ckpt -> fp32", "export_fp32", ["cp_bin", "dd_bin"], bin_bytes)
line("export fp32 ckpt -> bf16", "export_bf16", ["cp_bin", "dd_bin"], bin_bytes)
PY
