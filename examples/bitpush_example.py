"""What train_digits.py and train_charlm.py share: the command line, the local launcher, the
optimizer factory, the step loop with its checkpoints, the progress bar and the JSON summary.

An example started without the launcher's environment (no BITPUSH_CONFIG) starts its own
cluster on loopback with bitpush.testing.LocalCluster (scheduler + --servers servers) and
--workers worker processes of itself; rank 0 prints the summary and writes --json. Started
with the environment (bitpush's launcher, or LocalCluster.env(rank)), it is one worker.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import torch


def add_common_args(parser, default_lr):
    parser.add_argument("--optimizer", choices=["clan", "lans", "adam", "adamw", "sgd", "binsgdm"],
                        default="clan",
                        help="binsgdm: bitpush.torch.BinSGDM (paper 004), one-bit pushes and "
                        "pulls whatever --compression says")
    parser.add_argument("--compression", default=None,
                        help="compressor spec of the gradients (docs/compressors.md); default: "
                        "the cluster YAML's compression.spec under bitpush launch; without it "
                        "(the example's own local cluster) onebit for clan, none otherwise")
    parser.add_argument("--no-error-feedback", action="store_true",
                        help="clan: paper 001 Algorithm 3 (for unbiased compressors such as "
                        "dithering) instead of Algorithm 4; loco: 4-bit without its "
                        "compensated error")
    parser.add_argument("--error-feedback-decay", type=float, default=None,
                        help="clan: multiply the worker error-feedback residuals by this after "
                        "every step (default: CLAN's: 0.2 for onebit, 1.0 for the other "
                        "compressors; 1.0 keeps the whole residual, paper 001 Algorithm 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default: %s)" % default_lr)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine",
                        help="cosine: linear warm-up over --warmup of the steps, then cosine "
                        "decay to 0 (the usual LANS/LAMB schedule); constant: --lr throughout")
    parser.add_argument("--warmup", type=float, default=0.05,
                        help="fraction of the steps used for the warm-up (cosine schedule)")
    parser.add_argument("--json", default=None, help="write the summary here (rank 0)")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes of the local cluster (without BITPUSH_CONFIG)")
    parser.add_argument("--servers", type=int, default=2,
                        help="servers of the local cluster (without BITPUSH_CONFIG)")
    parser.add_argument("--min-compress-bytes", type=int, default=4096,
                        help="the local cluster's compression.min_compress_bytes")
    parser.add_argument("--partition-bytes", type=int, default=None,
                        help="the local cluster's compression.partition_bytes (default 4096000; "
                        "one onebit scale per partition: 262144 for wide layers, "
                        "docs/training.md \"Wide layers\")")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    parser.add_argument("--checkpoint-dir", default=None, metavar="D",
                        help="keep checkpoints in D (bitpush.torch.Checkpointer) and resume "
                        "from the newest one there: under `bitpush launch --max-restarts N` the "
                        "job survives dead processes (docs/launch.md, 'Restarts')")
    parser.add_argument("--checkpoint-every", type=int, default=50, metavar="K",
                        help="with --checkpoint-dir: a checkpoint every K steps (default 50)")
    parser.add_argument("--server-side", action="store_true",
                        help="run the optimizer on the servers (optimizer.placement: server, "
                        "bitpush.torch.ServerOptimizer): workers push gradients and pull "
                        "weights; clan and lans run LANS there, adam AdamW, sgd SGD with "
                        "momentum 0.9")
    parser.add_argument("--pull", default=None,
                        help="--server-side: how the weights come back, a compressor spec "
                        "(default: SDP4Bit's qWD, %s, with --compression sdp4bit; the "
                        "cluster's optimizer.pull otherwise, none for the local cluster)"
                        % "sdp4bit:hadamard=off,group=2048")
    parser.set_defaults(default_lr=default_lr)


def resolve(args):
    if args.lr is None:
        args.lr = args.default_lr[args.optimizer]
    if args.optimizer == "binsgdm":
        # BinSGDM's tensors go as binsgdm whatever the cluster's spec; the local cluster runs
        # its error feedback (both: Algorithm 1).
        if args.server_side:
            raise SystemExit("--optimizer binsgdm runs on the workers (its servers only count "
                             "sign bits); drop --server-side")
        args.compression = "binsgdm"
    if args.compression is None and not os.environ.get("BITPUSH_CONFIG"):
        # The example builds its own cluster from these arguments; under a launcher the
        # cluster YAML decides (None).
        args.compression = "onebit" if args.optimizer == "clan" else "none"
    if args.server_side and args.pull is None and args.compression is not None and \
            args.compression.split(":")[0] == "sdp4bit":
        args.pull = "sdp4bit:hadamard=off,group=2048"  # TLq-HS pushes, qWD pulls
    return args


def effective_compression(args):
    """The spec the gradients go with: --compression, else the cluster's (call after
    bitpush.torch.init)."""
    import bitpush.torch as bp

    if args.optimizer == "lans":
        return "none"
    if args.optimizer == "binsgdm":
        return "binsgdm"
    return args.compression if args.compression is not None else bp.cluster_compression()


def error_feedback_on(args):
    """Whether the gradients keep error feedback (compressed, in a cluster that keeps it)."""
    import bitpush.torch as bp

    compressed = effective_compression(args).split(":")[0] not in ("", "none")
    return compressed and bp.cluster_error_feedback() != "none"


def lr_scheduler(args, opt, total_steps):
    """The learning-rate schedule of --lr-schedule over `total_steps` (call step() after each
    optimizer step)."""
    import math

    import torch

    if args.lr_schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    warm = max(1, int(args.warmup * total_steps))

    def factor(step):
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def cluster_error_feedback(args):
    """The compression.error_feedback of the example's own local cluster for these
    arguments."""
    method = args.compression.split(":")[0]
    compressed = method not in ("", "none")
    if compressed and args.no_error_feedback:
        return "none"
    if not compressed:
        return "none"
    from bitpush import _C
    if args.optimizer == "clan" and method not in ("loco", "sdp4bit", "separate", "binsgdm"):
        return "both"  # paper 001 Algorithm 4: worker and server residuals
    # Otherwise the method's own recommendation: LoCo's compensated error is the method
    # (worker, and server where it replies in 4 bits); SDP4Bit and dithering are unbiased and
    # run without error feedback; SEPARATE keeps its moving-average error on the workers;
    # BinSGDM keeps both sides' (Algorithm 1); the biased ones (onebit, top-k, random-k) keep
    # both sides' residuals, so DistributedOptimizer(AdamW) + onebit is not left biased.
    return _C.recommended_error_feedback(args.compression)


def launch_local(args, argv, script):
    """Starts a LocalCluster and --workers processes of `script` with `argv`; returns the
    exit status (0 when every worker succeeded)."""
    from bitpush.testing import LocalCluster

    extra = {"optimizer": {"placement": "server"}} if args.server_side else None
    with LocalCluster(workers=args.workers, servers=args.servers,
                      compression=args.compression,
                      error_feedback=cluster_error_feedback(args),
                      min_compress_bytes=args.min_compress_bytes,
                      partition_bytes=args.partition_bytes, extra=extra) as cluster:
        procs = []
        for rank in range(args.workers):
            env = dict(os.environ)
            env.update({k: str(v) for k, v in cluster.env(rank).items()})
            procs.append(subprocess.Popen([sys.executable, script] + list(argv), env=env))
        status = 0
        try:
            pending = list(procs)
            while pending:
                for p in list(pending):
                    rc = p.poll()
                    if rc is None:
                        continue
                    pending.remove(p)
                    if rc != 0 and status == 0:
                        status = rc
                        print("%s: worker pid %d exited with %d; stopping the others"
                              % (os.path.basename(script), p.pid, rc), file=sys.stderr)
                        for q in pending:
                            q.terminate()
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return status


def build_optimizer(args, model, prefix=""):
    """The optimizer --optimizer names; tensor names are `prefix` + the parameter names."""
    import bitpush.torch as bp

    named = [(prefix + n, p) for n, p in model.named_parameters()]
    params = [p for _, p in named]
    if args.server_side:
        rule = {"clan": "lans", "lans": "lans", "adam": "adamw", "adamw": "adamw",
                "sgd": "sgd"}[args.optimizer]
        extra = {"momentum": 0.9} if rule == "sgd" else {}
        return bp.ServerOptimizer(params, rule=rule, lr=args.lr, weight_decay=args.weight_decay,
                                  named_parameters=named,
                                  compression="none" if args.optimizer == "lans"
                                  else args.compression,
                                  pull=args.pull, **extra)
    if args.optimizer == "clan":
        extra = {}
        if args.error_feedback_decay is not None:
            extra["error_feedback_decay"] = args.error_feedback_decay
        return bp.CLAN(params, lr=args.lr, weight_decay=args.weight_decay,
                       compression=args.compression,
                       error_feedback=False if args.no_error_feedback else None,
                       named_parameters=named, **extra)
    if args.optimizer == "lans":
        return bp.LANS(params, lr=args.lr, weight_decay=args.weight_decay,
                       named_parameters=named)
    if args.optimizer == "binsgdm":
        return bp.BinSGDM(params, lr=args.lr, weight_decay=args.weight_decay, seed=args.seed,
                          named_parameters=named)
    if args.optimizer == "adam":
        inner = torch.optim.Adam(params, lr=args.lr, weight_decay=args.weight_decay)
    elif args.optimizer == "adamw":
        inner = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    else:
        inner = torch.optim.SGD(params, lr=args.lr, momentum=0.9,
                                weight_decay=args.weight_decay)
    return bp.DistributedOptimizer(inner, named_parameters=named, compression=args.compression)


class StepDraws:
    """Draw i of `draw(generator)` from a torch.Generator seeded `seed`, drawn in order: at(i)
    after a jump back (a run resumed from a checkpoint, or rolled back to one) replays the draws
    before it, so every step sees the batch of an uninterrupted run."""

    def __init__(self, seed, draw):
        self.seed, self.draw = seed, draw
        self._reset()

    def _reset(self):
        self.gen = torch.Generator().manual_seed(self.seed)
        self.drawn, self.last = 0, None

    def at(self, i):
        if i < self.drawn - 1:
            self._reset()
        while self.drawn <= i:
            self.last = self.draw(self.gen)
            self.drawn += 1
        return self.last


def train_steps(args, model, opt, sched, total, one_step):
    """Runs one_step(step) for the steps up to `total`, then sched.step() after each. With
    --checkpoint-dir a bitpush.torch.Checkpointer resumes from the newest checkpoint there (0 on
    a fresh job), writes one every --checkpoint-every steps, and goes back to the newest one
    when a server was restarted alone (BitpushError Unavailable). Returns the first step this
    run made."""
    import bitpush.torch as bp

    ckpt = None
    step = 0
    if args.checkpoint_dir:
        ckpt = bp.Checkpointer(args.checkpoint_dir, model, opt,
                               every_steps=args.checkpoint_every, state={"lr": sched})
        step = ckpt.resume()
    first = step
    while step < total:
        try:
            one_step(step)
            sched.step()
            step += 1
            if ckpt is not None:
                ckpt.step(step)
        except bp.BitpushError as e:
            if ckpt is None:
                raise
            step = ckpt.recover(e)
    return first


def params_sha256(model):
    """SHA-256 of the model's state, tensor by tensor in state_dict order (the bytes of each):
    equal digests are bit-identical parameters."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def grad_bytes(model):
    """Bytes one fp32 push of every gradient would take."""
    return sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)


