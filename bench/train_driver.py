#!/usr/bin/python3
"""A training step of a model's parameter layout, for bitpush or PyTorch DDP: one training
process of the training-step benchmark (docs/benchmarks.md, "Training steps of model layouts").

The model is the layout's tensors (bench/layouts/MODEL.json, from bench/model_layouts.py), one
module per layer, registered in forward order (the reverse of the layout's backward order). A
step is a forward (free: the layers pass a one-element activation along), a backward that walks
the layers in backward order, spending each layer's `backward_ms` x --compute-scale asleep (the
accelerator's time: the CPU stays free for communication, as it is while a GPU computes) and
then producing the layer's gradients (--compute-profile FILE replaces the layout's per-layer
times), which autograd hands to the exchange's hooks as they are
ready so communication overlaps the rest of backward, then the exchange's wait and the optimizer's
step (no update; see below).

Gradients are fixed per rank (normal, seeded by the rank); autograd adopts each as the
parameter's .grad without a copy, and the exchange averages into it in place, so later steps
push what the last one averaged (the values do not change what a step costs; --check-result
copies them instead, so they stay intact). The optimizer's update is left out on both sides
(SGD whose step does nothing): on an accelerator neither it nor the gradients' writes take
the CPU that communication uses.

Exchanges (--system):
  ddp      torch.nn.parallel.DistributedDataParallel over gloo (default buckets, its overlap);
           --variant fp32 (no hook), fp16 (torch's fp16_compress_hook), powersgd (torch's
           powerSGD_hook, PowerSGDState(matrix_approximation_rank=4,
           start_powerSGD_iter=--powersgd-start-iter), the rest torch's defaults).
  bitpush  bitpush.torch.DistributedOptimizer around the same SGD, from the BITPUSH_*
           environment (bitpush launch, or --local), --compression SPEC (default: the cluster's).

A rank process runs --warmup steps, then --steps timed steps after a barrier; rank 0 writes the
result JSON (--results): step_ms (median), step_ms_all, local_ms (the same step of the bare
model, no exchange, median of its own --steps), comm_exposed_ms = step_ms - local_ms,
compute_ms (the profile's backward total x --compute-scale), bytes_per_worker (bitpush: the
engine's pushed + pulled bytes per step, also apart as bytes_pushed_per_worker and
bytes_pulled_per_worker; DDP: what a ring all-reduce of each bucket's payload sends and
receives per rank, 2 (W - 1) / W of it each way, of allreduce_bytes_per_step: fp32 4 bytes per
value, fp16 2, PowerSGD its P and Q factors plus the tensors it leaves uncompressed).

--check-result (bitpush, `none`): after the timed steps every rank compares each tensor's
averaged gradient with a single-process reference (every rank's fixed gradient regenerated
here, summed in rank order in fp32 and multiplied by 1/W, as the servers do) bit for bit, and
fails naming the first tensor that differs.

--local W: runs W rank processes on loopback and prints rank 0's result: DDP ranks with
MASTER_ADDR=127.0.0.1; bitpush ranks against a bitpush.testing.LocalCluster of W workers and
--servers servers, with the method's error feedback as the emulated-link runs set it
(bench/emulated_cluster.py error_feedback_for: onebit, topk and binsgdm both). bitpush's
result records it as `error_feedback`.

Exit: 0 ok, 1 a failure (traceback or message), 2 usage, 3 no torch / torch.distributed /
gloo (the message says which).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

EXIT_NO_TORCH = 3
SYSTEMS = ("ddp", "bitpush")
DDP_VARIANTS = ("fp32", "fp16", "powersgd")
POWERSGD_RANK = 4


LAYOUTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layouts")


def layout_file(name, flag="--layout"):
    """A layout name under bench/layouts/ (resnet50, bert-base, ...) or a layout JSON's path,
    as an absolute path; ValueError naming `flag` and the known names otherwise."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    path = os.path.join(LAYOUTS_DIR, name + ".json")
    if not os.path.isfile(path):
        known = sorted(f[:-5] for f in os.listdir(LAYOUTS_DIR) if f.endswith(".json"))
        raise ValueError("%s: no layout '%s' (a file, or one of %s)"
                         % (flag, name, ", ".join(known)))
    return path


