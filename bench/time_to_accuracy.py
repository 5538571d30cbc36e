#!/usr/bin/python3
"""Time to accuracy on real data: DDP (fp32, fp16 hook, PowerSGD hook) against bitpush's
methods, each trained to the validation metric uncompressed DDP reaches
(docs/time-to-accuracy.md).

    PYTHONPATH=build/python /usr/bin/python3 bench/time_to_accuracy.py \
        --workers 4 --tasks digits-cnn,charlm --step-times step_ms.json

Tasks (real data from Debian packages):
  digits-cnn  a small CNN on scikit-learn's digits (8x8), train_digits.py's 75/25 split;
              metric: test accuracy in % (higher is better).
  charlm      train_charlm.py's byte-level causal transformer on its corpus (the Python
              standard library's sources); metric: validation loss in nats per byte (lower is
              better), train_charlm.validation_loss.

Runs (the same shards, seed, steps and lr schedule, --workers processes on loopback):
  ddp-fp32, ddp-fp16, ddp-powersgd   torch DistributedDataParallel over gloo, default buckets;
                                     no hook / default_hooks.fp16_compress_hook /
                                     powerSGD_hook (rank 4, start at 10 % of the steps)
  bitpush-lans                       LANS, uncompressed (bitpush's `none`)
  bitpush-clan-onebit, -sdp4bit, -loco   CLAN with that compressor
  bitpush-binsgdm                    BinSGDM
  bitpush-adamw-sdp4bit, -onebit     DistributedOptimizer(AdamW) with that compressor, at
                                     DDP's lr (the same optimizer as DDP's runs)
The bitpush runs use the examples' recipes (examples/bitpush_example.py: optimizer, lr,
the local cluster's error feedback and min_compress_bytes).

The target of a task is DDP fp32's best evaluation relaxed by a tolerance (--tolerance). Each
run's record: its curve [(step, wall_s, metric)] at every evaluation (step 0, every
--eval-every steps, the last step; wall_s = rank 0's training time, evaluations excluded),
steps_to_target and wall_s_to_target (the first evaluation that meets the target; null if
none), the final and best metric. With --step-times FILE (a JSON {run: step_ms} or
{task: {run: step_ms}}) each run also gets projected_s_to_target = steps_to_target x step_ms /
1000 (ddp-powersgd: its first start_powerSGD_iter steps at ddp-fp32's step time, as they are
plain all-reduces) and the speedups against ddp-fp32 and ddp-powersgd (their time / this
run's), as the wall figures get without it.

Output (--out DIR): results.json (written after every run), <task>-wall.png and (with step
times) <task>-projected.png; a markdown table on stdout. --from-results FILE[,FILE...]: no
training, the analysis, plots and tables of finished results files again (merged), e.g. with
new --step-times. The analysis and report are bench/time_to_accuracy_report.py.

Exit: 0 ok, 1 a run failed (its ranks' log tails on stderr), 2 usage, 3 no torch /
torch.distributed with gloo / scikit-learn.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, "examples")
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from train_driver import leave_without_teardown  # noqa: E402  bench/train_driver.py
from time_to_accuracy_report import (DDP_VARIANTS, RUN_ORDER, Task, analyse,  # noqa: E402
                                     load_step_times, plot, summarise_seeds, summary_table,
                                     table, write_json)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSING = 3

POWERSGD_RANK = 4
POWERSGD_START_FRACTION = 0.1  # torch's PowerSGDState docstring: "start with 10% of the steps"
MIN_COMPRESS_BYTES = 4096  # the examples' local cluster

# bitpush runs: (the examples' --optimizer, --compression); the lr is the example's default.
BITPUSH_RUNS = {"bitpush-lans": ("lans", "none"),
                "bitpush-clan-onebit": ("clan", "onebit"),
                "bitpush-clan-sdp4bit": ("clan", "sdp4bit"),
                "bitpush-clan-loco": ("clan", "loco:scale=4096"),
                "bitpush-binsgdm": ("binsgdm", "binsgdm"),
                "bitpush-adamw-sdp4bit": ("adamw", "sdp4bit"),
                "bitpush-adamw-onebit": ("adamw", "onebit")}
# DistributedOptimizer(AdamW) runs train with DDP's optimizer, so they take DDP's lr (the
# task's, or --ddp-lr) rather than the example's AdamW default.
SAME_OPTIMIZER_AS_DDP = ("adamw",)


# The examples' default lengths: train_digits' 10 epochs at 2 workers (210 steps) and
# train_charlm's 300 steps, whatever --workers is, so every W trains the same number of steps.
TASKS = {
    "digits-cnn": Task("digits-cnn", 210, 10, "test_accuracy", True, 0.5, "adamw", 0.02,
                       "train_digits", "%"),
    "charlm": Task("charlm", 300, 20, "val_loss", False, 0.02, "adamw", 0.01, "train_charlm",
                   "nats/byte"),
}


# -- the rank process --------------------------------------------------------------------------


def import_examples():
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import bitpush_example
    import train_charlm
    import train_digits
    return bitpush_example, train_digits, train_charlm


def digits_cnn(torch):
    """train_digits' CNN (--model cnn)."""
    return import_examples()[1].CNN()


