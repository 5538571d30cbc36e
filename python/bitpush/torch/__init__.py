"""bitpush for PyTorch: ``import bitpush.torch as bp`` (docs/python.md).

    bp.init()                                  # from the BITPUSH_* environment (launcher)
    bp.broadcast_parameters(model.state_dict(), root_rank=0)
    avg = bp.push_pull(grad, "fc.weight")      # the average over every training process
    bp.shutdown()

One bitpush worker client per process (embedded: this process is a worker node of the cluster
YAML; daemon: one of ``local_size`` training processes served by the node's bitpush-worker).
Tensors are identified by name. The first push_pull of a name declares the tensor (elements,
dtype, compression, average/sum, priority); later uses must match. Every process must push the
same names in the same order: the engine checks declarations across workers in order.

Thread-safety: every function may be called from any thread; the C++ calls run with the GIL
released. One push_pull per name may be in flight at a time.
"""
import atexit
import os
import sys
import threading
import warnings

import torch

from .. import _C, _env
from .._C import BitpushError

__all__ = [
    "BitpushError", "Handle", "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "node_rank", "num_nodes", "mode", "config_path", "gpu", "push_pull",
    "push_pull_inplace", "push_pull_async", "synchronize", "poll", "barrier",
    "broadcast_parameters", "broadcast_optimizer_state", "stats", "declare",
    "error_feedback_state", "restore_error_feedback_state", "compression_report",
    "server_error_feedback_state", "restore_server_error_feedback_state",
    "init_server_weights", "pull_server_weights", "server_optimizer_state",
    "restore_server_optimizer_state", "wait_for_servers", "Compression", "allreduce", "allreduce_async", "allreduce_", "Average", "Sum",
]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_BROADCAST_PREFIX = "bitpush.broadcast."


def _error(code, message):
    e = BitpushError(message)
    e.code = code
    return e


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


class _State:
    def __init__(self, client, config, local_rank, local_size, mode, gpu=None,
                 log_level=_env.DEFAULT_LOG_LEVEL):
        self.client = client
        self.log_level = log_level
        self.config = config
        self.node_rank = client.rank
        self.num_nodes = client.num_workers
        self.local_rank = local_rank
        self.local_size = local_size
        self.mode = mode
        self.gpu = gpu
        # Global ranks: nodes in YAML order, each with its processes. The YAML's per-node
        # counts when it gives every node's (they may differ), else local_size everywhere.
        # A YAML count that is not this node's local_size was overridden (bitpush launch
        # --local-size, which applies one count to every node).
        counts = _C.load_cluster_config(config)["worker_processes"]
        if len(counts) == self.num_nodes and all(counts) and \
                counts[self.node_rank] == local_size:
            self.rank_offset = sum(counts[:self.node_rank])
            self.total_processes = sum(counts)
        else:
            self.rank_offset = self.node_rank * local_size
            self.total_processes = self.num_nodes * local_size
        self.lock = threading.Lock()
        # Held while a declaration is made and checked and while a push_pull starts (caller
        # and starter thread alike): the client checks the declarations not yet checked at a
        # push_pull's start, and a starter thread must not pick up one that the caller's thread
        # has made but not yet checked, or the set checked together would depend on timing and
        # differ between workers. Re-entrant: the caller starts non-deferred push_pulls with it.
        self.declare_lock = threading.RLock()
        self.starter = None  # _Starter, on the first deferred push_pull
        self.declarations = {}  # name -> _Declaration
        self.in_flight = {}  # name -> Handle (keeps the tensors alive while C++ uses them)


_state = None
_state_lock = threading.Lock()


def _require():
    s = _state
    if s is None:
        raise _error("FailedPrecondition",
                     "bitpush.torch is not initialized: call bitpush.torch.init() first")
    return s


class _DeferredStart:
    """A push_pull that starts once `ready` (a torch.cuda.Event recorded after the tensor's
    producer on its stream) completed: the starter thread waits on the event — never on the
    whole stream, and never on the caller's thread — then starts the C++ push_pull. Behaves
    like the C++ handle (ready(), wait(timeout_ms)) from then on."""

    __slots__ = ("_started", "_inner", "_error")

    def __init__(self):
        self._started = threading.Event()
        self._inner = None
        self._error = None

    def ready(self):
        if not self._started.is_set():
            return False
        return self._error is not None or self._inner.ready()

    def wait(self, timeout_ms=None):
        if timeout_ms is None:
            while not self._started.wait(0.1):
                pass
        elif not self._started.wait(timeout_ms / 1000.0):
            raise _error("Timeout", "bitpush: push_pull not started after %d ms: its tensor is "
                         "not ready on the GPU yet" % timeout_ms)
        if self._error is not None:
            raise self._error
        self._inner.wait(timeout_ms)