def load_layout(path):
    """The layout's layers in backward order, each with its tensors' (name, shape)."""
    with open(path) as f:
        layout = json.load(f)
    shapes = {t["name"]: tuple(t["shape"]) for t in layout["tensors"]}
    layers = []
    seen = set()
    for layer in layout["layers"]:
        names = list(layer["tensors"])
        for n in names:
            if n not in shapes:
                raise ValueError(f"{path}: layer {layer['name']!r} names tensor {n!r}, which "
                                 f"the layout's tensors do not list")
            if n in seen:
                raise ValueError(f"{path}: tensor {n!r} belongs to two layers")
            seen.add(n)
        layers.append((layer["name"], float(layer["backward_ms"]),
                       [(n, shapes[n]) for n in names]))
    missing = sorted(set(shapes) - seen)
    if missing:
        raise ValueError(f"{path}: tensors in no layer: {', '.join(missing[:5])}")
    return layout, layers


def apply_profile(path, layers):
    """The layers with each one's backward_ms taken from a compute profile: a JSON object
    mapping every layer's name to its milliseconds, or a layout JSON (its layers'
    backward_ms). Every layer of the layout must be named; no other name may appear."""
    with open(path) as f:
        prof = json.load(f)
    if isinstance(prof, dict) and isinstance(prof.get("layers"), list):
        prof = {l["name"]: l["backward_ms"] for l in prof["layers"]}
    if not isinstance(prof, dict):
        raise ValueError(f"{path}: a compute profile is a JSON object of layer name -> ms, or "
                         f"a layout JSON")
    names = [n for n, _, _ in layers]
    missing = [n for n in names if n not in prof]
    extra = sorted(set(prof) - set(names))
    if missing or extra:
        raise ValueError(f"{path}: the profile does not match the layout's layers"
                         + (f"; no time for {', '.join(missing[:5])}" if missing else "")
                         + (f"; unknown layers {', '.join(extra[:5])}" if extra else ""))
    out = []
    for name, _, tensors in layers:
        ms = prof[name]
        if not isinstance(ms, (int, float)) or ms < 0 or ms != ms:
            raise ValueError(f"{path}: layer {name!r}: {ms!r} is not a time in ms (>= 0)")
        out.append((name, float(ms), tensors))
    return out


