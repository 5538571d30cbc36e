#!/usr/bin/python3
"""What CLAN's error_feedback_decay costs a step: the median CLAN + onebit step of a wide MLP
(784-4096-4096-10, 19.9M parameters, batch 8 per worker) on a loopback cluster of 2 workers
and 1 server (error feedback both), with the default decay (0.2 for onebit) and with 1.0,
each twice, alternating, in the same worker processes (docs/training.md, "Compressed training
at the examples' defaults").

    PYTHONPATH=build/python /usr/bin/python3 bench/residual_decay_bench.py [--steps 14]

Prints one JSON object: {"decay_default": ms, "decay_1": ms, "decay_default_2": ms,
"decay_1_2": ms, "steps": N, "timed_from": 5} (rank 0's medians of steps 5..N).
Exit 0; 1 a rank failed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = (("decay_default", None), ("decay_1", 1.0), ("decay_default_2", None),
        ("decay_1_2", 1.0))
WARMUP = 4


def rank_main(out, steps):
    import torch

    import bitpush.torch as bp

    torch.set_num_threads(1)
    bp.init()
    result = {"steps": steps, "timed_from": WARMUP + 1}
    try:
        for tag, gamma in RUNS:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(784, 4096), torch.nn.ReLU(),
                                        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                        torch.nn.Linear(4096, 10))
            named = [(tag + "." + n, p) for n, p in model.named_parameters()]
            opt = bp.CLAN([p for _, p in named], lr=0.01, named_parameters=named,
                          compression="onebit", error_feedback_decay=gamma)
            x, y = torch.randn(8, 784), torch.randint(0, 10, (8,))
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                times.append((time.perf_counter() - t0) * 1e3)
            result[tag] = statistics.median(times[WARMUP:])
            opt.remove_hooks()
        if bp.rank() == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        bp.shutdown()
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "--rank":
        return rank_main(argv[1], int(argv[2]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=14, help="steps per run (timed from step 5)")
    a = p.parse_args(argv)
    if a.steps <= WARMUP:
        p.error("--steps must be > %d" % WARMUP)
    from bitpush.testing import LocalCluster

    with tempfile.TemporaryDirectory(prefix="bp-decay-") as tmp:
        out = os.path.join(tmp, "result.json")
        with LocalCluster(workers=2, servers=1, compression="onebit",
                          error_feedback="both") as cluster:
            procs = [subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--rank", out, str(a.steps)],
                env=dict(os.environ, OMP_NUM_THREADS="1",
                         **{k: str(v) for k, v in cluster.env(r).items()}))
                for r in range(2)]
            codes = [proc.wait(timeout=600) for proc in procs]
        if any(codes):
            print("residual_decay_bench: a rank failed (exit %s)" % codes, file=sys.stderr)
            return 1
        with open(out) as f:
            print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
