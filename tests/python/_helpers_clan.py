"""Helpers of the optimizer tests (test_optimizer.py, test_convergence.py,
test_examples.py): a reference LANS written with plain torch ops, and small runners that start
worker processes against a bitpush.testing.LocalCluster.

The reference follows paper 001 Algorithm 2 in its simultaneous form (every norm taken with
the x from before the update) with the same switches as optimizers/lans.h: ε inside or
outside the square root, MXNet's gradient normalisation, and the trust-ratio fallback.
"""

import math
import warnings

import torch


def reference_lans_step(x, m, v, g, step, lr, beta1=0.9, beta2=0.999, eps=1e-6,
                        weight_decay=0.0, eps_inside_sqrt=False, normalize_grad=False,
                        trust_ratio_fallback=True, phi_lower=0.0, phi_upper=math.inf):
    """One LANS update of one block, in place on x, m, v (all torch tensors of one shape)."""
    g = g.clone()
    if normalize_grad:
        gn = g.norm()
        if gn > 0:
            g = g / gn
    m.mul_(beta1).add_(g, alpha=1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    m_hat = m / (1.0 - beta1 ** step)
    v_hat = v / (1.0 - beta2 ** step)
    den = (v_hat + eps).sqrt() if eps_inside_sqrt else v_hat.sqrt() + eps
    r = m_hat / den
    c = g / den
    phi = min(max(x.norm().item(), phi_lower), phi_upper)

    def trust(u):
        norm = u.norm().item()
        ratio = phi / norm if norm > 0 else math.inf
        if ratio == 0.0 or not math.isfinite(ratio):
            # fallback: 1 (MXNet / LAMB); without it the term is dropped (never NaN).
            ratio = 1.0 if trust_ratio_fallback else 0.0
        return ratio

    ur = r + weight_decay * x
    uc = c + weight_decay * x
    update = beta1 * trust(ur) * ur + (1.0 - beta1) * trust(uc) * uc
    x.sub_(lr * update)


class ReferenceLANS:
    """Reference LANS over a list of tensors (one block per tensor)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, **kw):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd, self.kw = lr, betas, eps, weight_decay, kw
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        for x, m, v, g in zip(self.params, self.m, self.v, grads):
            reference_lans_step(x, m, v, g, self.t, self.lr, self.betas[0], self.betas[1],
                                self.eps, self.wd, **self.kw)


# ---------------------------------------------------------------------------------------------
# Worker processes. run_workers() starts one process per worker rank running this file as a
# script: it initialises bitpush.torch from the cluster's environment, calls one of the worker
# functions below with JSON keyword arguments and writes its JSON result to a file.

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "examples")


def run_workers(cluster, workers, jobs, timeout=240):
    """Runs `jobs` ([(function name of this module, kwargs), ...], one after the other) in
    `workers` processes (ranks 0..n-1) with cluster.env(rank): a cluster's worker ranks register
    once, so everything one cluster runs goes into one process per rank. Returns
    results[rank][job]. Fails with every worker's output when one exits non-zero or the
    timeout passes."""
    return start_workers(cluster, workers, jobs).wait(timeout)


class Workers:
    """Worker processes started by start_workers()."""

    def __init__(self, cluster, workers, jobs):
        self.jobs = [[f, kw] for f, kw in jobs]
        self.tmp = tempfile.mkdtemp(prefix="bitpush-clan-")
        self.procs, self.outs, self.logs = [], [], []
        try:
            self._start(cluster, workers)
        except BaseException:
            self.close()
            raise

    def _start(self, cluster, workers):
        for rank in range(workers):
            env = dict(os.environ)
            env.update({k: str(v) for k, v in cluster.env(rank).items()})
            out = os.path.join(self.tmp, "rank%d.json" % rank)
            log = open(os.path.join(self.tmp, "rank%d.log" % rank), "w+")
            self.procs.append(subprocess.Popen(
                [sys.executable, __file__, json.dumps(self.jobs), out], env=env, stdout=log,
                stderr=subprocess.STDOUT))
            self.outs.append(out)
            self.logs.append(log)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Kills what still runs and removes the scratch directory (every exit path)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def wait(self, timeout=240):
        try:
            return self._wait(timeout)
        finally:
            self.close()

    def _wait(self, timeout):
        deadline = time.time() + timeout
        failed = None
        for p in self.procs:
            try:
                rc = p.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0 and failed is None:
                failed = rc
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        logs = []
        for rank, log in enumerate(self.logs):
            log.seek(0)
            logs.append("--- worker %d ---\n%s" % (rank, log.read()[-6000:]))
        self.output = "\n".join(logs)
        if failed is not None:
            raise AssertionError("worker jobs %s failed (%s):\n%s"
                                 % ([j[0] for j in self.jobs], failed, self.output))
        results = []
        for out in self.outs:
            with open(out) as f:
                results.append(json.load(f))
        return results


def start_workers(cluster, workers, jobs):
    return Workers(cluster, workers, jobs)


def _make_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 5), torch.nn.Tanh(),
                                torch.nn.Linear(5, 3, bias=True))
    torch.nn.init.zeros_(model[0].bias)  # a zero-initialised bias: trust-ratio fallback
    return model


def _batch(rank, step, n=9):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 7, generator=g), torch.randn(n, 3, generator=g)


def _grads(model, rank, step, passes=1):
    """This rank's (accumulated) gradient at `step`, computed on a throw-away copy (on the
    model's device)."""
    import copy

    m = copy.deepcopy(model)
    device = next(m.parameters()).device
    for k in range(passes):
        x, y = (t.to(device) for t in _batch(rank, step * 10 + k))
        ((m(x) - y) ** 2).mean().backward()
    return [p.grad.clone() for p in m.parameters()]


def _averaged(model, size, step, passes=1):
    per_rank = [_grads(model, r, step, passes) for r in range(size)]
    return [sum(gs[r] for r in range(size)) / size for gs in zip(*per_rank)]


def w_clan_vs_reference(steps=20, lr=0.02, weight_decay=0.01, passes=1, compression="none",
                        error_feedback=False, prefix=None, device="cpu"):
    """CLAN on this worker vs the reference LANS applied to the average (computed locally) of
    every worker's gradient; returns the largest difference. device "cuda": the model, its
    gradients and the reference on the GPU (CLAN's update is LansStepCuda there)."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    model = _make_model(0).to(device)
    ref = [p.detach().clone() for p in model.parameters()]
    named = None if prefix is None else [(prefix + n, p) for n, p in model.named_parameters()]
    opt = bp.CLAN(model.parameters(), lr=lr, weight_decay=weight_decay, compression=compression,
                  error_feedback=error_feedback, backward_passes_per_step=passes,
                  named_parameters=named)
    reference = ReferenceLANS(ref, lr=lr, weight_decay=weight_decay)
    worst = 0.0
    for step in range(steps):
        avg = _averaged(model, size, step, passes)
        opt.zero_grad()
        for k in range(passes):
            x, y = (t.to(device) for t in _batch(rank, step * 10 + k))
            ((model(x) - y) ** 2).mean().backward()
        opt.step()
        reference.step(avg)
        worst = max(worst, max((a - b).abs().max().item()
                               for a, b in zip(model.parameters(), ref)))
    opt.remove_hooks()
    return {"max_abs_diff": worst, "step": opt.state_dict()["state"][0]["step"]}


def w_default_compression(steps=2):
    """CLAN, DistributedOptimizer and push_pull with no compression argument, one after the
    other: the compression_report of each one's tensors, CLAN's error_feedback and each one's
    pushed bytes."""
    import bitpush.torch as bp

    out = {}
    for what in ("clan", "dsgd"):
        model = _make_model(0)
        named = [("%s.%s" % (what, n), p) for n, p in model.named_parameters()]
        if what == "clan":
            opt = bp.CLAN(model.parameters(), lr=0.01, named_parameters=named)
            out["clan_error_feedback"] = opt.error_feedback
        else:
            opt = bp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                          named_parameters=named)
        before = bp.stats()["bytes_pushed"]
        for step in range(steps):
            opt.zero_grad()
            x, y = _batch(bp.rank(), step)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        opt.remove_hooks()
        out[what] = bp.compression_report([n for n, _ in named])
        out[what + "_bytes"] = bp.stats()["bytes_pushed"] - before
    bp.push_pull(torch.ones(64), "plain")
    out["push_pull"] = bp.compression_report(["plain"])
    return out


def _clan_steps(model, opt, first, count):
    import bitpush.torch as bp

    for step in range(first, first + count):
        opt.zero_grad()
        x, y = _batch(bp.rank(), step)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


def _clan(model, prefix):
    import bitpush.torch as bp

    named = [(prefix + n, p) for n, p in model.named_parameters()]
    return bp.CLAN([p for _, p in named], lr=0.02, named_parameters=named)


def w_checkpoint_first(path, before, after):
    """In one cluster: the uninterrupted run of before + after steps (tensors 'u.'), and the
    first `before` steps of the same run (tensors 'c.') ending in save_checkpoint(path).
    Returns the uninterrupted run's parameters."""
    import bitpush.torch as bp

    model = _make_model(0)
    opt = _clan(model, "u.")
    _clan_steps(model, opt, 0, before + after)
    opt.remove_hooks()
    reference = [p.detach().clone() for p in model.parameters()]
    model = _make_model(0)
    opt = _clan(model, "c.")
    _clan_steps(model, opt, 0, before)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bp.save_checkpoint(path, model, opt)
    opt.remove_hooks()
    return {"reference": [t.tolist() for t in reference],
            "warnings": [str(w.message) for w in caught]}


def w_checkpoint_resume(path, before, after, compression=None):
    """A fresh job (new processes, new cluster) resumes from `path` and runs `after` more
    steps; returns its parameters, or the load's refusal."""
    import bitpush.torch as bp

    model = _make_model(7)  # other initial values: the checkpoint must replace them
    named = [("c." + n, p) for n, p in model.named_parameters()]
    opt = bp.CLAN([p for _, p in named], lr=0.02, named_parameters=named,
                  compression=compression)
    try:
        bp.load_checkpoint(path, model, opt)
    except ValueError as e:
        opt.remove_hooks()
        return {"refused": str(e)}
    _clan_steps(model, opt, before, after)
    opt.remove_hooks()
    return {"params": [p.detach().tolist() for p in model.parameters()]}


def w_rank0_state_dict_everywhere(steps=2):
    """The habit save_checkpoint replaces: rank 0's optimizer.state_dict() loaded by every
    worker. Returns None or the refusal."""
    import bitpush.torch as bp

    model = _make_model(0)
    opt = _clan(model, "h.")
    _clan_steps(model, opt, 0, steps)
    # Rank 0's state dict, as bytes, to every worker.
    mine = torch.frombuffer(bytearray(_save(opt.state_dict()).getvalue()), dtype=torch.uint8)
    size = torch.tensor([float(mine.numel())])
    bp.broadcast_parameters([("habit.size", size)], root_rank=0)
    buf = mine if bp.rank() == 0 else torch.zeros(int(size.item()), dtype=torch.uint8)
    bp.broadcast_parameters([("habit.blob", buf)], root_rank=0)
    import io

    loaded = torch.load(io.BytesIO(buf.numpy().tobytes()))
    try:
        opt.load_state_dict(loaded)
        result = None
    except ValueError as e:
        result = str(e)
    opt.remove_hooks()
    return result


def w_distributed_sgd(steps=10, lr=0.1, passes=1, prefix="dsgd."):
    """DistributedOptimizer(SGD with momentum) vs SGD on the averaged gradient."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    model = _make_model(1)
    ref_model = _make_model(1)
    opt = bp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                  named_parameters=[(prefix + n, p)
                                                    for n, p in model.named_parameters()],
                                  backward_passes_per_step=passes)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=lr, momentum=0.9)
    worst, clipped = 0.0, False
    for step in range(steps):
        avg = _averaged(ref_model, size, step, passes)
        opt.zero_grad()
        for k in range(passes):
            x, y = _batch(rank, step * 10 + k)
            ((model(x) - y) ** 2).mean().backward()
        if step == steps - 1:
            # synchronize() then clip, then step() inside skip_synchronize().
            opt.synchronize()
            grads = [p.grad.clone() for p in model.parameters()]
            worst = max(worst, max((a - b).abs().max().item() for a, b in zip(grads, avg)))
            with opt.skip_synchronize():
                opt.step()
            clipped = True
        else:
            opt.step()
        for p, g in zip(ref_model.parameters(), avg):
            p.grad = g
        ref_opt.step()
        worst = max(worst, max((a - b).abs().max().item()
                               for a, b in zip(model.parameters(), ref_model.parameters())))
    opt.remove_hooks()
    return {"max_abs_diff": worst, "skip_synchronize_used": clipped,
            "is_sgd": isinstance(opt, torch.optim.SGD)}


def w_state_dict_round_trip(steps=6, lr=0.02):
    """Training 2*steps in one go equals steps, checkpoint into a fresh model + CLAN, steps."""
    import bitpush.torch as bp

    rank = bp.rank()

    def train(model, opt, first, n):
        for step in range(first, first + n):
            opt.zero_grad()
            x, y = _batch(rank, step * 10)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()

    a = _make_model(2)
    oa = bp.CLAN(a.parameters(), lr=lr, weight_decay=0.01, compression="none",
                 named_parameters=[("rt.a." + n, p) for n, p in a.named_parameters()])
    train(a, oa, 0, steps)
    # state_dict() returns references to the live state (torch's behaviour): serialise now.
    sd = torch.load(_save(oa.state_dict()))
    msd = {k: v.clone() for k, v in a.state_dict().items()}
    train(a, oa, steps, steps)

    b = _make_model(3)
    b.load_state_dict(msd)
    ob = bp.CLAN(b.parameters(), lr=lr, weight_decay=0.01, compression="none",
                 named_parameters=[("rt.a." + n, p) for n, p in b.named_parameters()])
    oa.remove_hooks()
    ob.load_state_dict(sd)
    train(b, ob, steps, steps)
    ob.remove_hooks()
    diff = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
    st = ob.state_dict()["state"][0]
    return {"max_abs_diff": diff, "step": st["step"], "has_moments": "exp_avg" in st
            and "exp_avg_sq" in st, "bitpush": {k: v for k, v in sd["bitpush"].items()
                                                if k != "names"}}


def w_ef_state_round_trip(steps=5, lr=0.02):
    """CLAN + onebit with worker error feedback: training 2*steps in one go equals steps,
    checkpoint (moments AND worker residuals) into a fresh model + CLAN over the same tensor
    names, steps. A control run restores the checkpoint with zeroed residuals: it must
    differ (the residual matters)."""
    import bitpush.torch as bp

    rank = bp.rank()

    def train(model, opt, first, n):
        for step in range(first, first + n):
            opt.zero_grad()
            x, y = _batch(rank, step * 10)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()

    def names(m):
        return [("ef." + n, p) for n, p in m.named_parameters()]

    a = _make_model(2)
    oa = bp.CLAN(a.parameters(), lr=lr, compression="onebit", error_feedback=True,
                 named_parameters=names(a))
    train(a, oa, 0, steps)
    sd = torch.load(_save(oa.state_dict()))
    msd = {k: v.clone() for k, v in a.state_dict().items()}
    train(a, oa, steps, steps)
    oa.remove_hooks()
    after_a = [p.detach().clone() for p in a.parameters()]
    residuals = sd["bitpush"]["ef_residuals"]

    def resume(zero_residuals):
        b = _make_model(3)
        b.load_state_dict(msd)
        ob = bp.CLAN(b.parameters(), lr=lr, compression="onebit", error_feedback=True,
                     named_parameters=names(b))
        ckpt = torch.load(_save(sd))
        if zero_residuals:
            ckpt["bitpush"]["ef_residuals"] = {k: torch.zeros_like(v)
                                               for k, v in residuals.items()}
        ob.load_state_dict(ckpt)
        train(b, ob, steps, steps)
        ob.remove_hooks()
        return max((p - q).abs().max().item() for p, q in zip(after_a, b.parameters()))

    return {"residual_names": sorted(residuals), "nonzero": {
        k: int((v != 0).sum()) for k, v in residuals.items()},
        "numel": {k: v.numel() for k, v in residuals.items()},
        "diff_restored": resume(False), "diff_zeroed": resume(True)}


def w_ddp_hook(port, steps=3, compression="none"):
    """DDP (gloo process group for DDP's own collectives) with bp.push_pull_hook: after each
    backward, p.grad equals the average of every rank's gradient."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    model = _make_model(4)
    ddp = DDP(model)
    state = bp.PushPullHookState(compression=compression, prefix="ddp")
    ddp.register_comm_hook(state, bp.push_pull_hook)
    worst = 0.0
    for step in range(steps):
        avg = _averaged(model, size, step)
        ddp.zero_grad()
        x, y = _batch(rank, step * 10)
        ((ddp(x) - y) ** 2).mean().backward()
        worst = max(worst, max((p.grad - g).abs().max().item()
                               for p, g in zip(model.parameters(), avg)))
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    state.close()
    dist.destroy_process_group()
    # the buckets went through bitpush (not the gloo all-reduce)
    return {"max_abs_diff": worst, "bytes_pushed": int(bp.stats()["bytes_pushed"])}


def w_train_until_error(ready_file, seconds=60.0, compression="none"):
    """CLAN steps until the cluster fails; returns the error, when it was raised, and from
    which call (the test kills a server once ready_file exists)."""
    import bitpush.torch as bp

    rank = bp.rank()
    model = _make_model(5)
    opt = bp.CLAN(model.parameters(), lr=0.01, compression=compression, error_feedback=False,
                  named_parameters=[("kill." + n, p) for n, p in model.named_parameters()])
    t_end, step = time.time() + seconds, 0
    while time.time() < t_end:
        where = "backward"
        try:
            opt.zero_grad()
            x, y = _batch(rank, step)
            ((model(x) - y) ** 2).mean().backward()
            where = "step"
            opt.step()
        except bp.BitpushError as e:
            return {"error": str(e), "type": type(e).__name__, "t_error": time.time(),
                    "steps": step, "where": where}
        step += 1
        if step == 5 and rank == 0:
            open(ready_file, "w").close()
        time.sleep(0.01)
    return {"error": None, "steps": step}


def _server_opt(model, prefix, rule, lr, compression=None, pull=None, **kw):
    import bitpush.torch as bp

    named = [(prefix + n, p) for n, p in model.named_parameters()]
    return bp.ServerOptimizer([p for _, p in named], rule=rule, lr=lr, named_parameters=named,
                              compression=compression, pull=pull, **kw)


def w_server_vs_torch(rule, steps=8, lr=0.05, prefix="so."):
    """ServerOptimizer (uncompressed pushes, raw fp32 pulls) vs the same torch optimizer run
    here on the averaged gradient, with an lr schedule that the servers must follow (halved
    every 3 steps); returns the largest difference, whether every rank's start came from rank
    0, and the worker-side optimizer state's size."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    model = _make_model(rank)  # ranks start apart: construction installs rank 0's weights
    ref_model = _make_model(0)
    kw = {"sgd": dict(momentum=0.9), "adamw": dict(weight_decay=0.01),
          "lans": dict(weight_decay=0.01)}[rule]
    opt = _server_opt(model, prefix + rule + ".", rule, lr, **kw)
    started_equal = all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                            ref_model.parameters()))
    if rule == "sgd":
        ref_opt = torch.optim.SGD(ref_model.parameters(), lr=lr, **kw)
    elif rule == "adamw":
        ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=lr, **kw)
    else:
        ref_opt = None
        reference = ReferenceLANS(list(ref_model.parameters()), lr=lr, **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ref_sched = None if ref_opt is None else \
        torch.optim.lr_scheduler.StepLR(ref_opt, step_size=3, gamma=0.5)
    worst = 0.0
    for step in range(steps):
        avg = _averaged(ref_model, size, step)
        opt.zero_grad()
        x, y = _batch(rank, step * 10)  # _averaged's batch of the step
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        sched.step()
        if ref_opt is not None:
            for p, g in zip(ref_model.parameters(), avg):
                p.grad = g
            ref_opt.step()
            ref_sched.step()
        else:
            reference.lr = lr * 0.5 ** (step // 3)
            with torch.no_grad():
                reference.step(avg)
        worst = max(worst, max((a - b).abs().max().item()
                               for a, b in zip(model.parameters(), ref_model.parameters())))
    opt.remove_hooks()
    return {"max_abs_diff": worst, "started_equal": started_equal,
            "worker_state": len(opt.state), "lr": opt.param_groups[0]["lr"],
            "params": [p.detach().tolist() for p in model.parameters()]}


def w_server_cuda(steps=4, lr=0.05):
    """ServerOptimizer on CUDA parameters (staged through host memory) vs torch SGD on the CPU
    with the averaged gradient."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    model = _make_model(rank).cuda()
    ref_model = _make_model(0)
    opt = _server_opt(model, "cuda.", "sgd", lr, momentum=0.9)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=lr, momentum=0.9)
    worst = 0.0
    for step in range(steps):
        avg = _averaged(ref_model, size, step)
        opt.zero_grad()
        x, y = (t.cuda() for t in _batch(rank, step * 10))
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        for p, g in zip(ref_model.parameters(), avg):
            p.grad = g
        ref_opt.step()
        worst = max(worst, max((a.cpu() - b).abs().max().item()
                               for a, b in zip(model.parameters(), ref_model.parameters())))
    opt.remove_hooks()
    return {"max_abs_diff": worst, "worker_state": len(opt.state)}


def w_server_checkpoint(path, before, after, resume):
    """ServerOptimizer with TLq-HS pushes and qWD pulls (random in (key, round)). First job
    (resume False): `before` steps, save_checkpoint, `after` more steps: returns the final
    parameters. Resumed job: other starting values, load_checkpoint, `after` steps."""
    import bitpush.torch as bp

    model = _make_model(0 if not resume else 5)
    opt = _server_opt(model, "sc.", "adamw", 0.02, compression="sdp4bit", pull=bp.QWD,
                      weight_decay=0.01)
    if not resume:
        _clan_steps(model, opt, 0, before)
        bp.save_checkpoint(path, model, opt)
        saved = [p.detach().clone() for p in model.parameters()]
    else:
        bp.load_checkpoint(path, model, opt)
        saved = [p.detach().clone() for p in model.parameters()]
    _clan_steps(model, opt, before, after)
    opt.remove_hooks()
    return {"at_save": [t.tolist() for t in saved],
            "params": [p.detach().tolist() for p in model.parameters()]}


def w_server_rejoin(path, flag_dir, total=8, save_at=3, fail_at=None, kind="server",
                    idle=False):
    """ServerOptimizer (adamw; kind "clan": CLAN on the workers with the cluster's compression
    and error feedback) for `total` steps with a checkpoint after `save_at`. With
    `fail_at`, rank 0 asks the test to kill server 1 before that step (flag file "kill") and
    waits until it did ("killed"); the failed step raises Unavailable on every worker, which
    waits for the server to rejoin, restores the checkpoint and goes on from `save_at`. `idle`:
    rank 1 pushes nothing until the test says the server rejoined (flag "rejoined"), so only
    the rolled-back latch tells it to restore too."""
    import bitpush.torch as bp

    model = _make_model(0)
    if kind == "clan":
        opt = _clan(model, "rj.")
    else:
        opt = _server_opt(model, "rj.", "adamw", 0.02, weight_decay=0.01)
    step, recovered, errors = 0, 0, []
    while step < total:
        try:
            if step == save_at and recovered == 0:
                bp.save_checkpoint(path, model, opt)
            if step == fail_at and recovered == 0 and bp.rank() == 0:
                open(os.path.join(flag_dir, "kill"), "w").close()
                deadline = time.time() + 30
                while not os.path.exists(os.path.join(flag_dir, "killed")):
                    if time.time() > deadline:
                        raise RuntimeError("the test did not kill server 1")
                    time.sleep(0.02)
            while step == fail_at and recovered == 0 and idle and bp.rank() == 1 and \
                    not os.path.exists(os.path.join(flag_dir, "rejoined")):
                time.sleep(0.02)  # bounded by the test, which writes it or fails
            _clan_steps(model, opt, step, 1)
            step += 1
        except bp.BitpushError as e:
            if getattr(e, "code", None) != "Unavailable" or recovered > 0:
                raise
            errors.append(str(e))
            bp.wait_for_servers(60)
            bp.load_checkpoint(path, model, opt)
            step = save_at
            recovered += 1
    opt.remove_hooks()
    return {"params": [p.detach().tolist() for p in model.parameters()], "recovered": recovered,
            "errors": errors}


def w_distributed_mixed(steps=6, lr=0.05):
    """DistributedOptimizer(SGD with momentum) under optimizer.placement: server with the
    biases placed on the workers (optimizer.overrides): every parameter follows torch SGD on
    the averaged gradient; the momentum buffers of the biases live here, the weights' on the
    servers."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    model = _make_model(rank)
    ref_model = _make_model(0)
    named = [("mx." + n, p) for n, p in model.named_parameters()]
    opt = bp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                  named_parameters=named)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    started_equal = None
    worst = 0.0
    for step in range(steps):
        if started_equal is None:
            started_equal = [torch.equal(a, b) for a, b in zip(model.parameters(),
                                                                 ref_model.parameters())]
        avg = _averaged(ref_model, size, step)
        opt.zero_grad()
        x, y = _batch(rank, step * 10)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        sched.step()
        for p, g in zip(ref_model.parameters(), avg):
            p.grad = g
        ref_opt.step()
        ref_sched.step()
        worst = max(worst, max((a - b).abs().max().item()
                               for a, b in zip(model.parameters(), ref_model.parameters())))
    local_state = [n for n, p in named if p in opt._local.state] if opt._local else []
    opt.remove_hooks()
    return {"type": type(opt).__name__, "max_abs_diff": worst, "local_state": local_state,
            "worker_state": len(opt.state), "started_equal": started_equal}


def w_distributed_placement(steps=3):
    """DistributedOptimizer(SGD) in a cluster whose YAML says optimizer.placement: server."""
    import bitpush.torch as bp

    model = _make_model(bp.rank())
    named = [("dp." + n, p) for n, p in model.named_parameters()]
    opt = bp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=named)
    _clan_steps(model, opt, 0, steps)
    out = {"type": type(opt).__name__, "rule": opt.rule, "worker_state": len(opt.state),
           "params": [p.detach().tolist() for p in model.parameters()]}
    try:
        bp.DistributedOptimizer(torch.optim.RMSprop(_make_model(0).parameters(), lr=0.1))
    except TypeError as e:
        out["refused"] = str(e)
    opt.remove_hooks()
    return out


def _save(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def w_binsgdm_run(steps=6, lr=0.01, weight_decay=0.0, prefix="bs."):
    """BinSGDM over a compressed weight (3000 elements: three keys at partition_bytes 4096)
    and an uncompressed bias (40, below min_compress_bytes: SoftSignSGD). Returns the final
    parameters, the largest deviation of any weight's per-step move from +-lr (weight_decay
    0), the bytes pushed, and the worker state's size."""
    import bitpush.torch as bp

    torch.manual_seed(3)
    w = torch.nn.Parameter(torch.randn(3000))
    b = torch.nn.Parameter(torch.randn(40))
    opt = bp.BinSGDM([w, b], lr=lr, weight_decay=weight_decay,
                     named_parameters=[(prefix + "w", w), (prefix + "b", b)])
    pushed0 = bp.stats()["bytes_pushed"]
    worst = 0.0
    for t in range(steps):
        gen = torch.Generator().manual_seed(100 * t + bp.rank())
        w.grad = torch.randn(3000, generator=gen) + 0.3
        b.grad = torch.randn(40, generator=gen)
        before = w.detach().clone()
        opt.step()
        moved = (w.detach().double() - before.double()).abs()
        worst = max(worst, (moved - lr).abs().max().item())
    state = bp.error_feedback_state(prefix + "w")
    # The state_dict carries the engine's m, b, e; loading it back (after zeroing them in the
    # engine) puts them back exactly.
    sd = opt.state_dict()
    bp.restore_error_feedback_state(prefix + "w", torch.zeros_like(state))
    opt.load_state_dict(sd)
    restored = bp.error_feedback_state(prefix + "w")
    return {"w": w.detach().tolist(), "b": b.detach().tolist(), "worst_move_error": worst,
            "bytes_pushed": bp.stats()["bytes_pushed"] - pushed0,
            "state_values": None if state is None else state.numel(),
            "state_restored": bool(torch.equal(state, restored)),
            "bias_state": sorted(opt.state[b].keys())}