def build_model(torch, layers, rank, scale, copy_grads=False):
    """The layout as modules in forward order; returns (model, grads by parameter name).
    copy_grads: each backward yields copies of the fixed gradients (they stay intact for
    --check-result) instead of adopting their storage (no pass over the model)."""
    from torch import nn

    class Backward(torch.autograd.Function):
        """Passes the activation on; backward sleeps the layer's time, then yields its
        gradients."""

        @staticmethod
        def forward(ctx, x, layer, *params):
            ctx.layer = layer
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            if ctx.layer.ms > 0:
                time.sleep(ctx.layer.ms / 1e3)
            if ctx.layer.copy_grads:
                return (g, None) + tuple(t.clone() for t in ctx.layer.grads)
            # A fresh tensor over the fixed gradient's storage: autograd adopts it as .grad
            # without a copy (the exchange then averages into it in place).
            return (g, None) + tuple(t.detach() for t in ctx.layer.grads)

    class Layer(nn.Module):
        def __init__(self, tensors, ms):
            super().__init__()
            self.ms = ms
            self.names = [n for n, _ in tensors]
            self.params = nn.ParameterList(
                [nn.Parameter(torch.zeros(s, dtype=torch.float32)) for _, s in tensors])
            self.grads = []
            self.copy_grads = False

        def forward(self, x):
            return Backward.apply(x, self, *self.params)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            # Forward order: the reverse of backward order.
            self.layers = nn.ModuleList([Layer(t, ms * scale) for _, ms, t in reversed(layers)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.sum()

    model = Model()
    grads = {}
    for layer in model.layers:
        layer.copy_grads = copy_grads
        layer.grads = [rank_gradient(torch, rank, name, p.shape)
                       for name, p in zip(layer.names, layer.params)]
        grads.update(zip(layer.names, layer.grads))
    return model, grads


def rank_gradient(torch, rank, name, shape):
    """Rank `rank`'s fixed gradient of tensor `name` (normal; the same on every call)."""
    seed = (rank * 1_000_003 + sum(ord(c) * (i + 1) for i, c in enumerate(name))) % (2 ** 31)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def make_step(forward, x, opt):
    """One training step: zero the grads, forward and backward (the exchange's hooks run
    inside), then the optimizer's step (the exchange's wait, for bitpush)."""
    def step():
        opt.zero_grad(set_to_none=True)
        forward(x).backward()
        opt.step()
    return step


def timed_steps(torch, step, count):
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def ring_bytes(world, payload_bytes):
    """Bytes one rank sends plus receives in a ring all-reduce of payload_bytes."""
    return 2 * 2 * (world - 1) / world * payload_bytes if world > 1 else 0


def powersgd_payload_bytes(shapes, rank=POWERSGD_RANK, min_compression_rate=2):
    """PowerSGD's fp32 bytes per step, as torch's powerSGD_hook decides per tensor: an n x m
    view (n = first dimension, r = min(n, m, rank)) goes as P (n x r) and Q (m x r) when
    (n + m) r x min_compression_rate < n m, else whole; 1-D tensors go whole."""
    total = 0
    for s in shapes:
        numel = 1
        for d in s:
            numel *= d
        n = s[0] if s else 1
        m = numel // n if n else 0
        r = min(n, m, rank)
        if len(s) > 1 and (n + m) * r * min_compression_rate < n * m:
            total += (n + m) * r * 4
        else:
            total += numel * 4
    return total


def run_rank(a):
    try:
        import torch
    except Exception as e:
        print(f"{sys.executable} cannot import torch ({type(e).__name__}: {e})", flush=True)
        return EXIT_NO_TORCH
    torch.set_num_threads(1)
    layout, layers = load_layout(a.layout)
    if a.compute_profile:
        layers = apply_profile(a.compute_profile, layers)
    shapes = [s for _, _, t in layers for _, s in t]
    model_bytes = sum(4 * int(torch.Size(s).numel()) for s in shapes)
    compute_ms = sum(ms for _, ms, _ in layers) * a.compute_scale

    if a.system == "ddp":
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            print(f"torch {torch.__version__} at {sys.executable} has no torch.distributed "
                  f"with gloo", flush=True)
            return EXIT_NO_TORCH
        dist.init_process_group("gloo", init_method="env://")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        import bitpush.torch as bp
        bp.init()
        rank, world = bp.rank(), bp.size()

    model, grads = build_model(torch, layers, rank, a.compute_scale, copy_grads=a.check_result)
    x = torch.zeros(1, requires_grad=True)

    class NoUpdate(torch.optim.SGD):
        """The update is the accelerator's: no pass over the parameters on the CPU."""

        def step(self, closure=None):
            return None

    sgd = NoUpdate(model.parameters(), lr=0.0)

    local = timed_steps(torch, make_step(model, x, sgd), a.warmup + a.steps)[a.warmup:]

    result = {"system": a.system, "model": layout.get("model"), "workers": world,
              "tensors": len(shapes), "model_bytes": model_bytes, "steps": a.steps,
              "warmup": a.warmup, "compute_scale": a.compute_scale, "compute_ms": compute_ms}
    if a.system == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        if a.variant == "powersgd":
            # torch's powerSGD_hook issues a bucket's later all-reduces from its futures'
            # callbacks; gloo matches collectives by the order each rank issues them, so with
            # several buckets in flight the ranks' orders can differ and gloo aborts
            # ("op.preamble.length <= op.nbytes"). One bucket keeps one chain per step: the
            # cap and DDP's first-bucket cap (1 MiB by default; torch documents
            # dist._DEFAULT_FIRST_BUCKET_BYTES as the knob) both hold the whole model.
            one_bucket = model_bytes + (1 << 20)
            dist._DEFAULT_FIRST_BUCKET_BYTES = one_bucket
            net = DistributedDataParallel(model, bucket_cap_mb=one_bucket / 2 ** 20)
        else:
            net = DistributedDataParallel(model)  # default buckets (bucket_cap_mb=25)
        hook = ""
        payload = model_bytes
        if a.variant == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
            hook = "fp16_compress_hook"
            payload = model_bytes // 2
        elif a.variant == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
            state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                     start_powerSGD_iter=a.powersgd_start_iter)
            net.register_comm_hook(state, ps.powerSGD_hook)
            hook = "powerSGD_hook"
            payload = powersgd_payload_bytes(shapes)
        result.update({"peer": "ddp", "backend": "gloo", "variant": a.variant, "hook": hook})
        step = make_step(net, torch.zeros(1, requires_grad=True), sgd)
        timed_steps(torch, step, a.warmup)
        dist.barrier()
        times = timed_steps(torch, step, a.steps)
        result["bytes_per_worker"] = ring_bytes(world, payload)
        result["allreduce_bytes_per_step"] = payload
    else:
        opt = bp.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                      compression=a.compression)
        step = make_step(model, x, opt)
        timed_steps(torch, step, a.warmup)
        bp.barrier()
        before = bp.stats()
        times = timed_steps(torch, step, a.steps)
        after = bp.stats()
        pushed, pulled = (after.get(k, 0) - before.get(k, 0)
                          for k in ("bytes_pushed", "bytes_pulled"))
        steps = max(1, a.steps)
        result.update({"peer": "bitpush", "compression": a.compression or bp.cluster_compression(),
                       "error_feedback": bp.cluster_error_feedback(),
                       "bytes_per_worker": (pushed + pulled) / steps,
                       "bytes_pushed_per_worker": pushed / steps,
                       "bytes_pulled_per_worker": pulled / steps})
        if a.check_result:
            check_average(torch, model, world)
    result.update({"step_ms": statistics.median(times), "step_ms_all": times,
                   "local_ms": statistics.median(local)})
    result["comm_exposed_ms"] = result["step_ms"] - result["local_ms"]
    if rank == 0 and a.results:
        with open(a.results, "w") as f:
            json.dump(result, f, indent=1)
    if a.system == "ddp":
        leave_without_teardown(dist)
    bp.shutdown()
    return 0


