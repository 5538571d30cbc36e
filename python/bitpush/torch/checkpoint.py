"""Job checkpoints: ``save_checkpoint`` / ``load_checkpoint`` (docs/training.md, "Checkpoints").

    bp.save_checkpoint("ckpt/step1000.pt", model, optimizer)   # every process calls it
    ...
    bp.load_checkpoint("ckpt/step1000.pt", model, optimizer)   # every process of the new job

(bitpush.torch.Checkpointer, checkpointer.py, keeps periodic ones in a directory.)

A checkpoint is one file written by rank 0 (`path`: the model and optimizer state, which every
process holds identically, and the job's metadata) plus one file per worker node written by
that node's local rank 0 (`path.node<k>`: the node's worker error-feedback residuals, which
differ between nodes). Both calls are collective: every training process calls them, and they
return once every process's part is written (read). Loading checks the job first and refuses,
naming the field, a checkpoint of another world (processes, nodes), another error-feedback
mode, other compressors for the optimizer's tensors, or other model shapes.

What resumes bit for bit: the model, the optimizer (moments, steps, hyper-parameters), the
worker residuals and — compression.error_feedback server or both — the servers' residuals,
which rank 0 reads from the servers into `path` (worker::Client::ServerErrorFeedbackState) and
writes back on load before the first step, and the rounds of every tensor:
each process moves its tensors and their servers to the saved round
(worker::Client::RestoreTensorRounds), so compressors that draw random numbers per round
(randomk, dithering, sdp4bit's TLq-HS) continue the saved run's streams. A ServerOptimizer's
tensors carry their rounds in their state (the servers' master weights, moments, step and the
workers' copy, in `path`; docs/training.md). In daemon mode the node's bitpush-worker relays
the servers' residuals and the rounds (local protocol 1.5); with an older one save_checkpoint
warns that a resumed run starts them from zero.

Thread-safety: call from the training thread, with no push_pull in flight.
"""

import os
import warnings

import torch

from .cluster_knobs import cluster_error_feedback
from .collectives import barrier
from .error_feedback import (error_feedback_state, restore_server_error_feedback_state,
                             server_error_feedback_state)
from .errors import BitpushError, _error
from .session import _require, local_rank, local_size, mode, node_rank, num_nodes, rank, size

__all__ = ["save_checkpoint", "load_checkpoint"]

FORMAT = 1
_MAGIC = "bitpush-checkpoint"


def _node_path(path, node):
    return "%s.node%d" % (path, node)


def _tensor_names(optimizer):
    if not hasattr(optimizer, "_bp_params"):
        raise TypeError("bitpush checkpoints take a bitpush optimizer (CLAN, LANS, "
                        "DistributedOptimizer or ServerOptimizer), got %s"
                        % type(optimizer).__name__)
    return [optimizer._bp_name(p) for p in optimizer._bp_params]


def _declare_all(optimizer):
    """Declares the optimizer's tensors in parameter order, as its first exchange would (a
    no-op for the ones already declared)."""
    optimizer._bp_declare_all()


def _job(optimizer, model):
    """What a checkpoint must agree with: world, error feedback, compressors, shapes."""
    s = _require()
    _declare_all(optimizer)
    s.client.commit_declarations()  # collective: the servers know every key afterwards
    names = _tensor_names(optimizer)
    with s.lock:
        indices = [s.declarations[n].index for n in names]
    travels = s.client.compression_of(indices)
    return {
        "world": {"processes": size(), "nodes": num_nodes(),
                  "local_size": local_size()},
        "error_feedback": cluster_error_feedback(),
        "tensors": [[n, spec] for n, (spec, _) in zip(names, travels)],
        "model": [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()],
    }


def _rounds(optimizer):
    """{name: push_pulls completed} of the optimizer's tensors whose rounds the workers number
    (not a ServerOptimizer's: its rounds travel with its state). In daemon mode the node's
    bitpush-worker numbers them and answers (local protocol 1.5); an older one cannot: {} then,
    with a warning (a resumed run starts the random streams at round 0)."""
    s = _require()
    out = {}
    for p in optimizer._bp_params:
        name = optimizer._bp_name(p)
        with s.lock:
            d = s.declarations[name]
        if d.server_optimizer is None:
            try:
                out[name] = int(s.client.tensor_rounds(d.index))
            except BitpushError as e:
                if mode() != "daemon" or getattr(e, "code", None) != "Unimplemented":
                    raise
                warnings.warn("bitpush.save_checkpoint: %s; the checkpoint holds no rounds, so "
                              "a resumed run starts the per-round random streams at round 0"
                              % e, stacklevel=3)
                return {}
    return out


def _restore_rounds(saved):
    """Moves each tensor to its saved round, here and at its servers (every process; the
    load's closing barrier keeps every push after every restore). In daemon mode the node's
    bitpush-worker applies its local rank 0's for the node."""
    s = _require()
    for name, rounds in saved.items():
        if rounds == 0:
            continue
        with s.lock:
            d = s.declarations[name]
        s.client.restore_tensor_rounds(d.index, int(rounds))


def _barrier(what):
    try:
        barrier()
    except BitpushError as e:  # the same code: Checkpointer.recover tells Unavailable by it
        raise _error(getattr(e, "code", "Unknown"),
                     "%s: waiting for every process: %s" % (what, e)) from e


