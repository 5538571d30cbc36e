"""push_pull and its forms: ``push_pull_async`` (which starts the operation), ``push_pull`` /
``push_pull_inplace`` (blocking), Horovod's ``allreduce_async`` / ``allreduce`` /
``allreduce_`` (``Average``, ``Sum``), and ``barrier``.

A push_pull declares its tensor on first use (declarations.py), starts the C++ operation —
now, or for a CUDA tensor on the starter thread once its producer completed (handles.py) — and
returns a Handle, kept in the session's in-flight table until it completes.

Thread-safety: any thread; one push_pull per name may be in flight at a time.
"""
import os
import sys

import torch

from .declarations import _DTYPES, _check_tensor, _commit_declarations, _declare
from .errors import _error
from .handles import Handle, _DeferredStart, _Starter, synchronize
from .session import _require


Average = "average"
Sum = "sum"


def _default_name(tensor, depth):
    """The name of a push_pull given none: where it was called (the file's base name, the
    function and the line, `depth` frames up) and the tensor's numel and dtype. Every process
    runs the same code, so every process derives the same names, and a loop that pushes from
    one line reuses one tensor instead of declaring a new one per call (Horovod's per-call
    counter would grow the servers' keys without bound)."""
    f = sys._getframe(depth + 1)
    code = f.f_code
    return "noname.%s:%s:%d.%dx%s" % (os.path.basename(code.co_filename), code.co_name,
                                      f.f_lineno, tensor.numel(),
                                      _DTYPES.get(tensor.dtype, str(tensor.dtype)))


def push_pull_async(tensor, name=None, compression=None, average=True, priority=0,
                    output=None, _depth=1, _ready=None):
    """Starts a push_pull of `tensor` under `name` and returns a Handle.

    name: the tensor's identity (see the module doc). None: derived from the call site and
        the tensor's numel and dtype (``noname.<file>:<function>:<line>.<numel>x<dtype>``), so
        one line pushing one kind of tensor (a loss, a metric) needs no name; give one when a
        line pushes several tensors or two calls of it can be in flight at once.
    compression: a compressor spec ("none", "onebit", "topk:ratio=0.01", ...; None = the
        cluster's compression.spec). average: True = the average over every training process,
        False = their sum. priority: lower goes first. output: where the result goes (a
        contiguous CPU tensor of the same numel and dtype; may be `tensor` itself); default a
        new tensor. Neither tensor may be touched until the handle completed.
    """
    s = _require()
    if name is None and isinstance(tensor, torch.Tensor):
        name = _default_name(tensor, _depth)
    if not isinstance(name, str) or not name:
        raise TypeError("bitpush: push_pull needs a non-empty tensor name or None, got %r"
                        % (name,))
    _check_tensor(tensor, name)
    if output is None:
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    else:
        _check_tensor(output, name, "output")
        if output.numel() != tensor.numel() or output.dtype != tensor.dtype:
            raise ValueError("bitpush: output of '%s' has %d x %s but the tensor %d x %s"
                             % (name, output.numel(), output.dtype, tensor.numel(),
                                tensor.dtype))
    spec = "" if compression is None else str(compression)
    dtype = _DTYPES[tensor.dtype]
    if tensor.device != output.device:
        raise ValueError("bitpush: tensor '%s' is on %s but its output on %s"
                         % (name, tensor.device, output.device))
    # CUDA tensors: in daemon mode the daemon's GPU path (FP16 cast + NCCL on the node's GPUs,
    # docs/local-ipc.md "GPU tensors") reads them; in embedded mode they are staged through
    # pinned host memory by a copy queued on the current stream. Either way the push_pull
    # starts once an event recorded after them on the current stream completed (waited for by
    # the starter thread: the caller — backward's hook — goes on queueing kernels).
    on_gpu = tensor.device.type == "cuda" and s.mode == "daemon"
    staged = None
    ready = _ready
    if tensor.device.type == "cuda":
        stream = torch.cuda.current_stream(tensor.device)
        if not on_gpu:
            staged = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            staged.copy_(tensor.detach(), non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
    with s.declare_lock:
        index, first = _declare(s, name, tensor.numel(), dtype, spec, bool(average),
                                int(priority), on_gpu)
        if first and (ready is not None or s.starter is not None):
            # Checked here, in the caller's order: a deferred start (or one already waiting on
            # the starter thread) would otherwise check it whenever it happens to start.
            _commit_declarations(s)
        return _start_push_pull(s, name, index, tensor, output, staged, dtype, ready)


def _start_push_pull(s, name, index, tensor, output, staged, dtype, ready):
    """push_pull_async's start, under s.declare_lock: now, or on the starter thread once
    `ready` completed."""
    with s.lock:
        previous = s.in_flight.get(name)
        if previous is not None and not previous.ready():
            raise _error("FailedPrecondition",
                         "bitpush: a push_pull of tensor '%s' is still in flight; synchronize "
                         "its handle first" % name)
        tensor_d = tensor.detach() if staged is None else staged
        output_d = output.detach() if staged is None else staged

        def start():
            with s.declare_lock:
                return s.client.push_pull(index, tensor_d.data_ptr(), output_d.data_ptr(),
                                          tensor.numel(), dtype, name)

        if ready is None:
            h = start()
        else:
            h = _DeferredStart()
            if s.starter is None:
                s.starter = _Starter()
            s.starter.submit(ready, start, h)
        handle = Handle(h, s, name, tensor_d, output, staged)
        s.in_flight[name] = handle
    return handle


def push_pull(tensor, name=None, compression=None, average=True, priority=0):
    """The push_pull of `tensor` (see push_pull_async) into a new tensor; blocks."""
    return synchronize(push_pull_async(tensor, name, compression, average, priority,
                                       _depth=2))


def push_pull_inplace(tensor, name=None, compression=None, average=True, priority=0):
    """push_pull with the result written back into `tensor` (contiguous); returns it."""
    return synchronize(push_pull_async(tensor, name, compression, average, priority,
                                       output=tensor, _depth=2))


def _average(average, op, what):
    if op is None:
        return True if average is None else bool(average)
    if average is not None:
        raise ValueError("bitpush.%s: give average or op, not both" % what)
    if op not in (Average, Sum):
        raise ValueError("bitpush.%s: op must be bitpush.torch.Average or bitpush.torch.Sum, "
                         "got %r" % (what, op))
    return op == Average


def allreduce_async(tensor, average=None, name=None, compression=None, op=None, priority=0):
    """Horovod's ``allreduce_async`` over bitpush: push_pull_async with Horovod's argument
    order; ``op`` is Average (the default) or Sum. compression None = the cluster's spec."""
    return push_pull_async(tensor, name, compression, _average(average, op, "allreduce_async"),
                           priority, _depth=2)


def allreduce(tensor, average=None, name=None, compression=None, op=None, priority=0):
    """Horovod's ``allreduce`` over bitpush: the average (or, with op=Sum, the sum) of
    `tensor` over every training process, as a new tensor; blocks."""
    return synchronize(push_pull_async(tensor, name, compression,
                                       _average(average, op, "allreduce"), priority, _depth=2))


def allreduce_(tensor, average=None, name=None, compression=None, op=None, priority=0):
    """Horovod's in-place ``allreduce_``: the result written into `tensor`; returns it."""
    return synchronize(push_pull_async(tensor, name, compression,
                                       _average(average, op, "allreduce_"), priority,
                                       output=tensor, _depth=2))


def barrier():
    """Returns once every training process called it (a 1-element push_pull)."""
    push_pull(torch.zeros(1), "bitpush.barrier", compression="none", average=False)
