#!/usr/bin/env python3
"""Data-parallel training of an MLP (or with --model cnn a small CNN) on scikit-learn's digits
(8x8 images, 10 classes) over bitpush: each worker trains on its shard of the training split, gradients are averaged
through the cluster (CLAN compresses them), and the test split's accuracy is reported.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_digits.py \
        --optimizer clan --compression onebit --epochs 10 --json digits.json

With --server-side the optimizer runs on the servers (bitpush.torch.ServerOptimizer); with
--compression sdp4bit the gradients go as TLq-HS and the weights come back as qWD. With
--optimizer binsgdm it trains with bitpush.torch.BinSGDM (one-bit pushes and pulls); with
--compression separate the gradients go as SEPARATE's Gaussian projections (e.g. with
--optimizer sgd).

Without BITPUSH_CONFIG it starts its own loopback cluster and --workers processes of itself
(examples/bitpush_example.py); rank 0 prints the summary. docs/training.md has the details.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bitpush_example as ex  # noqa: E402

DEFAULT_LR = {"clan": 0.01, "lans": 0.01, "adam": 0.003, "adamw": 0.003, "sgd": 0.05,
              "binsgdm": 0.003}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ex.add_common_args(p, DEFAULT_LR)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many steps in all (default: every epoch in full)")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                   help="mlp: three linear layers (--hidden wide); cnn: two 3x3 convolutions")
    return ex.resolve(p.parse_args(argv))


class MLP(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    """Two 3x3 convolutions (16, 32 channels), a 2x2 max-pool, a 64-unit hidden layer."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 10))

    def forward(self, x):
        return self.classifier(self.features(x.view(-1, 1, 8, 8)))


def load_data(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x / 16.0, y, test_size=0.25, random_state=seed,
                                              stratify=y)
    f = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    g = lambda a: torch.tensor(a, dtype=torch.int64)  # noqa: E731
    return f(x_tr), g(y_tr), f(x_te), g(y_te)


def run(args, prefix=""):
    """One training run on an initialised bitpush worker; returns the summary. `prefix` names
    this run's tensors (several runs in one cluster)."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    torch.manual_seed(args.seed)
    model = MLP(args.hidden) if args.model == "mlp" else CNN()
    bp.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = ex.build_optimizer(args, model, prefix)
    shard_x, shard_y = x_tr[rank::size], y_tr[rank::size]
    # The same number of steps on every worker (shards differ by at most one sample).
    steps_per_epoch = len(x_tr) // (size * args.batch_size)
    total = args.epochs * steps_per_epoch
    if args.steps is not None:
        total = min(total, args.steps)
    # One shuffle of the shard per epoch (replayed up to the step a resumed run starts at).
    perms = ex.StepDraws(args.seed * 1000 + rank,
                         lambda g: torch.randperm(len(shard_x), generator=g))
    loss_fn = torch.nn.CrossEntropyLoss()
    sched = ex.lr_scheduler(args, opt, total)
    pushed0, t0 = ex.bytes_pushed(), time.time()
    bar = ex.progress(args, rank, total, "digits %s" % args.optimizer)
    loss_avg = None

    def one_step(step):
        nonlocal loss_avg
        perm, s = perms.at(step // steps_per_epoch), step % steps_per_epoch
        idx = perm[s * args.batch_size:(s + 1) * args.batch_size]
        opt.zero_grad()
        loss = loss_fn(model(shard_x[idx]), shard_y[idx])
        loss.backward()
        opt.step()
        loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
        bar.update(1)
        bar.set_postfix(loss="%.3f" % loss_avg,
                        wire="%.2fMB" % ((ex.bytes_pushed() - pushed0) / 1e6), refresh=False)

    first = ex.train_steps(args, model, opt, sched, total, one_step)
    step = total
    bar.close()
    wall = time.time() - t0
    with torch.no_grad():
        acc = (model(x_te).argmax(1) == y_te).float().mean().item() * 100.0
    if hasattr(opt, "remove_hooks"):
        opt.remove_hooks()
    return {"example": "digits", "model": args.model, "optimizer": args.optimizer,
            "compression": ex.effective_compression(args),
            "error_feedback": ex.error_feedback_on(args), "seed": args.seed,
            # The YAML's optimizer.placement: server moves DistributedOptimizer there too.
            "server_side": isinstance(opt, bp.ServerOptimizer),
            "pull": (opt.pull or bp.cluster_optimizer_pull())
            if isinstance(opt, bp.ServerOptimizer) else None,
            "workers": size, "steps": step, "first_step": first,
            "final_train_loss": loss_avg, "params_sha256": ex.params_sha256(model),
            "test_accuracy": acc, "wall_time_s": wall,
            "bytes_pushed": ex.bytes_pushed() - pushed0,
            "bytes_fp32": ex.grad_bytes(model) * step, **ex.quantizer_summary()}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not os.environ.get("BITPUSH_CONFIG"):
        return ex.launch_local(args, argv, os.path.abspath(__file__))
    import bitpush.torch as bp

    torch.set_num_threads(1)
    bp.init()
    try:
        summary = run(args)
        ex.finish(args, bp.rank(), summary)
    except BaseException:
        bp.shutdown(abort=True)  # leave at once: the job failed (a launcher may restart it)
        raise
    bp.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
