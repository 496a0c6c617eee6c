#!/usr/bin/python3
"""The Python steps of scripts/finetune_walkthrough.sh (docs/finetune.md).

  finetune_helper.py model TOKDIR OUTDIR     a random Llama in the Hugging Face layout whose
                                             vocab is TOKDIR/tokenizer.json's (config.json,
                                             model.safetensors, tokenizer.json,
                                             tokenizer_config.json in OUTDIR)
  finetune_helper.py chat OUTDIR             train.jsonl (180 conversations) and held-out.jsonl
                                             (20) with a learnable question/answer pattern
  finetune_helper.py check-export SRC EXP    EXP's safetensors read back (the format's own
                                             reader, tests/safetensors/hf_parity.py): the same
                                             names, shapes and dtype as SRC's, and different
                                             values (training moved them); prints a summary

The model is the shape the tests build (tests/safetensors/hf_parity.py: d_model 64, 2 layers,
4 query heads over 2 K/V heads of 16, SwiGLU 160), with rope_theta 5e5 as Llama 3 uses, fp32.
"""
import json
import os
import random
import shutil
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "safetensors"))
import hf_parity as hf  # noqa: E402  (exits 77 when numpy/torch are missing)

import numpy as np  # noqa: E402


def vocab_size(tokenizer_json):
    t = json.load(open(tokenizer_json, encoding="utf-8"))
    ids = list(t["model"]["vocab"].values()) + [a["id"] for a in t.get("added_tokens", [])]
    return max(ids) + 1


def make_model(tokdir, out):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": vocab_size(os.path.join(tokdir, "tokenizer.json")),
         "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "rope_theta": 500000.0,
         "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False,
         "torch_dtype": "float32"}
    w = hf.make_model(np.random.default_rng(36), c)
    os.makedirs(out, exist_ok=True)
    json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2)
    hf.write_safetensors(os.path.join(out, "model.safetensors"), list(w.items()), "F32")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))
    n = sum(a.size for a in w.values())
    print(f"model: {out}: vocab {c['vocab_size']}, {n} parameters ({n * 4 / 2**20:.1f} MiB fp32)")


COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
THINGS = ["apple", "river", "engine", "garden", "window", "letter", "ladder", "kettle",
          "pencil", "bridge", "candle", "saddle"]


def conversation(rng, k):
    """A fact table the model can learn (each thing has one colour), asked three ways."""
    thing = THINGS[k % len(THINGS)]
    colour = COLOURS[(k * 5 + 3) % len(COLOURS)]
    q = rng.choice([f"What colour is the {thing}?", f"Tell me the colour of the {thing}.",
                    f"Which colour does the {thing} have?"])
    a = f"The {thing} is {colour}."
    if rng.random() < 0.5:  # both input forms of docs/data.md
        return {"messages": [{"role": "system", "content": "Answer in one sentence."},
                             {"role": "user", "content": q},
                             {"role": "assistant", "content": a}]}
    return {"system": "Answer in one sentence.", "prompt": q, "response": a}


def make_chat(out):
    rng = random.Random(36)
    os.makedirs(out, exist_ok=True)
    rows = [conversation(rng, rng.randrange(len(THINGS))) for _ in range(200)]
    for name, part in (("train.jsonl", rows[:180]), ("held-out.jsonl", rows[180:])):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")
    print(f"chat data: {out}/train.jsonl (180 conversations), held-out.jsonl (20)")


def check_export(src, exp):
    a, b = hf.read_model_dir(src), hf.read_model_dir(exp)
    if set(a) != set(b):
        print(f"check-export: tensor names differ: {sorted(set(a) ^ set(b))}", file=sys.stderr)
        return 1
    moved = 0
    for n, (dt, shape, raw) in a.items():
        dt2, shape2, raw2 = b[n]
        if (dt, shape) != (dt2, shape2):
            print(f"check-export: {n}: {dt}{list(shape)} vs {dt2}{list(shape2)}", file=sys.stderr)
            return 1
        moved += raw != raw2
    if moved == 0:
        print("check-export: the exported weights equal the source's: nothing was trained",
              file=sys.stderr)
        return 1
    print(f"export: {len(b)} tensors read back, names/shapes/dtype as the source's, "
          f"{moved} of them changed by training")
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "model":
        make_model(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "chat":
        make_chat(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check-export":
        return check_export(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