class DigitsData:
    """train_digits.py's split and batches: shard rank::world, a new permutation per epoch."""

    def __init__(self, torch, seed, rank, world, batch_size):
        _, train_digits, _ = import_examples()
        x_tr, y_tr, self.x_te, self.y_te = train_digits.load_data(seed)
        self.torch = torch
        self.x, self.y = x_tr[rank::world], y_tr[rank::world]
        self.batch_size = batch_size
        self.per_epoch = len(x_tr) // (world * batch_size)
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)
        self.perm, self.pos = None, self.per_epoch

    def next(self):
        if self.pos >= self.per_epoch:
            self.perm = self.torch.randperm(len(self.x), generator=self.gen)
            self.pos = 0
        idx = self.perm[self.pos * self.batch_size:(self.pos + 1) * self.batch_size]
        self.pos += 1
        return self.x[idx], self.y[idx]

    def loss(self, model, batch):
        return self.torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    def evaluate(self, model):
        with self.torch.no_grad():
            return (model(self.x_te).argmax(1) == self.y_te).float().mean().item() * 100.0


class CharData:
    """train_charlm.py's corpus, shards (a contiguous slice per rank) and validation."""

    def __init__(self, torch, seed, rank, world):
        _, _, train_charlm = import_examples()
        self.ch = train_charlm
        self.args = train_charlm.parse_args(["--seed", str(seed)])
        train, self.val = train_charlm.load_text(self.args)
        per = len(train) // world
        self.shard = train[rank * per:(rank + 1) * per]
        self.torch = torch
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def next(self):
        a = self.args
        starts = self.torch.randint(0, len(self.shard) - a.context - 1, (a.batch_size,),
                                    generator=self.gen)
        return self.ch.batch(self.shard, starts, a.context)

    def loss(self, model, batch):
        x, y = batch
        return self.torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))

    def evaluate_shared(self, model, rank, world, allreduce_sum):
        """train_charlm.validation_loss, its windows shared out among the ranks (rank r
        takes windows r, r + world, ...) and summed back: the same value, bit for bit (each
        window's loss travels as the fp32 it is, added to zeros)."""
        n = self.args.val_batches
        mine = self.ch.validation_losses(model, self.val, self.args, range(rank, n, world))
        t = self.torch.zeros(n, dtype=self.torch.float32)
        for i, v in mine.items():
            t[i] = v
        losses = allreduce_sum(t).tolist()
        return sum(losses[i] for i in range(n)) / n


def rank_task(torch, spec, rank, world):
    """(model, data) of spec's task, the model initialised from the seed."""
    torch.manual_seed(spec["seed"])
    if spec["task"] == "digits-cnn":
        model = digits_cnn(torch)
        data = DigitsData(torch, spec["seed"], rank, world, spec["batch_size"])
    else:
        data = CharData(torch, spec["seed"], rank, world)
        torch.manual_seed(spec["seed"])
        model = data.ch.CharLM(data.args)
    return model, data


def example_args(spec):
    """The argparse namespace the examples' optimizer factory and scheduler read."""
    return argparse.Namespace(optimizer=spec["optimizer"], compression=spec["compression"],
                              lr=spec["lr"], weight_decay=0.0, no_error_feedback=False,
                              error_feedback_decay=None, server_side=False, pull=None,
                              seed=spec["seed"], lr_schedule="cosine", warmup=spec["warmup"])