class _Starter:
    """The thread that starts deferred push_pulls in the order they were asked for (one per
    process, started on first use)."""

    def __init__(self):
        import queue
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="bitpush-cuda-start",
                                        daemon=True)
        self._thread.start()

    def submit(self, ready, start, deferred):
        self._queue.put((ready, start, deferred))

    def close(self):
        self._queue.put(None)

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            ready, start, deferred = item
            try:
                ready.synchronize()
                deferred._inner = start()
            except BaseException as e:  # delivered to whoever waits on the handle
                deferred._error = e if isinstance(e, BitpushError) else \
                    _error("Internal", "bitpush: starting a deferred push_pull: %s" % e)
            deferred._started.set()


class Handle:
    """The completion of one push_pull_async. Keeps its input and output tensors alive until
    the operation completed; ``synchronize(handle)`` returns the output."""

    __slots__ = ("_handle", "_state", "name", "tensor", "output", "_done", "_staged",
                 "__weakref__")

    def __init__(self, handle, state, name, tensor, output, staged=None):
        self._handle = handle
        self._state = state
        self.name = name
        self.tensor = tensor
        self.output = output
        self._done = False
        # Embedded mode, CUDA tensor: the CPU copy the operation writes, copied into `output`
        # on completion.
        self._staged = staged

    def ready(self):
        """True once the push_pull completed (successfully or not); never blocks."""
        return self._done or self._handle.ready()

    def wait(self, timeout=None):
        """Blocks until completion and returns the output tensor; raises BitpushError with the
        operation's failure. timeout (seconds): BitpushError (code Timeout) after that long,
        the operation goes on. Ctrl-C raises KeyboardInterrupt (the operation goes on)."""
        timeout_ms = None if timeout is None else max(0, int(timeout * 1000))
        try:
            self._handle.wait(timeout_ms)
        except BitpushError as e:
            if e.code != "Timeout" or self._handle.ready():
                self._release()
            raise
        if self._staged is not None and not self._done:
            self.output.copy_(self._staged)
        self._release()
        return self.output

    def _release(self):
        if self._done:
            return
        self._done = True
        with self._state.lock:
            if self._state.in_flight.get(self.name) is self:
                del self._state.in_flight[self.name]

    def __repr__(self):
        return "<bitpush.torch.Handle '%s' %s>" % (self.name,
                                                   "ready" if self.ready() else "in flight")


# ---------------------------------------------------------------------------------------------
# Lifecycle

