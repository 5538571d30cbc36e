#!/usr/bin/env python3
"""Data-parallel training of a small causal transformer language model over bytes, on the
Python standard library's sources shipped with the machine (/usr/lib/python3.11/*.py, or
--text-dir), over bitpush. The text is split into training (first 90%) and validation (last
10%); each worker trains on its contiguous shard of the training text; the validation loss
(nats per byte) is reported.

    PYTHONPATH=build/python /usr/bin/python3 examples/train_charlm.py \
        --optimizer clan --compression topk:ratio=0.01 --steps 300 --json charlm.json

Without BITPUSH_CONFIG it starts its own loopback cluster and --workers processes of itself
(examples/bitpush_example.py); rank 0 prints the summary. docs/training.md has the details.
"""

import argparse
import glob
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bitpush_example as ex  # noqa: E402

DEFAULT_LR = {"clan": 0.01, "lans": 0.01, "adam": 0.002, "adamw": 0.002, "sgd": 0.1,
              "binsgdm": 0.002}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ex.add_common_args(p, DEFAULT_LR)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the worker's shard (overrides --steps when given)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per worker")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--text-dir", default="/usr/lib/python%d.%d" % sys.version_info[:2])
    p.add_argument("--text-bytes", type=int, default=1 << 20,
                   help="use the first N bytes of the sorted sources")
    p.add_argument("--val-batches", type=int, default=16)
    return ex.resolve(p.parse_args(argv))


def load_text(args):
    files = sorted(glob.glob(os.path.join(args.text_dir, "*.py")))
    if not files:
        raise SystemExit("no *.py files under %s (--text-dir)" % args.text_dir)
    chunks, n = [], 0
    for f in files:
        with open(f, "rb") as fh:
            b = fh.read()
        chunks.append(b)
        n += len(b)
        if n >= args.text_bytes:
            break
    data = torch.frombuffer(bytearray(b"".join(chunks)[:args.text_bytes]), dtype=torch.uint8)
    split = int(len(data) * 0.9)
    return data[:split].long(), data[split:].long()


class CharLM(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tok = torch.nn.Embedding(256, args.dim)
        self.pos = torch.nn.Embedding(args.context, args.dim)
        layer = torch.nn.TransformerEncoderLayer(args.dim, args.heads, 4 * args.dim,
                                                 dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, args.layers,
                                                  enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(args.dim)
        self.head = torch.nn.Linear(args.dim, 256)
        mask = torch.triu(torch.full((args.context, args.context), float("-inf")), 1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t))
        h = self.blocks(h, mask=self.mask[:t, :t])
        return self.head(self.norm(h))


def batch(data, starts, context):
    x = torch.stack([data[s:s + context] for s in starts])
    y = torch.stack([data[s + 1:s + 1 + context] for s in starts])
    return x, y


def validation_losses(model, val, args, which=None):
    """The cross-entropy (nats per byte) of each of the --val-batches fixed windows of the
    validation text (the same windows on every worker and in every run), for the windows
    numbered in `which` (default: all), as {number: loss}."""
    vgen = torch.Generator().manual_seed(12345)
    starts = [torch.randint(0, len(val) - args.context - 1, (args.batch_size,), generator=vgen)
              for _ in range(args.val_batches)]
    which = range(args.val_batches) if which is None else which
    loss_fn = torch.nn.CrossEntropyLoss()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = {}
        for i in which:
            x, y = batch(val, starts[i], args.context)
            losses[i] = loss_fn(model(x).reshape(-1, 256), y.reshape(-1)).item()
    model.train(was_training)
    return losses


def validation_loss(model, val, args):
    """The mean of validation_losses over every window."""
    losses = validation_losses(model, val, args)
    return sum(losses[i] for i in range(args.val_batches)) / args.val_batches


def run(args, prefix=""):
    """One training run on an initialised bitpush worker; returns the summary."""
    import bitpush.torch as bp

    rank, size = bp.rank(), bp.size()
    train, val = load_text(args)
    per = len(train) // size
    shard = train[rank * per:(rank + 1) * per]
    torch.manual_seed(args.seed)
    model = CharLM(args)
    bp.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = ex.build_optimizer(args, model, prefix)
    total = args.steps
    if args.epochs is not None:
        total = args.epochs * max(1, len(shard) // (args.batch_size * args.context))
    # The batch starts of each step (replayed up to the step a resumed run starts at).
    draws = ex.StepDraws(args.seed * 1000 + rank,
                         lambda g: torch.randint(0, len(shard) - args.context - 1,
                                                 (args.batch_size,), generator=g))
    loss_fn = torch.nn.CrossEntropyLoss()
    sched = ex.lr_scheduler(args, opt, total)
    pushed0, t0 = ex.bytes_pushed(), time.time()
    bar = ex.progress(args, rank, total, "charlm %s" % args.optimizer)
    loss_avg = None

    def one_step(step):
        nonlocal loss_avg
        x, y = batch(shard, draws.at(step), args.context)
        opt.zero_grad()
        loss = loss_fn(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        loss_avg = loss.item() if loss_avg is None else 0.95 * loss_avg + 0.05 * loss.item()
        bar.update(1)
        bar.set_postfix(loss="%.3f" % loss_avg,
                        wire="%.2fMB" % ((ex.bytes_pushed() - pushed0) / 1e6), refresh=False)

    first = ex.train_steps(args, model, opt, sched, total, one_step)
    bar.close()
    wall = time.time() - t0
    val_loss = validation_loss(model, val, args)
    if hasattr(opt, "remove_hooks"):
        opt.remove_hooks()
    return {"example": "charlm", "optimizer": args.optimizer,
            "compression": ex.effective_compression(args),
            "error_feedback": ex.error_feedback_on(args), "seed": args.seed,
            "workers": size, "steps": total, "first_step": first, "final_train_loss": loss_avg,
            "params_sha256": ex.params_sha256(model),
            "val_loss": val_loss, "val_bits_per_byte": val_loss / math.log(2),
            "wall_time_s": wall, "bytes_pushed": ex.bytes_pushed() - pushed0,
            "bytes_fp32": ex.grad_bytes(model) * total, **ex.quantizer_summary()}


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
