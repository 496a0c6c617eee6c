#!/usr/bin/env python3
"""Builds a Hugging Face tokenizer.json for the tokenizer parity tests (standard library only).

  bpe_train.py --style bytelevel    --corpus DIR --out DIR [--merges N]
  bpe_train.py --style bytefallback --corpus DIR --out DIR [--merges N]

bytelevel: GPT-4 / Llama-3 style. Split pre-tokenizer with Llama 3's regex, then ByteLevel
(use_regex false); the ByteLevel decoder; merges in the [a, b] pair form; ignore_merges; special
tokens <|begin_of_text|>, <|end_of_text|>, <|eot_id|>, a <|pad|> token with lstrip/rstrip and a
normalized (non-special) added token; tokenizer_config.json names BOS and EOS.

bytefallback: Llama-2 style. Normaliser Prepend("▁") + Replace(" " -> "▁"), no pre-tokenizer,
BPE with byte_fallback over the corpus's common characters (rarer ones fall back to <0xXX>),
merges in the "a b" string form, decoder Replace/ByteFallback/Fuse/Strip, <unk> <s> </s>; no
tokenizer_config.json, so BOS comes from the TemplateProcessing post-processor.

Merges are learned from the corpus with the usual BPE rule (most frequent adjacent pair first,
ties by the pair's text). The trainer's own word split only approximates the pre-tokenizer
(Python's re has no \\p{L}); the tokenizer it writes is valid whatever the split was.
"""
import argparse
import collections
import json
import os
import re

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The same split spelled for Python's re (\p{L} ~ [^\W\d_], \p{N} ~ \d).
APPROX = re.compile(r"'(?:[sSdDmMtT]|ll|ve|re)|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+[\r\n]*|"
                    r"\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def read_corpus(path):
    texts = []
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                texts.append(f.read().decode("utf-8", errors="replace"))
    return texts


def learn_merges(word_counts, n_merges, mergeable):
    """word_counts: {tuple of symbols: count}. Returns [(a, b)] in merge order."""
    words = [list(w) for w in word_counts]
    freqs = list(word_counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            if mergeable(a) and mergeable(b):
                pairs[(a, b)] += freqs[i]
                where[(a, b)].add(i)
    merges = []
    while len(merges) < n_merges and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        merged = best[0] + best[1]
        for i in list(where[best]):
            w, f = words[i], freqs[i]
            for a, b in zip(w, w[1:]):
                if mergeable(a) and mergeable(b):
                    pairs[(a, b)] -= f
                    if pairs[(a, b)] <= 0:
                        del pairs[(a, b)]
                    where[(a, b)].discard(i)
            out, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and (w[k], w[k + 1]) == best:
                    out.append(merged)
                    k += 2
                else:
                    out.append(w[k])
                    k += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                if mergeable(a) and mergeable(b):
                    pairs[(a, b)] += f
                    where[(a, b)].add(i)
        pairs.pop(best, None)
        where.pop(best, None)
    return merges


def added(content, id_, special=True, **kw):
    t = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": not special, "special": special}
    t.update(kw)
    return t


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def build_bytelevel(texts, n_merges):
    b2u = bytes_to_unicode()
    counts = collections.Counter()
    for t in texts:
        for w in APPROX.findall(t):
            counts[tuple(b2u[b] for b in w.encode("utf-8"))] += 1
    merges = learn_merges(counts, n_merges, lambda s: True)
    vocab = {b2u[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                "<|end_header_id|>"]
    toks = [added(s, len(vocab) + i) for i, s in enumerate(specials)]
    toks.append(added("<|pad|>", len(vocab) + len(toks), lstrip=True, rstrip=True))
    toks.append(added("ringmaster", len(vocab) + len(toks), special=False))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": toks,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": template("<|begin_of_text|>", toks[0]["id"]),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
        "add_bos_token": True, "add_eos_token": False}


def build_bytefallback(texts, n_merges):
    norm = ["\u2581" + t.replace(" ", "\u2581") for t in texts]
    chars = collections.Counter(c for t in norm for c in t)
    alphabet = sorted(c for c, n in chars.items() if n >= 3) + ["\u2581"]
    alpha = set(alphabet)
    counts = collections.Counter()
    for t in norm:
        for w in re.findall("\u2581?[^\u2581]+|\u2581", t):
            counts[tuple(w)] += 1
    merges = learn_merges(counts, n_merges, lambda s: s in alpha or len(s) > 1)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in alphabet:
        vocab.setdefault(c, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    toks = [added("<unk>", 0), added("<s>", 1), added("</s>", 2)]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": toks,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": template("<s>", 1),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": ["%s %s" % m for m in merges]},
    }, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--style", choices=["bytelevel", "bytefallback"], required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--merges", type=int, default=2000)
    a = ap.parse_args()
    texts = read_corpus(a.corpus)
    build = build_bytelevel if a.style == "bytelevel" else build_bytefallback
    tok, cfg = build(texts, a.merges)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    if cfg is not None:
        with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