def powersgd_start(steps):
    return max(2, int(round(POWERSGD_START_FRACTION * steps)))


def run_rank(spec):
    """One rank of one run; rank 0 writes {curve, ...} to spec["result"]."""
    import torch

    torch.set_num_threads(1)
    ex, _, _ = import_examples()
    ddp = spec["run"] in DDP_VARIANTS
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
        rank, world = dist.get_rank(), dist.get_world_size()
        barrier = dist.barrier

        def allreduce_sum(t):
            dist.all_reduce(t)
            return t
    else:
        import bitpush.torch as bp
        bp.init()
        rank, world = bp.rank(), bp.size()
        barrier = bp.barrier

        def allreduce_sum(t):
            return bp.push_pull(t, "tta.validation", compression="none", average=False)
    model, data = rank_task(torch, spec, rank, world)
    args = example_args(spec)
    extra = {}
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)  # default buckets; broadcasts rank 0's weights
        variant = DDP_VARIANTS[spec["run"]]
        if variant == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif variant == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
            state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                     start_powerSGD_iter=spec["powersgd_start_iter"],
                                     random_seed=spec["seed"])
            net.register_comm_hook(state, ps.powerSGD_hook)
        if spec["optimizer"] == "adamw":
            opt = torch.optim.AdamW(net.parameters(), lr=spec["lr"], weight_decay=0.0)
        else:
            opt = torch.optim.SGD(net.parameters(), lr=spec["lr"], momentum=0.9)
    else:
        net = model
        bp.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = ex.build_optimizer(args, model)
        pushed0 = ex.bytes_pushed()
    sched = ex.lr_scheduler(args, opt, spec["steps"])

    curve = []
    train_s = 0.0

    def evaluate(step):
        # Every rank holds the same model. digits: rank 0 evaluates, the others wait at the
        # barrier; charlm: the ranks share the validation windows out. The clock is stopped
        # meanwhile, on every rank.
        if hasattr(data, "evaluate_shared"):
            value = data.evaluate_shared(model, rank, world, allreduce_sum)
        else:
            value = data.evaluate(model) if rank == 0 else None
            barrier()
        if rank == 0:
            curve.append([step, round(train_s, 4), value])
            print("%s %s: step %d, %.1f s, %s %.4f" % (spec["task"], spec["run"], step, train_s,
                                                       spec["metric"], value), flush=True)

    barrier()
    evaluate(0)
    for step in range(1, spec["steps"] + 1):
        t0 = time.perf_counter()
        batch = data.next()
        opt.zero_grad()
        loss = data.loss(net, batch)
        loss.backward()
        opt.step()
        sched.step()
        train_s += time.perf_counter() - t0
        if step % spec["eval_every"] == 0 or step == spec["steps"]:
            evaluate(step)
    if not ddp:
        extra["bytes_pushed"] = ex.bytes_pushed() - pushed0
        extra.update(ex.quantizer_summary())
        if hasattr(opt, "remove_hooks"):
            opt.remove_hooks()
    if rank == 0:
        with open(spec["result"], "w") as f:
            json.dump({"curve": curve, "train_s": train_s, "last_loss": loss.item(), **extra}, f)
    if ddp:
        leave_without_teardown(dist)
    bp.shutdown()
    return 0


# -- the parent: one run at a time -------------------------------------------------------------


def run_spec(task, run, a, steps):
    spec = {"task": task.name, "run": run, "metric": task.metric, "seed": a.seed, "steps": steps,
            "eval_every": a.eval_every[task.name], "warmup": 0.05, "batch_size": 32}
    if run in DDP_VARIANTS:
        spec.update(optimizer=a.ddp_optimizer or task.ddp_optimizer,
                    lr=a.ddp_lr if a.ddp_lr is not None else task.ddp_lr, compression=None)
        if run == "ddp-powersgd":
            spec["powersgd_start_iter"] = powersgd_start(steps)
            spec["powersgd_rank"] = POWERSGD_RANK
    else:
        optimizer, compression = BITPUSH_RUNS[run]
        ex, train_digits, train_charlm = import_examples()
        module = train_digits if task.example == "train_digits" else train_charlm
        if optimizer in SAME_OPTIMIZER_AS_DDP:
            default_lr = a.ddp_lr if a.ddp_lr is not None else task.ddp_lr
        else:
            default_lr = module.DEFAULT_LR[optimizer]
        spec.update(optimizer=optimizer, compression=compression,
                    lr=a.lr.get(run, default_lr))
    return spec


