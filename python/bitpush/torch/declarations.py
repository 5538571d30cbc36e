"""Tensor declarations: the first push_pull of a name (or ``declare``) fixes the tensor's
elements, dtype, compression, average/sum, priority and server-side optimizer; later uses must
match. Every process declares the same names in the same order: the engine checks the
declarations across workers in that order. Also the checks of a tensor handed to push_pull.

The declarations live in the session (`_State.declarations`, under `_State.lock`); declaring
and checking them happen under `_State.declare_lock` (session.py).
"""
import torch

from .errors import BitpushError, _error
from .session import _require

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# The names of broadcast tensors (broadcast.py; compression_report leaves them out).
_BROADCAST_PREFIX = "bitpush.broadcast."


class _Declaration:
    __slots__ = ("index", "numel", "dtype", "compression", "average", "priority",
                 "server_optimizer")

    def __init__(self, index, numel, dtype, compression, average, priority,
                 server_optimizer=None):
        self.index = index
        self.numel = numel
        self.dtype = dtype
        self.compression = compression
        self.average = average
        self.priority = priority
        self.server_optimizer = server_optimizer

    def describe(self):
        return "%d x %s, compression '%s', %s, priority %d%s" % (
            self.numel, self.dtype, self.compression or "<cluster default>",
            "average" if self.average else "sum", self.priority,
            "" if self.server_optimizer is None
            else ", optimizer on the servers %r" % (self.server_optimizer,))


def _check_tensor(tensor, name, what="tensor"):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("bitpush: %s of '%s' is a %s, not a torch.Tensor"
                        % (what, name, type(tensor).__name__))
    if tensor.is_sparse:
        raise TypeError("bitpush: %s of '%s' is sparse; push_pull takes dense tensors"
                        % (what, name))
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError("bitpush: %s of '%s' is on %s; push_pull takes CPU or CUDA tensors"
                         % (what, name, tensor.device))
    if tensor.device.type == "cuda" and tensor.dtype != torch.float32:
        raise TypeError("bitpush: %s of '%s' is a CUDA %s tensor; the GPU path takes "
                        "torch.float32" % (what, name, tensor.dtype))
    if tensor.dtype not in _DTYPES:
        raise TypeError("bitpush: %s of '%s' has dtype %s; push_pull takes torch.float32, "
                        "torch.float16 or torch.bfloat16" % (what, name, tensor.dtype))
    if not tensor.is_contiguous():
        raise ValueError("bitpush: %s of '%s' is not contiguous (shape %s, strides %s); pass "
                         "tensor.contiguous() (push_pull_inplace needs a contiguous tensor)"
                         % (what, name, tuple(tensor.shape), tensor.stride()))


def _declare(s, name, numel, dtype, compression, average, priority, cuda=False,
             server_optimizer=None):
    want = _Declaration(None, numel, dtype, compression, average, priority, server_optimizer)
    with s.lock:
        have = s.declarations.get(name)
        if have is None:
            want.index = s.client.declare(name, numel, dtype, priority, compression,
                                          not average, cuda, server_optimizer)
            s.declarations[name] = want
            return want.index, True
    for field in ("numel", "dtype", "compression", "average", "priority", "server_optimizer"):
        if getattr(have, field) != getattr(want, field):
            raise _error("InvalidArgument",
                         "bitpush: tensor '%s' was declared as %s but is now pushed as %s (%s "
                         "differs); a name keeps its first declaration: use another name"
                         % (name, have.describe(), want.describe(), field))
    return have.index, False


def _commit_declarations(s):
    """Checks the declarations not yet checked (collective: every worker does so at the same
    point). A refusal is sticky for those tensors: their push_pulls fail with it, through their
    handles, so it is not raised here."""
    try:
        s.client.commit_declarations()
    except BitpushError:
        pass


def declare(name, tensor, compression=None, average=True, priority=0, server_optimizer=None):
    """Declares `name` for push_pulls of tensors like `tensor` (numel, dtype, device) without
    pushing; the first push_pull of a name does this otherwise. Every worker must declare in
    the same order. Used before restoring error-feedback state (a checkpoint).
    server_optimizer: for tensors whose optimizer runs on the servers (ServerOptimizer), a dict
    of worker::ServerOptimizerOptions' fields."""
    s = _require()
    _check_tensor(tensor, name)
    spec = "" if compression is None else str(compression)
    on_gpu = tensor.device.type == "cuda" and s.mode == "daemon"
    with s.declare_lock:
        _, first = _declare(s, name, tensor.numel(), _DTYPES[tensor.dtype], spec, bool(average),
                            int(priority), on_gpu, server_optimizer)
        if first and s.starter is not None:
            _commit_declarations(s)  # see push_pull_async


def _declared(s, name, what):
    with s.lock:
        d = s.declarations.get(name)
    if d is None:
        raise _error("NotFound", "bitpush: %s: tensor '%s' is not declared; call declare() (or "
                     "push it) first" % (what, name))
    return d
