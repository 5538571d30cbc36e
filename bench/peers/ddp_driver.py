#!/usr/bin/python3
"""The PyTorch DDP peer of `bitpush-bench pushpull --peer ddp`: one rank of a gloo process group.

`bitpush-bench` (bench/peers/ddp_peer.cc) starts W of these, one per worker rank, the way
torchrun would: MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port below Linux's ephemeral
range), RANK, WORLD_SIZE, LOCAL_RANK, OMP_NUM_THREADS=1 and GLOO_SOCKET_IFNAME=lo in the
environment, `init_process_group("gloo", init_method="env://")`. Every rank holds the same
tensors as a bitpush worker (--tensors K tensors of --elements each, --dtype), runs --warmup
rounds, then --iters timed rounds; rank 0 writes the JSON result (--results).

Variants (--variant), each a round of torch's own machinery:
  allreduce  torch.distributed.all_reduce(t, async_op=True) of every tensor, then wait() on
             each: what DDP's reducer launches per bucket, without the bucket copies;
  ddp        torch.nn.parallel.DistributedDataParallel (default bucket_cap_mb=25, no hook):
             a forward and a backward whose gradient exchange is DDP's own;
  fp16       the same DDP module with torch's own
             ddp_comm_hooks.default_hooks.fp16_compress_hook registered;
  powersgd   the same DDP module with torch's own ddp_comm_hooks.powerSGD_hook.powerSGD_hook
             and PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=2, the rest
             torch's defaults: error feedback, warm start, min_compression_rate 2).
The DDP module's parameters are the tensors' bytes as matrices of --cols columns (rows of at
most --cols, i.e. layers of up to 4 MiB of fp32 at the default 1024, like a hidden-1024
transformer's linear layers), a 1-D remainder where the count does not divide, so that DDP
buckets them by its default bucket cap and PowerSGD has matrices to compress. A DDP round is
the forward (views of the parameters) and the backward of fixed random gradients, which
returns when DDP's exchange of every bucket is done; the grads are dropped after each round
(zero_grad(set_to_none=True)). `local_ms` is the same round under ddp.no_sync() (no exchange):
the round's own compute.

--check: imports torch, torch.distributed and gloo (and the variant's hook) and exits 0, or
prints why not and exits with a distinct status: 3 no torch, 4 no torch.distributed, 5 no
gloo, 6 no such hook. Any other failure: a traceback and exit 1.
"""
import argparse
import json
import os
import statistics
import sys
import time

EXIT_NO_TORCH, EXIT_NO_DISTRIBUTED, EXIT_NO_GLOO, EXIT_NO_HOOK = 3, 4, 5, 6
VARIANTS = ("allreduce", "ddp", "fp16", "powersgd")
POWERSGD_RANK = 4
POWERSGD_START_ITER = 2


def fail(status, reason):
    print(reason, flush=True)
    sys.exit(status)