def init(config=None, *, rank=None, local_rank=None, local_size=None, mode=None,
         daemon_socket=None, log_level=None):
    """Connects this process to the bitpush cluster.

    Arguments override the environment (BITPUSH_CONFIG, BITPUSH_WORKER_RANK,
    BITPUSH_LOCAL_RANK, BITPUSH_LOCAL_SIZE, BITPUSH_MODE, BITPUSH_DAEMON_SOCKET):
        config: the cluster YAML path.
        rank: this process's node (the worker's rank in the YAML).
        local_rank / local_size: this process among the node's training processes (0 / 1).
        mode: "embedded" (this process is the worker) or "daemon" (through the node's
            bitpush-worker); default daemon when local_size > 1.
        log_level: of this process's bitpush log (BITPUSH_LOG_LEVEL): trace, debug, info,
            warn (default: warnings, errors and the `compression:` line), error or off.
    Blocks until the cluster is assembled (bounded by cluster.startup_timeout_s). Raises
    ValueError naming a missing or bad setting, BitpushError when the cluster refuses.
    """
    global _state
    env = _env.bootstrap()
    names = _env.names()
    config = config if config is not None else env.config
    rank = rank if rank is not None else env.worker_rank
    local_rank = local_rank if local_rank is not None else env.local_rank
    local_size = local_size if local_size is not None else env.local_size
    mode = mode if mode is not None else env.mode
    daemon_socket = daemon_socket if daemon_socket is not None else env.daemon_socket
    log_level = _env.normalize_log_level(log_level, "bitpush.torch.init(log_level)") \
        if log_level is not None else (env.log_level or _env.DEFAULT_LOG_LEVEL)
    missing = []
    if config is None:
        missing.append("the cluster config (init(config='cluster.yaml') or %s)" % names["config"])
    if rank is None:
        missing.append("this process's worker rank (init(rank=N) or %s)" % names["worker_rank"])
    if missing:
        raise ValueError("bitpush.torch.init: missing " + " and ".join(missing) +
                         "; the launcher sets these (docs/python.md, 'Bootstrap')")
    local_rank = 0 if local_rank is None else int(local_rank)
    local_size = 1 if local_size is None else int(local_size)
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise ValueError("bitpush.torch.init: local_rank %d is not in [0, local_size=%d)"
                         % (local_rank, local_size))
    if mode is None:
        mode = "daemon" if local_size > 1 else "embedded"
    if mode not in _env.MODES:
        raise ValueError("bitpush.torch.init: mode must be one of %s, got %r"
                         % (", ".join(_env.MODES), mode))
    if mode == "embedded" and local_size != 1:
        raise ValueError("bitpush.torch.init: local_size=%d needs mode 'daemon' (the node's "
                         "bitpush-worker sums its processes); embedded mode is one process per "
                         "node" % local_size)
    with _state_lock:
        if _state is not None:
            raise _error("FailedPrecondition",
                         "bitpush.torch.init: already initialized (call shutdown() first)")
        gpu = env.gpu
        if gpu is not None:
            if torch.cuda.is_available():
                torch.cuda.set_device(gpu)
            else:
                warnings.warn("%s=%d but this torch has no CUDA device; training on the CPU"
                              % (names["gpu"], gpu))
                gpu = None
        _C.set_log_level(log_level)
        client = _C.Client(str(config), int(rank), mode, local_rank, local_size,
                           daemon_socket or "")
        try:
            _state = _State(client, str(config), local_rank, local_size, mode, gpu, log_level)
        except BaseException:
            client.close()
            raise


def shutdown(timeout=30.0):
    """Tells the cluster this process is done and waits (bounded by `timeout` seconds) for the
    clean shutdown; pending handles fail with Cancelled. No-op when not initialized."""
    global _state
    with _state_lock:
        s = _state
        _state = None
    if s is None:
        return
    try:
        if s.starter is not None:
            s.starter.close()
        s.client.shutdown(float(timeout))
    finally:
        s.client.close()
        with s.lock:
            s.in_flight.clear()


def _shutdown_at_exit():
    if _state is None:
        return
    try:
        shutdown()
    except Exception as e:  # the interpreter is exiting: report, do not raise
        print("bitpush: shutdown at exit failed: %s" % e, file=sys.stderr)


atexit.register(_shutdown_at_exit)


def is_initialized():
    return _state is not None


def rank():
    """This process's global rank: the processes of the nodes before this one (the YAML's
    per-node counts; node_rank() * local_size() when every node runs the same number) plus
    local_rank()."""
    s = _require()
    return s.rank_offset + s.local_rank


def size():
    """The number of training processes in the cluster (num_nodes() * local_size() when every
    node runs the same number)."""
    return _require().total_processes


def gpu():
    """This process's CUDA device index (BITPUSH_GPU, from the YAML's gpus of its node; init()
    made it torch's current device), or None for a CPU process."""
    return _require().gpu


def local_rank():
    return _require().local_rank


def local_size():
    return _require().local_size


def node_rank():
    """This process's node: its worker's rank in the cluster YAML."""
    return _require().node_rank


def num_nodes():
    """The number of worker nodes (the YAML's workers)."""
    return _require().num_nodes


def mode():
    """"embedded" or "daemon"."""
    return _require().mode


def config_path():
    """The cluster YAML this process was initialized with."""
    return _require().config


def stats():
    """The worker's counters: bytes_pushed, bytes_pulled (compressed payload bytes),
    raw_bytes_pushed, ops_completed, ops_failed, partitions_pushed, compress_ns, network_ns,
    decompress_ns, peak_bytes_in_flight; and the quantiser telemetry of methods that report it
    (loco): quantized_values and quantized_saturated (the pushed 4-bit codes; saturated /
    values is the saturation fraction), error_values and error_saturated (the int8 error),
    error_norm (L2 norm of the worker error state as last pushed)."""
    return _require().client.stats()


# ---------------------------------------------------------------------------------------------
# push_pull

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


