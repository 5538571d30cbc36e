"""The error-feedback state of declared tensors, for checkpoints: the worker residual
(``error_feedback_state`` / ``restore_error_feedback_state``; in daemon mode the node's, kept by
its bitpush-worker) and the servers' (``server_error_feedback_state`` /
``restore_server_error_feedback_state``), as 1-D float32 CPU tensors.

Stateless; any thread (the tensor must be declared).
"""
import torch

from .declarations import _declared
from .errors import BitpushError
from .session import _require


def _read_residual(name, call):
    """A residual read by the client's `call` as a 1-D float32 CPU tensor, or None."""
    s = _require()
    raw = getattr(s.client, call)(_declared(s, name, call).index)
    if not raw:
        return None
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()


def _write_residual(name, residual, call):
    """Hands `residual` (a tensor, or None for a tensor that keeps none) to the client's
    `call`."""
    s = _require()
    d = _declared(s, name, call)
    data = b"" if residual is None else \
        residual.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    getattr(s.client, call)(d.index, data)


def error_feedback_state(name):
    """The worker error-feedback residual of tensor `name` (paper 001 Algorithm 4's e_i) as a
    1-D float32 CPU tensor, or None when it keeps none (uncompressed, or the cluster keeps no
    worker residual). In daemon mode the residual is the node's, kept by its bitpush-worker:
    every process of the node reads the same values."""
    return _read_residual(name, "error_feedback_state")


def restore_error_feedback_state(name, residual):
    """Puts a residual saved by error_feedback_state back (declare the tensor first). In
    daemon mode every process of the node restores the same checkpoint and the daemon applies
    local rank 0's (the others' are checked, not applied)."""
    _write_residual(name, residual, "restore_error_feedback_state")


def set_error_feedback_decay(name, decay):
    """Has the engine multiply tensor `name`'s worker residual by `decay` (in [0, 1]) inside
    every compression from its next push_pull on (fused into onebit's sign pass; a scaling pass
    before the other methods'): the values of scaling the residual read by
    error_feedback_state and restoring it before each push, without the copies. Returns False
    where the engine cannot (daemon mode, or a method with its own kind of error state: the
    caller scales through error_feedback_state / restore_error_feedback_state instead); raises
    BitpushError for a tensor that keeps no worker residual or a decay outside [0, 1]."""
    s = _require()
    d = _declared(s, name, "set_error_feedback_decay")
    try:
        s.client.set_error_feedback_decay(d.index, float(decay))
    except BitpushError as e:
        if e.code == "Unimplemented":
            return False
        raise
    return True


def server_error_feedback_state(name):
    """The servers' error-feedback residual of tensor `name` (paper 001 Algorithm 4's ẽ, kept
    with compression.error_feedback server or both) as a 1-D float32 CPU tensor, read from the
    servers that own its keys, or None when it keeps none. One process reads it for the
    cluster (save_checkpoint: rank 0). In daemon mode the node's bitpush-worker relays it
    (local protocol 1.5; an older one answers BitpushError, Unimplemented)."""
    return _read_residual(name, "server_error_feedback_state")


def restore_server_error_feedback_state(name, residual):
    """Writes a residual saved by server_error_feedback_state back to the servers, before the
    tensor's first push_pull of the run (declare it first). One process restores it for the
    cluster (load_checkpoint: rank 0)."""
    _write_residual(name, residual, "restore_server_error_feedback_state")