def start_ranks(spec_path, envs, log_dir):
    procs = []
    for r, env in enumerate(envs):
        log = open(os.path.join(log_dir, "rank%d.log" % r), "wb")
        procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-spec",
                                        spec_path], env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    return procs


def wait_ranks(procs, timeout_s, log_dir, what):
    """Waits for every rank (bounded by timeout_s); raises RuntimeError naming the failed rank
    with the log tails of all."""
    deadline = time.monotonic() + timeout_s
    failure = None
    try:
        pending = dict(enumerate(procs))
        while pending and failure is None:
            for r, (p, _) in list(pending.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del pending[r]
                if rc != 0:
                    failure = "%s: rank %d exited with %d" % (what, r, rc)
            if pending and time.monotonic() > deadline:
                failure = "%s: ranks %s still running after %.0f s" % (
                    what, sorted(pending), timeout_s)
            time.sleep(0.05)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    if failure:
        tails = []
        for r in range(len(procs)):
            with open(os.path.join(log_dir, "rank%d.log" % r), "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()[-25:]
            tails.append("---- rank %d ----\n%s" % (r, "\n".join(lines)))
        raise RuntimeError(failure + "\n" + "\n".join(tails))


def train_run(spec, a):
    """Trains one run with a.workers rank processes; returns rank 0's result and the total
    wall time (process start to exit)."""
    from bitpush.testing import LocalCluster, free_ports

    with tempfile.TemporaryDirectory(prefix="bp-tta-") as tmp:
        spec = dict(spec, result=os.path.join(tmp, "result.json"))
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        base = dict(os.environ, OMP_NUM_THREADS="1")
        what = "%s %s" % (spec["task"], spec["run"])
        t0 = time.monotonic()
        if spec["run"] in DDP_VARIANTS:
            port = free_ports(1)[0]
            envs = [dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                         WORLD_SIZE=str(a.workers), LOCAL_RANK=str(r), GLOO_SOCKET_IFNAME="lo")
                    for r in range(a.workers)]
            wait_ranks(start_ranks(spec_path, envs, tmp), a.run_timeout_s, tmp, what)
        else:
            ex, _, _ = import_examples()
            cargs = example_args(spec)
            with LocalCluster(workers=a.workers, servers=a.servers,
                              compression=spec["compression"],
                              error_feedback=ex.cluster_error_feedback(cargs),
                              min_compress_bytes=MIN_COMPRESS_BYTES) as cluster:
                spec["error_feedback"] = ex.cluster_error_feedback(cargs)
                envs = [dict(base, **{k: str(v) for k, v in cluster.env(r).items()})
                        for r in range(a.workers)]
                wait_ranks(start_ranks(spec_path, envs, tmp), a.run_timeout_s, tmp, what)
        total_s = time.monotonic() - t0
        with open(spec["result"]) as f:
            result = json.load(f)
    result["process_wall_s"] = total_s
    return result, spec


def machine():
    model, isa = platform.processor(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not isa:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    isa = [x for x in ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                       "amx_tile") if x in flags]
                    break
    except OSError:
        pass
    return {"cpu": model, "isa": isa, "cpus": os.cpu_count(), "python": platform.python_version()}


# -- main -------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="digits-cnn,charlm",
                   help="comma-separated: %s" % ", ".join(TASKS))
    p.add_argument("--runs", default=",".join(RUN_ORDER),
                   help="comma-separated subset of: %s (ddp-fp32 sets the target)"
                   % ", ".join(RUN_ORDER))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2, help="bitpush runs' local cluster")
    p.add_argument("--steps", default=None, metavar="N|TASK=N,...",
                   help="steps of every run, for every task or per task (default: "
                   "digits-cnn %d, charlm %d)" % (TASKS["digits-cnn"].steps,
                                                  TASKS["charlm"].steps))
    p.add_argument("--eval-every", default=None, metavar="N|TASK=N,...",
                   help="steps between evaluations, for every task or per task (default: "
                   "digits-cnn %d, charlm %d)" % (TASKS["digits-cnn"].eval_every,
                                                  TASKS["charlm"].eval_every))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="every seed in turn (each into --out/seed-S, against its own "
                   "ddp-fp32 target), then the summary over them (--out/summary.json)")
    p.add_argument("--summarise", default=None, metavar="RESULTS_JSON[,...]",
                   help="no training: the summary over finished single-seed results.json "
                   "files (one per seed; with --step-times, the projection)")
    p.add_argument("--ddp-optimizer", choices=["adamw", "sgd"], default=None,
                   help="DDP's optimizer (default: per task, AdamW)")
    p.add_argument("--ddp-lr", type=float, default=None,
                   help="DDP's lr (default: digits-cnn %g, charlm %g)"
                   % (TASKS["digits-cnn"].ddp_lr, TASKS["charlm"].ddp_lr))
    p.add_argument("--lr", default=None, metavar="RUN=LR,...",
                   help="a run's learning rate instead of its recipe's (e.g. "
                   "bitpush-lans=0.02); DDP's runs take --ddp-lr")
    p.add_argument("--tolerance", type=float, default=None,
                   help="the target's slack under DDP fp32's best (default: digits-cnn %g "
                   "points, charlm %g nats/byte)" % (TASKS["digits-cnn"].tolerance,
                                                     TASKS["charlm"].tolerance))
    p.add_argument("--step-times", default=None, metavar="FILE",
                   help="JSON {run: step_ms} or {task: {run: step_ms}}: adds the projection")
    p.add_argument("--out", default="bench-out/time-to-accuracy")
    p.add_argument("--run-timeout-s", type=float, default=1800.0,
                   help="bound on one run's ranks")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--from-results", default=None, metavar="RESULTS_JSON[,...]",
                   help="no training: recompute the targets, projections (--step-times), "
                   "plots and tables of these results.json files (merged) into --out")
    a = p.parse_args(argv)
    a.tasks = [t for t in a.tasks.split(",") if t]
    a.runs = [r for r in a.runs.split(",") if r]
    bad = [t for t in a.tasks if t not in TASKS] + [r for r in a.runs if r not in RUN_ORDER]
    if bad:
        p.error("unknown task or run %s (tasks: %s; runs: %s)" % (
            ", ".join(bad), ", ".join(TASKS), ", ".join(RUN_ORDER)))
    if not a.tasks or not a.runs:
        p.error("--tasks and --runs need at least one name each")
    if a.workers < 1 or a.servers < 1:
        p.error("--workers and --servers must be >= 1")
    try:
        a.steps = per_task(a.steps, "steps", {t: TASKS[t].steps for t in a.tasks})
        a.eval_every = per_task(a.eval_every, "eval-every",
                                {t: TASKS[t].eval_every for t in a.tasks})
        a.lr = run_lrs(a.lr)
    except ValueError as e:
        p.error(str(e))
    if a.seeds is not None:
        try:
            a.seeds = [int(x) for x in a.seeds.split(",") if x]
        except ValueError:
            p.error("--seeds: %r is not a list of whole numbers" % a.seeds)
        if not a.seeds or len(set(a.seeds)) != len(a.seeds):
            p.error("--seeds: %r must name distinct seeds" % ",".join(map(str, a.seeds)))
    if a.tolerance is not None and a.tolerance < 0:
        p.error("--tolerance must be >= 0")
    a.runs = [r for r in RUN_ORDER if r in a.runs]
    return a


