#!/usr/bin/env python3
"""The plain-torch reference of `bitpush-bench optimizer`: one LANS step (the paper's
simultaneous form, eps outside the sqrt, trust-ratio fallback to 1, weight decay 0.01, the
defaults of optimizers/lans.h) written in ordinary torch tensor ops, timed over the same block
shapes as the C++ benchmark (BlockSizes below mirrors bench/bench_optimizer.cc), on
--threads threads (--device cuda: on the first GPU, the step ending when the GPU is done). Prints one JSON object on stdout; if torch cannot be imported it prints
{"skipped": "<reason>"} and exits 0, so the benchmark still succeeds."""
import argparse
import json
import math
import statistics
import sys
import time

# One transformer layer of hidden size 1024 (BERT-Large): QKV, output projection, two
# LayerNorms, the two FFN matrices and their biases. Repeated until --params are reached; the
# last block is cut to fit exactly.
LAYER = [3 * 1024 * 1024, 3 * 1024, 1024 * 1024, 1024, 1024, 1024,
         4096 * 1024, 4096, 1024 * 4096, 1024, 1024, 1024]


def block_sizes(params):
    sizes, left, i = [], params, 0
    while left > 0:
        s = min(LAYER[i % len(LAYER)], left)
        sizes.append(s)
        left -= s
        i += 1
    return sizes


def lans_step(torch, x, m, v, g, t, lr, b1, b2, eps, wd):
    bc1 = 1.0 - b1 ** t
    bc2 = 1.0 - b2 ** t
    m.mul_(b1).add_(g, alpha=1.0 - b1)
    v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
    den = (v / bc2).sqrt_().add_(eps)
    r = (m / bc1).div_(den)
    c = g / den
    if wd != 0:
        r.add_(x, alpha=wd)
        c.add_(x, alpha=wd)
    phi = x.norm().item()  # φ = identity
    ratios = []
    for u in (r, c):
        q = phi / u.norm().item() if phi != 0 else 0.0
        ratios.append(q if (q != 0 and math.isfinite(q)) else 1.0)  # the fallback
    x.add_(r, alpha=-lr * b1 * ratios[0]).add_(c, alpha=-lr * (1.0 - b1) * ratios[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=25_000_000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no reference"
        print(json.dumps({"skipped": f"torch not importable: {type(e).__name__}: {e}"}))
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"skipped": f"torch {torch.__version__} sees no CUDA device"}))
        return 0
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    sizes = block_sizes(a.params)
    blocks = []
    with torch.no_grad():
        for n in sizes:
            blocks.append(tuple(t.to(a.device) for t in (torch.randn(n), torch.zeros(n),
                                                         torch.zeros(n), torch.randn(n))))
        times = []
        for t in range(1, a.steps + 2):  # step 1 is the warm-up
            t0 = time.perf_counter()
            for x, m, v, g in blocks:
                lans_step(torch, x, m, v, g, t, 1e-3, 0.9, 0.999, 1e-6, a.weight_decay)
            if a.device == "cuda":
                torch.cuda.synchronize()
            if t > 1:
                times.append(time.perf_counter() - t0)
    best = min(times)
    print(json.dumps({
        "name": "optimizer_torch_ref", "params": a.params, "blocks": len(sizes),
        "steps": a.steps, "threads": torch.get_num_threads(), "device": a.device,
        "torch_version": torch.__version__,
        "seconds": best, "median_seconds": statistics.median(times),
        "params_per_s": a.params / best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
