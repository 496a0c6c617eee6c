# Baseline of tokenize_bench: python3-sentencepiece encoding the same documents, one thread.
#   python3 spm_encode.py MODEL DOCS REPS   (DOCS: documents separated by NUL bytes)
# Prints one line per repetition: the seconds of encoding every document (loading excluded).
import sys
import time

import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
docs = open(sys.argv[2], 'rb').read().split(b'\0')
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    n = 0
    for d in docs:
        n += len(sp.encode(d))
    print(f"{time.perf_counter() - t0:.6f} {n}", flush=True)
