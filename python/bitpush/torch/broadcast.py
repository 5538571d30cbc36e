"""``broadcast_parameters`` and ``broadcast_optimizer_state``: the root's tensors and scalars
copied into every other process's, in place.

A broadcast is a sum over processes where every process but the root pushes zeros,
uncompressed. fp32/fp16 values are exact (x + 0 + ... + 0 in fp32; -0.0 becomes +0.0); every
other dtype (and Python scalars) travels as its bytes, one fp32 value 0..255 per byte, which is
exact.

Thread-safety: collective; call from the training thread, the same broadcasts in the same order
on every process.
"""
import torch

from .collectives import push_pull, push_pull_async
from .declarations import _BROADCAST_PREFIX, _DTYPES
from .errors import BitpushError, _error
from .session import _require, rank, size


class _Broadcast:
    def __init__(self, root_rank):
        s = _require()
        if not 0 <= root_rank < s.total_processes:
            raise ValueError("bitpush: root_rank %d is not a rank (size %d)"
                             % (root_rank, s.total_processes))
        self.is_root = rank() == root_rank
        self.pending = []  # (handle, finish callback)

    def tensor(self, name, t):
        """Broadcasts tensor `t` in place (any dtype, CPU or CUDA, any layout)."""
        if not isinstance(t, torch.Tensor):
            raise TypeError("bitpush: broadcast of '%s': a %s is not a tensor"
                            % (name, type(t).__name__))
        src = t.detach()
        staged = src.device.type != "cpu" or not src.is_contiguous()
        if src.dtype in _DTYPES:
            buf = src.to("cpu").contiguous() if staged else src
            if staged and buf.data_ptr() == src.data_ptr():
                buf = buf.clone()
            if not self.is_root:
                buf.zero_()

            def finish(out, buf=buf, staged=staged):
                if staged:
                    with torch.no_grad():
                        src.copy_(buf)
        else:
            as_bytes = src.to("cpu").contiguous().reshape(-1).view(torch.uint8)
            buf = as_bytes.to(torch.float32)
            if not self.is_root:
                buf.zero_()

            def finish(out, buf=buf):
                restored = buf.round().to(torch.uint8).view(src.dtype).reshape(src.shape)
                with torch.no_grad():
                    src.copy_(restored)
        if buf.numel() == 0:
            return
        h = push_pull_async(buf, _BROADCAST_PREFIX + name, compression="none", average=False,
                            output=buf)
        self.pending.append((h, finish))

    def scalar(self, name, value, store):
        """Broadcasts a Python bool/int/float; `store(new_value)` receives the root's value."""
        kind = type(value)
        dtype = {bool: torch.bool, int: torch.int64, float: torch.float64}[kind]
        t = torch.tensor([value], dtype=dtype)
        self.tensor(name, t)
        self.pending.append((None, lambda out: store(kind(t.item()))))

    def wait(self):
        first_error = None
        for h, finish in self.pending:  # wait for all, even after a failure (buffers in use)
            try:
                out = h.wait() if h is not None else None
                if first_error is None:
                    finish(out)
            except BitpushError as e:
                first_error = first_error or e
        self.pending = []
        if first_error is not None:
            raise first_error


def _named_tensors(params):
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = list(params)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("bitpush: broadcast_parameters takes a state_dict or (name, tensor) "
                            "pairs such as model.named_parameters(), got an item %r"
                            % (type(item).__name__,))
    return items


def broadcast_parameters(params, root_rank=0):
    """Copies the root's tensors into every other process's, in place.

    params: a state_dict or an iterable of (name, tensor) pairs (model.named_parameters()),
    the same names in the same order on every process. Tensors of any dtype and device.
    """
    b = _Broadcast(root_rank)
    for name, t in _named_tensors(params):
        b.tensor("param." + name, t)
    b.wait()


_SCALARS = (bool, int, float)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Copies the root's optimizer state (state tensors and scalars, and the numeric
    hyper-parameters of every param group) into every other process's optimizer, in place.

    Every process must have the same parameter groups and the same state layout (e.g. call it
    before the first step, or after the same number of steps); a difference is reported.
    """
    b = _Broadcast(root_rank)
    layout = []
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            layout.append(len(optimizer.state.get(p, {})))
    # The layout first: a process with another layout would otherwise fail with a less clear
    # declaration difference.
    mine = torch.tensor([len(layout)] + layout, dtype=torch.float32)
    total = push_pull(mine, "bitpush.broadcast.optimizer.layout.%d" % len(layout),
                      compression="none", average=False)
    if not torch.equal(total, mine * size()):
        raise _error("InvalidArgument",
                     "bitpush: broadcast_optimizer_state: the optimizer's state layout differs "
                     "between processes (entries per parameter here: %s); build the same "
                     "optimizer everywhere and broadcast before the first step or after the "
                     "same steps" % layout)
    for gi, group in enumerate(optimizer.param_groups):
        for key in sorted(k for k in group if k != "params"):
            value = group[key]
            prefix = "optimizer.group%d.%s" % (gi, key)
            if isinstance(value, _SCALARS):
                b.scalar(prefix, value, lambda v, g=group, k=key: g.__setitem__(k, v))
            elif isinstance(value, (tuple, list)) and all(isinstance(x, _SCALARS) for x in value):
                items = list(value)
                for i, x in enumerate(items):
                    b.scalar("%s.%d" % (prefix, i), x,
                             lambda v, items=items, i=i: items.__setitem__(i, v))
                b.pending.append((None, lambda out, g=group, k=key, items=items, t=type(value):
                                  g.__setitem__(k, t(items))))
            elif isinstance(value, torch.Tensor):
                b.tensor(prefix, value)
        for pi, p in enumerate(group["params"]):
            state = optimizer.state.get(p)
            if not state:
                continue
            for key in sorted(state, key=str):
                value = state[key]
                name = "optimizer.state%d.%d.%s" % (gi, pi, key)
                if isinstance(value, torch.Tensor):
                    b.tensor(name, value)
                elif isinstance(value, _SCALARS):
                    b.scalar(name, value, lambda v, st=state, k=key: st.__setitem__(k, v))
    b.wait()