def per_task(text, flag, defaults):
    """{task: int} from "N" (every task) or "TASK=N,..." over `defaults`; values >= 1."""
    out = dict(defaults)
    if text is not None:
        for part in text.split(","):
            task, _, value = part.rpartition("=")
            if task and task not in out:
                raise ValueError("--%s: %r is not one of the tasks run (%s)"
                                 % (flag, task, ", ".join(out)))
            try:
                n = int(value)
            except ValueError:
                raise ValueError("--%s: %r is not a whole number" % (flag, value)) from None
            if n < 1:
                raise ValueError("--%s: %r must be >= 1" % (flag, part))
            for t in ([task] if task else out):
                out[t] = n
    return out


def run_lrs(text):
    """{run: lr} from "RUN=LR,..." (bitpush runs; DDP's take --ddp-lr)."""
    out = {}
    for part in (text or "").split(","):
        if not part:
            continue
        run, _, value = part.partition("=")
        if run not in BITPUSH_RUNS:
            raise ValueError("--lr: %r is not a bitpush run (%s; DDP's runs take --ddp-lr)"
                             % (run, ", ".join(BITPUSH_RUNS)))
        try:
            out[run] = float(value)
        except ValueError:
            raise ValueError("--lr: %r is not a number" % value) from None
        if not out[run] > 0:
            raise ValueError("--lr: %r must be > 0" % part)
    return out