def import_torch(variant):
    """torch and torch.distributed, or exit with why not."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        fail(EXIT_NO_TORCH, f"{sys.executable} cannot import torch ({type(e).__name__}: {e})")
    try:
        import torch.distributed as dist
        if not dist.is_available():
            raise RuntimeError("torch.distributed.is_available() is False")
    except Exception as e:
        fail(EXIT_NO_DISTRIBUTED, f"torch {torch.__version__} at {sys.executable} has no "
             f"torch.distributed ({e})")
    if not dist.is_gloo_available():
        fail(EXIT_NO_GLOO, f"torch {torch.__version__} at {sys.executable} is built without gloo")
    try:
        if variant == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: F401
        elif variant == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook  # noqa: F401
    except Exception as e:
        fail(EXIT_NO_HOOK, f"torch {torch.__version__} at {sys.executable} lacks the "
             f"{variant} comm hook ({e})")
    return torch, dist


def matrix_shapes(elements, cols):
    """One tensor's elements as parameters: [rows <= cols, cols] matrices, then the remainder."""
    shapes, left = [], elements
    while left >= cols:
        rows = min(cols, left // cols)
        shapes.append((rows, cols))
        left -= rows * cols
    if left:
        shapes.append((left,))
    return shapes


class AllreduceRound:
    """all_reduce of every tensor in place, all in flight at once."""

    def __init__(self, torch, dist, a, dtype):
        self.dist = dist
        gen = torch.Generator().manual_seed(1 + a.rank)
        self.tensors = [torch.randn(a.elements, generator=gen).to(dtype) for _ in range(a.tensors)]

    def __call__(self):
        works = [self.dist.all_reduce(t, async_op=True) for t in self.tensors]
        for w in works:
            w.wait()


class DdpRound:
    """A DistributedDataParallel forward and backward; the backward returns when DDP's exchange
    (its buckets' all-reduces, or the registered hook's) is complete."""

    def __init__(self, torch, dist, a, dtype):
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel

        class Parameters(nn.Module):
            def __init__(self, shapes):
                super().__init__()
                self.layers = nn.ParameterList(
                    [nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes])

            def forward(self):
                return [p.view(p.shape) for p in self.layers]

        self.torch = torch
        shapes = [s for _ in range(a.tensors) for s in matrix_shapes(a.elements, a.cols)]
        self.module = Parameters(shapes)
        self.ddp = DistributedDataParallel(self.module)  # default buckets (bucket_cap_mb=25)
        self.hook = ""
        self.state = None
        if a.variant == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            self.hook = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook"
        elif a.variant == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
            self.state = ps.PowerSGDState(process_group=None,
                                          matrix_approximation_rank=POWERSGD_RANK,
                                          start_powerSGD_iter=POWERSGD_START_ITER)
            self.ddp.register_comm_hook(self.state, ps.powerSGD_hook)
            self.hook = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook"
        gen = torch.Generator().manual_seed(1 + a.rank)
        self.grads = [torch.randn(s, generator=gen).to(dtype) for s in shapes]

    def __call__(self):
        outputs = self.ddp()
        self.torch.autograd.backward(outputs, self.grads)
        for p in self.module.parameters():
            p.grad = None

    def local(self):
        with self.ddp.no_sync():
            self()


def timed(fn, count):
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def count_allreduce_bytes(dist, fn):
    """The bytes torch.distributed.all_reduce is given during one round of `fn` (the hooks call
    it through the module, so a wrapper sees each call)."""
    seen = [0]
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        seen[0] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        fn()
    finally:
        dist.all_reduce = original
    return seen[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=VARIANTS, default="allreduce")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--elements", type=int, default=1 << 18, help="per tensor")
    ap.add_argument("--tensors", type=int, default=1)
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    ap.add_argument("--cols", type=int, default=1024, help="columns of the DDP module's matrices")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout-s", type=int, default=300)
    ap.add_argument("--results", default="", help="rank 0 writes the JSON result here")
    a = ap.parse_args()
    torch, dist = import_torch(a.variant)
    if a.check:
        print(f"torch {torch.__version__} with gloo at {sys.executable}")
        return
    a.rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    import datetime
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    dtype = getattr(torch, a.dtype)
    round_ = AllreduceRound(torch, dist, a, dtype) if a.variant == "allreduce" else \
        DdpRound(torch, dist, a, dtype)
    # DDP rebuilds its buckets after its first backward; PowerSGD compresses from its
    # start_powerSGD_iter on: the timed rounds come after both.
    warmup = a.warmup
    if a.variant != "allreduce":
        warmup = max(warmup, 1)
    if a.variant == "powersgd":
        warmup = max(warmup, POWERSGD_START_ITER + 1)
    local = timed(round_.local, min(a.iters, 5)) if a.variant != "allreduce" else []
    for _ in range(warmup):
        round_()
    dist.barrier()
    t0 = time.perf_counter()
    iter_s = timed(round_, a.iters)
    loop_s = time.perf_counter() - t0
    tensor_bytes = a.elements * a.tensors * torch.tensor([], dtype=dtype).element_size()
    if a.variant in ("allreduce", "ddp"):
        allreduce_bytes = tensor_bytes  # the gloo all-reduces of the buckets, or of the tensors
    else:
        allreduce_bytes = count_allreduce_bytes(dist, round_)
    mine = {"loop_s": loop_s, "iter_s": iter_s, "local_s": local}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if a.rank != 0:
        finish()
    # A round ends for the cluster when its slowest rank is done.
    rounds = [max(r["iter_s"][i] for r in everyone) for i in range(a.iters)]
    loop = max(r["loop_s"] for r in everyone)
    locals_ = [max(r["local_s"][i] for r in everyone) for i in range(len(local))]
    result = {
        "status": "OK",
        "variant": a.variant,
        "torch_version": torch.__version__,
        "world_size": world,
        "dtype": a.dtype,
        "hook": getattr(round_, "hook", ""),
        "bucket_cap_mb": round_.ddp.bucket_bytes_cap / (1 << 20) if a.variant != "allreduce"
        else None,
        "parameters": len(round_.grads) if a.variant != "allreduce" else None,
        "warmup": warmup,
        "iters": a.iters,
        "tensor_bytes": tensor_bytes,
        "allreduce_bytes_per_iter": allreduce_bytes,
        "loop_seconds": loop,
        "best_iter_seconds": min(rounds),
        "round_ms": statistics.median(rounds) * 1e3,
        "local_ms": statistics.median(locals_) * 1e3 if locals_ else None,
        "goodput_gbps": tensor_bytes * a.iters / loop / 1e9,
        "round_ms_all": [x * 1e3 for x in rounds],
    }
    text = json.dumps(result)
    if a.results:
        with open(a.results, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    finish()


def finish():
    """Exits at once: the timings are in, and tearing down a gloo group with DDP's reducer
    threads can hang a rank at exit (seen with fp16_compress_hook: a rank spinning after its
    last collective until killed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