def w_binsgdm_refused():
    """BinSGDM in a cluster that keeps no worker error feedback: the message."""
    import bitpush.torch as bp

    p = torch.nn.Parameter(torch.zeros(4096))
    try:
        bp.BinSGDM([p], lr=0.01)
    except ValueError as e:
        return str(e)
    return None


def _example_runs(example, configs, prefix):
    """Several runs of examples/<example>.py in one cluster, tensor names prefixed per run."""
    import importlib

    sys.path.insert(0, EXAMPLES)
    module = importlib.import_module(example)
    torch.set_num_threads(1)
    return [module.run(module.parse_args(list(argv) + ["--no-progress"]),
                       prefix="%s%d." % (prefix, i)) for i, argv in enumerate(configs)]


def w_digits_runs(configs):
    """Several train_digits runs in one cluster (tensor names prefixed per run)."""
    return _example_runs("train_digits", configs, "run")


def w_charlm_runs(configs):
    """Several train_charlm runs in one cluster (tensor names prefixed per run)."""
    return _example_runs("train_charlm", configs, "lm")


def _worker_main(jobs_json, out):
    import bitpush.torch as bp

    torch.set_num_threads(1)
    bp.init()
    try:
        result = [globals()[f](**kw) for f, kw in json.loads(jobs_json)]
    finally:
        try:
            bp.shutdown()
        except Exception as e:  # the result (or the failure) matters, not the shutdown
            print("shutdown: %s" % e, file=sys.stderr)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    _worker_main(*sys.argv[1:3])