class Compression:
    """Compressor specs by name, for users of Horovod's and BytePS's ``Compression``: every
    attribute is a spec string (docs/compressors.md), accepted wherever a ``compression``
    argument is. ``Compression.default`` (None) is the cluster YAML's compression.spec.

        bp.push_pull(grad, "w", compression=bp.Compression.fp16)
        bp.CLAN(params, compression=bp.Compression.topk(ratio=0.01))
    """
    default = None
    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"
    onebit = "onebit"

    @staticmethod
    def spec(method, **params):
        """The spec of `method` with `params` ("topk", ratio=0.01 -> "topk:ratio=0.01");
        ValueError naming the problem when the registry refuses it."""
        text = str(method)
        if params:
            text += ":" + ",".join("%s=%s" % (k, str(v).lower() if isinstance(v, bool) else v)
                                   for k, v in sorted(params.items()))
        return _check_compression(text, "Compression.%s" % method)

    @staticmethod
    def topk(**params):
        """Top-k sparsification: ``topk(ratio=0.01)`` or ``topk(k=1000)``."""
        return Compression.spec("topk", **params)

    @staticmethod
    def randomk(**params):
        """Random-k sparsification: ``randomk(ratio=0.01)``, ``unbiased=True`` ..."""
        return Compression.spec("randomk", **params)

    @staticmethod
    def dithering(**params):
        """Stochastic dithering: ``dithering(levels=15)`` ..."""
        return Compression.spec("dithering", **params)


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


def _commit_declarations(s):
    """Checks the declarations not yet checked (collective: every worker does so at the same
    point). A refusal is sticky for those tensors: their push_pulls fail with it, through their
    handles, so it is not raised here."""
    try:
        s.client.commit_declarations()
    except BitpushError:
        pass


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


def compression_report(names=None):
    """One line, beginning ``compression:``, saying how many of the declared tensors `names`
    (default: every tensor this process declared but bitpush's own broadcast and barrier
    tensors) travel compressed, by spec, and their bytes, and which go raw and why (spec
    "none", or below the cluster's compression.min_compress_bytes), plus the cluster's
    compression.error_feedback. CLAN and DistributedOptimizer print it once, from rank 0,
    after their first exchange (docs/training.md)."""
    s = _require()
    with s.lock:
        if names is None:
            names = [n for n in s.declarations
                     if not n.startswith(_BROADCAST_PREFIX) and n != "bitpush.barrier"]
        missing = [n for n in names if n not in s.declarations]
        if missing:
            raise _error("NotFound", "bitpush: compression_report: tensor '%s' was never "
                         "declared or pushed" % missing[0])
        indices = [s.declarations[n].index for n in names]
    line = s.client.describe_compression(indices)
    ef = _C.load_cluster_config(s.config)["knobs"]["compression.error_feedback"]
    return "%s; error_feedback: %s" % (line, ef)


def _announce_compression(names):
    """Prints compression_report(names) to stderr from rank 0, unless the log level is error
    or off (an optimizer calls it once, at its first exchange)."""
    s = _state
    if s is None or s.log_level in ("error", "off") or rank() != 0:
        return
    print(compression_report(names), file=sys.stderr, flush=True)


def server_error_feedback_state(name):
    """The servers' error-feedback residual of tensor `name` (paper 001 Algorithm 4's ẽ, kept
    with compression.error_feedback server or both) as a 1-D float32 CPU tensor, read from the
    servers that own its keys, or None when it keeps none. One process reads it for the
    cluster (save_checkpoint: rank 0). Embedded mode (a daemon-mode process gets a
    BitpushError, Unimplemented)."""
    return _read_residual(name, "server_error_feedback_state")


def restore_server_error_feedback_state(name, residual):
    """Writes a residual saved by server_error_feedback_state back to the servers, before the
    tensor's first push_pull of the run (declare it first). One process restores it for the
    cluster (load_checkpoint: rank 0)."""
    _write_residual(name, residual, "restore_server_error_feedback_state")


# ---------------------------------------------------------------------------------------------
# Server-side optimizer tensors (bitpush.torch.ServerOptimizer; worker/client.h)

