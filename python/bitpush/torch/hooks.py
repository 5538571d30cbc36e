"""A DistributedDataParallel communication hook that averages DDP's gradient buckets over
bitpush instead of the process group's all-reduce.

    import torch.distributed as dist
    dist.init_process_group("gloo", ...)          # DDP still needs a process group
    bp.init()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(bp.PushPullHookState(), bp.push_pull_hook)

DDP (torch 1.13) calls the hook once per bucket during backward, in bucket order, from the
autograd thread; the hook starts ``push_pull_async`` of the bucket's flat buffer (in place) and
returns a ``torch.futures.Future`` completed by a waiter thread once bitpush delivered the
average over the bitpush workers. DDP waits on the futures at the end of backward and copies
the buckets back into ``p.grad``. The process group only carries DDP's own collectives (the
initial parameter broadcast, buffer broadcasts, the unused-parameter bitmap); one bitpush
worker per DDP rank.

Bucket names: DDP rebuilds its buckets after the first iteration (by the order gradients
became ready), so a bucket's size can change once; the tensor name is
``<prefix>.<bucket index>.<numel>``, so a rebuilt bucket is a new bitpush tensor. Every rank
rebuilds identically (DDP synchronises the rebuild), so declarations agree.

Thread-safety: a state object belongs to one DDP module.
"""

import queue
import threading

import torch

from .collectives import push_pull_async
from .compression import _check_compression
from .handles import synchronize

__all__ = ["PushPullHookState", "push_pull_hook"]


class PushPullHookState:
    """The state argument of ``register_comm_hook`` for ``push_pull_hook``.

    compression: the compressor spec of every bucket ("none", "fp16", "onebit", ...); None
        (the default) = the cluster YAML's, as for push_pull. The cluster's
        compression.error_feedback applies as for any tensor.
    prefix: tensor-name prefix (one per DDP module when a process wraps several).
    """

    def __init__(self, compression=None, prefix="ddp"):
        self.compression = _check_compression(compression, "PushPullHookState")
        self.prefix = prefix
        self._queue = None
        self._thread = None
        self._lock = threading.Lock()

    def _waiter(self):
        with self._lock:
            if self._thread is None:
                self._queue = queue.Queue()
                self._thread = threading.Thread(target=self._run, name="bitpush-ddp-hook",
                                                daemon=True)
                self._thread.start()
        return self._queue

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, buf, fut = item
            try:
                out = synchronize(handle)
                if out is not None and out.data_ptr() != buf.data_ptr():
                    buf.copy_(out)
                fut.set_result(buf)
            except Exception as e:  # delivered to DDP's wait, i.e. to backward()'s caller
                fut.set_exception(e)

    def close(self):
        """Stops the waiter thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None


def push_pull_hook(state, bucket):
    """DDP comm hook: the bucket's gradients averaged over the bitpush workers."""
    if state is None:
        raise TypeError("push_pull_hook needs a PushPullHookState: "
                        "ddp.register_comm_hook(bp.PushPullHookState(), bp.push_pull_hook)")
    buf = bucket.buffer()
    name = "%s.%d.%d" % (state.prefix, bucket.index(), buf.numel())
    fut = torch.futures.Future()
    try:
        handle = push_pull_async(buf, name, compression=state.compression, average=True,
                                 output=buf)
    except Exception as e:
        fut.set_exception(e)
        return fut
    state._waiter().put((handle, buf, fut))
    return fut
