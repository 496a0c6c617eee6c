#!/usr/bin/python3
"""Times one torch.optim.AdamW step on a single fp32 parameter of N elements (bench/adamw_bench).

Usage: torch_adamw.py N THREADS REPS
Prints one line: "torch_adamw impl=<foreach|single> n=N threads=T median_s=... min_s=... max_s=..."
(per-step wall time over REPS timed steps after 2 warm-up steps). torch 1.13 has no fused CPU
AdamW; the foreach (multi-tensor) implementation is used when available.
"""
import statistics
import sys
import time


def main():
    n, threads, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    try:
        import torch
    except Exception as e:
        print(f"torch_adamw.py: cannot import torch ({e!r}); install python3-torch",
              file=sys.stderr)
        return 3
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(n, generator=g))
    p.grad = torch.randn(n, generator=g) * 0.01
    impl = "foreach"
    try:
        opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                foreach=True)
    except TypeError:
        impl = "single"
        opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    times = []
    with torch.no_grad():
        for i in range(reps + 2):
            t0 = time.perf_counter()
            opt.step()
            dt = time.perf_counter() - t0
            if i >= 2:
                times.append(dt)
    print(f"torch_adamw impl={impl} n={n} threads={threads} "
          f"median_s={statistics.median(times):.6f} min_s={min(times):.6f} "
          f"max_s={max(times):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