def leave_without_teardown(dist):
    """Ends a DDP rank once every rank is past its last step (a barrier), without
    destroy_process_group: under torch 1.13 tearing gloo down can deadlock after a comm hook
    (the main thread joins a gloo thread while holding the GIL that a hook's Python callback
    on another gloo thread waits for). Results must be written first; the sockets close with
    the process."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check_average(torch, model, world):
    """Every parameter's .grad (the exchange's average) against the single-process reference,
    bit for bit."""
    for layer in model.layers:
        for name, p in zip(layer.names, layer.params):
            ref = rank_gradient(torch, 0, name, p.shape).clone()
            for r in range(1, world):
                ref += rank_gradient(torch, r, name, p.shape)
            if world > 1:
                ref *= 1.0 / world
            if p.grad is None or not torch.equal(p.grad, ref):
                diff = "no gradient" if p.grad is None else \
                    f"max |diff| {float((p.grad - ref).abs().max()):.3g}"
                raise SystemExit(f"train_driver: tensor {name!r}: the averaged gradient differs "
                                 f"from the single-process reference ({diff})")


def run_local(a, argv):
    """--local W: W rank processes on loopback; rank 0's result printed as JSON."""
    with tempfile.TemporaryDirectory(prefix="bp-train-") as tmp:
        results = os.path.join(tmp, "result.json")
        rank_argv = [sys.executable, os.path.abspath(__file__)] + strip_local(argv) + \
            ["--results", results]
        if a.system == "ddp":
            port = a.master_port
            envs = [dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                         RANK=str(r), WORLD_SIZE=str(a.local), LOCAL_RANK=str(r),
                         OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo") for r in range(a.local)]
            status = run_all(rank_argv, envs, a.timeout_s)
        else:
            from bitpush.testing import LocalCluster
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from emulated_cluster import error_feedback_for  # bench/emulated_cluster.py
            spec = a.compression or "none"
            # The method's error feedback, as the emulated-link runs use it (onebit: both).
            with LocalCluster(workers=a.local, servers=a.servers, compression=spec,
                              error_feedback=error_feedback_for(spec)) as cluster:
                envs = [dict(os.environ, OMP_NUM_THREADS="1",
                             **{k: str(v) for k, v in cluster.env(r).items()})
                        for r in range(a.local)]
                status = run_all(rank_argv, envs, a.timeout_s)
        if status != 0:
            return status
        with open(results) as f:
            print(f.read())
    return 0


def strip_local(argv):
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--local", "--results", "--servers", "--master-port", "--timeout-s"):
            skip = True
            continue
        if arg.split("=")[0] in ("--local", "--results", "--servers", "--master-port",
                                 "--timeout-s"):
            continue
        out.append(arg)
    return out


def run_all(argv, envs, timeout_s):
    procs = [subprocess.Popen(argv, env=env) for env in envs]
    deadline = time.time() + timeout_s
    status = 0
    try:
        for r, p in enumerate(procs):
            left = max(0.1, deadline - time.time())
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                print(f"train_driver: rank {r} still running after {timeout_s} s; stopping all",
                      file=sys.stderr)
                return 1
            if rc != 0 and status == 0:
                status = rc
                print(f"train_driver: rank {r} exited with {rc}", file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return status


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", required=True, help="a layout JSON (bench/layouts/)")
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--variant", choices=DDP_VARIANTS, default="fp32", help="ddp only")
    p.add_argument("--compression", default=None, help="bitpush only: the gradients' spec")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compute-profile", default=None, metavar="FILE",
                   help="per-layer backward milliseconds instead of the layout's: a JSON "
                        "object of layer name -> ms, or another layout JSON")
    p.add_argument("--compute-scale", type=float, default=1.0,
                   help="multiplies every layer's backward_ms (0: no compute)")
    p.add_argument("--powersgd-start-iter", type=int, default=2)
    p.add_argument("--check-result", action="store_true",
                   help="bitpush none: compare the averaged gradients with the reference")
    p.add_argument("--results", default=None, help="rank 0's result JSON")
    p.add_argument("--local", type=int, default=0, metavar="W",
                   help="run W ranks on loopback and print rank 0's result")
    p.add_argument("--servers", type=int, default=2, help="--local bitpush: servers")
    p.add_argument("--master-port", type=int, default=29431, help="--local ddp")
    p.add_argument("--timeout-s", type=float, default=600, help="--local: bound on the run")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.compute_scale < 0:
        p.error("--steps must be >= 1, --warmup >= 0 and --compute-scale >= 0")
    if a.check_result and (a.system != "bitpush" or (a.compression or "none") != "none"):
        p.error("--check-result needs --system bitpush and --compression none")
    if a.variant != "fp32" and a.system != "ddp":
        p.error("--variant is DDP's; bitpush takes --compression")
    try:
        _, layers = load_layout(a.layout)
        if a.compute_profile:
            apply_profile(a.compute_profile, layers)
    except (OSError, ValueError, KeyError) as e:
        p.error(f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e))
    if a.local:
        return run_local(a, argv)
    return run_rank(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