def _push_pull_step_async(grad, weights, name, lr):
    """Starts the push_pull of a declared server-side optimizer tensor: `grad` (contiguous
    float32 CPU) goes to the servers with the round's learning rate and `weights` (contiguous
    float32 CPU, this worker's copy) receives the update. Returns a Handle whose output is
    `weights`."""
    s = _require()
    d = _declared(s, name, "push_pull")
    with s.declare_lock, s.lock:
        previous = s.in_flight.get(name)
        if previous is not None and not previous.ready():
            raise _error("FailedPrecondition",
                         "bitpush: a push_pull of tensor '%s' is still in flight; synchronize "
                         "its handle first" % name)
        g, w = grad.detach(), weights.detach()
        h = s.client.push_pull_step(d.index, g.data_ptr(), w.data_ptr(), g.numel(), float(lr),
                                    name)
        handle = Handle(h, s, name, g, weights)
        s.in_flight[name] = handle
    return handle


def init_server_weights(name, weights):
    """Collective (every worker, in the same order): rank 0's `weights` (contiguous float32
    CPU) become the servers' master weights of declared tensor `name`, and every worker's
    `weights` is overwritten with the servers' copy."""
    s = _require()
    d = _declared(s, name, "init_server_weights")
    s.client.init_server_weights(d.index, weights.data_ptr(), weights.numel())


def pull_server_weights(name, weights):
    """Overwrites `weights` (contiguous float32 CPU) with the servers' copy of tensor `name`
    (what every worker holds after the last round), e.g. after a restore."""
    s = _require()
    d = _declared(s, name, "pull_server_weights")
    s.client.pull_server_weights(d.index, weights.data_ptr(), weights.numel())


def server_optimizer_state(name):
    """The servers' optimizer state of tensor `name` (master weights, moments, step, the
    workers' copy) as a list of bytes, one per partition."""
    s = _require()
    return list(s.client.server_optimizer_state(_declared(s, name,
                                                          "server_optimizer_state").index))


def restore_server_optimizer_state(name, parts):
    """Writes a state read by server_optimizer_state back to the servers (one process for the
    cluster); every worker then calls pull_server_weights."""
    s = _require()
    s.client.restore_server_optimizer_state(
        _declared(s, name, "restore_server_optimizer_state").index, [bytes(p) for p in parts])


def wait_for_servers(timeout=600.0):
    """With the YAML's cluster.server_rejoin_timeout_s: after a push_pull failed because a
    server died (BitpushError, code Unavailable), waits until a new process of it registered
    again, then returns; the job continues from its last checkpoint (load_checkpoint, every
    process). With no server missing yet it waits up to two heartbeat timeouts for the
    scheduler's verdict (a push can meet the dropped connection first), then returns; raises
    BitpushError when the job ended (the server did not come back in time) or after `timeout`
    seconds (docs/training.md, "A server restarted alone")."""
    s = _require()
    s.client.wait_for_servers(float(timeout))


def synchronize(handle, timeout=None):
    """Waits for `handle` and returns its output tensor (raises BitpushError on failure)."""
    if not isinstance(handle, Handle):
        raise TypeError("bitpush: synchronize takes a Handle from push_pull_async, got %s"
                        % type(handle).__name__)
    return handle.wait(timeout)


def poll(handle):
    """True once `handle` completed (successfully or not); never blocks."""
    return handle.ready()


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


# ---------------------------------------------------------------------------------------------
# Broadcasts: a sum over processes where every process but the root pushes zeros, uncompressed.
# fp32/fp16 values are exact (x + 0 + ... + 0 in fp32; -0.0 becomes +0.0); every other dtype
# (and Python scalars) travels as its bytes, one fp32 value 0..255 per byte, which is exact.

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


def _check_compression(compression, what):
    """Raises ValueError naming `what` when `compression` (a compressor spec; None = the
    cluster's compression.spec) does not parse, so a mistyped spec fails where it is given
    rather than at the first push_pull. Returns it unchanged."""
    if compression is None:
        return None
    try:
        _C.compressor_spec(str(compression))
    except BitpushError as e:
        raise ValueError("%s: compression '%s': %s" % (what, compression, e)) from None
    return compression


from . import checkpoint as _checkpoint, hooks as _hooks, optimizer as _optimizer  # noqa: E402
from . import server_optimizer as _server_optimizer  # noqa: E402
from . import binsgdm as _binsgdm  # noqa: E402

__all__ += list(getattr(_optimizer, "__all__", [])) + list(getattr(_hooks, "__all__", [])) + \
    list(getattr(_checkpoint, "__all__", [])) + list(_server_optimizer.__all__) + \
    list(_binsgdm.__all__)

from .optimizer import *  # noqa
from .binsgdm import *  # noqa
from .server_optimizer import *  # noqa
from .hooks import *  # noqa
from .checkpoint import *  # noqa