def check_dependencies():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return "%s cannot import torch.distributed (%s)" % (sys.executable, e)
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch %s at %s has no torch.distributed with gloo" % (torch.__version__,
                                                                       sys.executable)
    try:
        import sklearn  # noqa: F401
    except ImportError as e:
        return "%s cannot import scikit-learn (%s): digits-cnn needs it" % (sys.executable, e)
    return None


def main(argv):
    if len(argv) == 2 and argv[0] == "--rank-spec":
        with open(argv[1]) as f:
            return run_rank(json.load(f))
    a = parse_args(argv)
    step_times = None
    if a.step_times:
        try:
            step_times = load_step_times(a.step_times, list(TASKS))
        except (OSError, ValueError) as e:
            print("time_to_accuracy: --step-times: %s" % e, file=sys.stderr)
            return EXIT_USAGE
    if a.from_results:
        try:
            return reanalyse(a, step_times)
        except (OSError, ValueError, KeyError) as e:
            print("time_to_accuracy: --from-results %s: %s" % (a.from_results, e),
                  file=sys.stderr)
            return EXIT_USAGE
    if a.summarise:
        try:
            return summarise_files(a, step_times)
        except (OSError, ValueError, KeyError) as e:
            print("time_to_accuracy: --summarise %s: %s" % (a.summarise, e), file=sys.stderr)
            return EXIT_USAGE
    missing = check_dependencies()
    if missing:
        print("time_to_accuracy: " + missing, file=sys.stderr)
        return EXIT_MISSING
    if a.seeds is None:
        return train_tasks(a, argv, step_times)[1]
    out, status, docs = a.out, 0, []
    for seed in a.seeds:
        a.seed, a.out = seed, os.path.join(out, "seed-%d" % seed)
        results, seed_status = train_tasks(a, argv, step_times)
        status = status or seed_status
        docs.append(results)
    a.out = out
    write_summary(a, docs)
    return status