class _LineStream:
    """tqdm redraws its bar in place with carriage returns; when stderr is not a terminal (under
    `bitpush launch`, which prefixes every line, or in a log file) each redraw becomes its own
    line instead."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self._stream.write(part.rstrip() + "\n")

    def flush(self):
        self._stream.flush()


def progress(args, rank, total, desc):
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, disable=args.no_progress or rank != 0,
                dynamic_ncols=tty, ncols=None if tty else 100,
                mininterval=0.1 if tty else 1.0,
                file=sys.stderr if tty else _LineStream(sys.stderr))


def quantizer_summary():
    """The saturation fractions and error norm of a quantiser that reports them (loco), or the
    ratio ||e|| / ||g|| of an error-feedback state that reports it (separate), for the run's
    summary; {} otherwise."""
    import bitpush.torch as bp

    s = bp.stats()
    if s.get("gradient_norm"):
        return {"error_norm": s["error_norm"], "gradient_norm": s["gradient_norm"],
                "error_ratio": s["error_norm"] / s["gradient_norm"]}
    if not s.get("quantized_values"):
        return {}
    out = {"saturation": s["quantized_saturated"] / s["quantized_values"],
           "error_norm": s["error_norm"]}
    if s.get("error_values"):
        out["error_saturation"] = s["error_saturated"] / s["error_values"]
    return out


def bytes_pushed():
    import bitpush.torch as bp

    return int(bp.stats().get("bytes_pushed", 0))


def finish(args, rank, summary):
    if rank != 0:
        return
    print(" ".join("%s=%s" % (k, _fmt(v)) for k, v in summary.items()), flush=True)
    pushed, fp32 = summary.get("bytes_pushed"), summary.get("bytes_fp32")
    if pushed is not None and fp32:
        print("summary: %s with %s on %d workers: test accuracy %.2f%%, %d steps in %.1f s; "
              "pushed %.2f MB vs %.2f MB as fp32 (ratio %.3f, %.1fx smaller)"
              % (summary.get("example"), summary.get("compression"), summary.get("workers", 0),
                 summary.get("test_accuracy", float("nan")), summary.get("steps", 0),
                 summary.get("wall_time_s", 0.0), pushed / 1e6, fp32 / 1e6, pushed / fp32,
                 fp32 / max(pushed, 1)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
            f.write("\n")


def _fmt(v):
    return "%.4f" % v if isinstance(v, float) else str(v)