def save_checkpoint(path, model, optimizer, extra=None):
    """Writes the job's checkpoint (collective: every training process calls it with the same
    `path`, after the same step). `extra`: anything torch.save takes, the same on every process
    (rank 0's is written; load_checkpoint returns it). Returns `path`."""
    path = os.fspath(path)
    job = _job(optimizer, model)
    residuals = {}
    for p in optimizer._bp_params:
        name = optimizer._bp_name(p)
        r = error_feedback_state(name)
        if r is not None:
            residuals[name] = r
    if local_rank() == 0:
        _save(_node_path(path, node_rank()),
              {"magic": _MAGIC, "format": FORMAT, "node": node_rank(),
               "world": job["world"], "residuals": residuals})
    if rank() == 0:
        server_residuals = {}
        if job["error_feedback"] in ("server", "both"):
            try:
                for p in optimizer._bp_params:
                    name = optimizer._bp_name(p)
                    r = server_error_feedback_state(name)
                    if r is not None:
                        server_residuals[name] = r
            except BitpushError as e:
                # A bitpush-worker older than local protocol 1.5 does not relay them.
                if mode() != "daemon" or getattr(e, "code", None) != "Unimplemented":
                    raise
                server_residuals = {}
                warnings.warn("bitpush.save_checkpoint: compression.error_feedback is %s, and "
                              "%s: the servers' residuals are not part of the checkpoint, so a "
                              "run resumed from %s starts them from zero (it is not "
                              "bit-identical to an uninterrupted run; the worker state is)"
                              % (job["error_feedback"], e, path), stacklevel=2)
        sd = optimizer.state_dict()
        sd.pop("bitpush", None)  # the residuals live in the node files
        _save(path, {"magic": _MAGIC, "format": FORMAT, "job": job,
                     "model": model.state_dict(), "optimizer": sd,
                     "server_residuals": server_residuals, "rounds": _rounds(optimizer),
                     "extra": extra})
    _barrier("bitpush.save_checkpoint(%r)" % path)
    return path


def _save(path, obj):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a reader never sees half a file


def _load(path, what):
    try:
        obj = torch.load(path, map_location="cpu")
    except FileNotFoundError:
        raise FileNotFoundError("bitpush.load_checkpoint: %s %s does not exist" % (what, path)) \
            from None
    if not isinstance(obj, dict) or obj.get("magic") != _MAGIC:
        raise ValueError("bitpush.load_checkpoint: %s is not a bitpush checkpoint (written by "
                         "bitpush.torch.save_checkpoint)" % path)
    if obj.get("format") != FORMAT:
        raise ValueError("bitpush.load_checkpoint: %s has format %r; this bitpush reads %d"
                         % (path, obj.get("format"), FORMAT))
    return obj


def _refuse(path, field, theirs, ours):
    raise ValueError("bitpush.load_checkpoint: %s does not fit this job: %s is %s in the "
                     "checkpoint but %s here" % (path, field, theirs, ours))


def _check_job(path, saved, job):
    for k in ("processes", "nodes", "local_size"):
        if saved["world"][k] != job["world"][k]:
            _refuse(path, "world.%s" % k, saved["world"][k], job["world"][k])
    if saved["error_feedback"] != job["error_feedback"]:
        _refuse(path, "compression.error_feedback", repr(saved["error_feedback"]),
                repr(job["error_feedback"]))
    theirs = dict((n, s) for n, s in saved["tensors"])
    ours = dict((n, s) for n, s in job["tensors"])
    if list(theirs) != list(ours):
        missing = [n for n in ours if n not in theirs] or [n for n in theirs if n not in ours]
        _refuse(path, "the optimizer's tensors", "%d tensors" % len(theirs),
                "%d (first difference: '%s')" % (len(ours), missing[0] if missing else "order"))
    for n in ours:
        if theirs[n] != ours[n]:
            _refuse(path, "the compressor of tensor '%s'" % n, repr(theirs[n]), repr(ours[n]))
    shapes = dict((k, (tuple(s), d)) for k, s, d in saved["model"])
    for k, s, d in job["model"]:
        if k not in shapes:
            _refuse(path, "model entry '%s'" % k, "absent", "present")
        if shapes[k] != (tuple(s), d):
            _refuse(path, "the shape of model entry '%s'" % k, "%s %s" % shapes[k],
                    "%s %s" % (tuple(s), d))
    if len(shapes) != len(job["model"]):
        extra = sorted(set(shapes) - set(k for k, _, _ in job["model"]))
        _refuse(path, "model entry '%s'" % extra[0], "present", "absent")


def load_checkpoint(path, model, optimizer):
    """Restores a checkpoint written by save_checkpoint (collective: every training process of
    the new job calls it, before its first step). Refuses, naming the field, a checkpoint of
    another job (ValueError). Returns save_checkpoint's `extra` (None when it had none)."""
    path = os.fspath(path)
    main = _load(path, "checkpoint")
    job = _job(optimizer, model)
    _check_job(path, main["job"], job)
    node = _load(_node_path(path, node_rank()), "the node's part of the checkpoint")
    if node.get("node") != node_rank():
        _refuse(_node_path(path, node_rank()), "node", node.get("node"), node_rank())
    model.load_state_dict(main["model"])
    optimizer.load_state_dict(main["optimizer"])
    optimizer._bp_restore_ef_state(node["residuals"])
    if rank() == 0:
        for name, r in main.get("server_residuals", {}).items():
            restore_server_error_feedback_state(name, r)
    _restore_rounds(main.get("rounds", {}))
    _barrier("bitpush.load_checkpoint(%r)" % path)
    return main.get("extra")