def train_tasks(a, argv, step_times):
    """Every task's runs at seed a.seed into a.out; returns (results, exit status)."""
    import torch

    os.makedirs(a.out, exist_ok=True)
    results = {"setup": {
        "command": " ".join(shlex.quote(x) for x in [sys.executable, sys.argv[0]] + argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "workers": a.workers, "servers": a.servers, "seed": a.seed,
        "torch": torch.__version__, "ddp_backend": "gloo", "machine": machine(),
        "min_compress_bytes": MIN_COMPRESS_BYTES, "lr_schedule": "cosine, 5 % linear warm-up",
        "powersgd": {"matrix_approximation_rank": POWERSGD_RANK,
                     "start_powerSGD_iter": "%g of the steps (at least 2)"
                     % POWERSGD_START_FRACTION},
        "step_times_file": a.step_times}, "tasks": {}}
    status = 0
    for task_name in a.tasks:
        task = TASKS[task_name]
        if a.tolerance is not None:
            task.tolerance = a.tolerance
        steps = a.steps[task_name]
        records = {}
        block = {"steps": steps, "eval_every": a.eval_every[task_name],
                 "workers": a.workers, "runs": records}
        results["tasks"][task_name] = block
        for run in a.runs:
            spec = run_spec(task, run, a, steps)
            print("time_to_accuracy: %s %s (%d steps, %d workers)..." % (
                task_name, run, steps, a.workers), file=sys.stderr, flush=True)
            try:
                result, spec = train_run(spec, a)
            except RuntimeError as e:
                print("time_to_accuracy: %s" % e, file=sys.stderr, flush=True)
                status = EXIT_FAILED
                continue
            rec = {k: spec[k] for k in ("run", "optimizer", "lr", "compression", "steps")}
            for k in ("powersgd_start_iter", "powersgd_rank", "error_feedback"):
                if k in spec:
                    rec[k] = spec[k]
            rec.update(result)
            records[run] = rec
            print("time_to_accuracy: %s %s: final %s %.4f, %.1f s of training" % (
                task_name, run, task.metric, rec["curve"][-1][2], rec["train_s"]),
                file=sys.stderr, flush=True)
            # The records so far (no analysis yet): a run stopped midway keeps its finished
            # runs, for --from-results.
            write_json(os.path.join(a.out, "results.json"), results)
        finish_task(task, block, step_times and step_times[task_name], a)
        write_json(os.path.join(a.out, "results.json"), results)
    return results, status


def write_summary(a, docs):
    """--out/summary.json and a table per task: the runs over the seeds of `docs` (analysed
    single-seed results), each task's runs as summarise_seeds gives them."""
    tasks = {}
    for doc in docs:
        seed = doc["setup"]["seed"]
        for task_name, block in doc["tasks"].items():
            if "target" not in block:
                continue  # stopped before its analysis
            by_seed = tasks.setdefault(task_name, {})
            if seed in by_seed:
                raise ValueError("seed %d of task %s is in more than one file" % (seed, task_name))
            by_seed[seed] = block
    summary = {"setup": {"seeds_from": [d["setup"].get("command") for d in docs],
                         "step_times_file": a.step_times}, "tasks": {}}
    os.makedirs(a.out, exist_ok=True)
    for task_name, by_seed in tasks.items():
        summary["tasks"][task_name] = summarise_seeds(by_seed)
        print(summary_table(task_name, summary["tasks"][task_name]), flush=True)
    write_json(os.path.join(a.out, "summary.json"), summary)


def summarise_files(a, step_times):
    """--summarise: finished single-seed results.json files analysed again (--step-times,
    --tolerance as --from-results does) and summarised over their seeds."""
    docs = []
    for path in [p for p in a.summarise.split(",") if p]:
        with open(path) as f:
            doc = json.load(f)
        for task_name, block in doc["tasks"].items():
            task = TASKS[task_name]
            if a.tolerance is not None:
                task.tolerance = a.tolerance
            elif "target" in block:
                task.tolerance = block["target"]["tolerance"]
            reanalyse_block(task, block, step_times and step_times.get(task_name))
        docs.append(doc)
    write_summary(a, docs)
    return 0


def finish_task(task, block, step_ms, a):
    """The target, every run's figures, the plots and the table of one task's block."""
    reanalyse_block(task, block, step_ms)
    if step_ms is not None:
        block["step_ms"] = step_ms
    block.pop("plots", None)
    if not a.no_plots and block["runs"]:
        block["plots"] = plot(task.name, block, a.out, step_ms)
    print(table(task.name, block), flush=True)


def reanalyse_block(task, block, step_ms):
    """The target and every run's figures of `block` (again: the last projection dropped
    first), with the step times `step_ms` ({run: ms}) or none."""
    for rec in block["runs"].values():
        for k in [k for k in rec if k.startswith("projected") or k == "step_ms"]:
            del rec[k]
    block.pop("step_ms", None)
    block["target"] = analyse(task, block["runs"], step_ms)


def reanalyse(a, step_times):
    """--from-results: the targets, projections, plots and tables of finished runs'
    results.json files again (e.g. with new --step-times), no training; written to --out as
    one results.json. Several files (comma-separated) are merged: the first one's setup, every
    file's tasks (a task in two files is refused), each file's setup under "merged_setups"."""
    paths = [p for p in a.from_results.split(",") if p]
    results = None
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        if results is None:
            results = doc
            results["setup"]["merged_setups"] = []
        else:
            for task_name, block in doc["tasks"].items():
                if task_name in results["tasks"]:
                    raise ValueError("task %s is in more than one of the files" % task_name)
                results["tasks"][task_name] = block
        setup = {k: v for k, v in doc["setup"].items() if k != "merged_setups"}
        results["setup"]["merged_setups"].append(dict(setup, file=path))
    results["setup"]["step_times_file"] = a.step_times
    results["setup"]["reanalysed_from"] = paths
    os.makedirs(a.out, exist_ok=True)
    for task_name, block in results["tasks"].items():
        task = TASKS[task_name]
        if a.tolerance is not None:
            task.tolerance = a.tolerance
        elif "target" in block:  # absent where the run was stopped before its analysis
            task.tolerance = block["target"]["tolerance"]
        finish_task(task, block, step_times and step_times.get(task_name), a)
    write_json(os.path.join(a.out, "results.json"), results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
