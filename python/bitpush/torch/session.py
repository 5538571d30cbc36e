"""The process's bitpush session: ``init`` connects this process to the cluster (one worker
client: embedded, or through the node's bitpush-worker in daemon mode), ``shutdown`` ends it
(also at interpreter exit), and the queries read it: ``rank``, ``size``, ``local_rank``,
``local_size``, ``node_rank``, ``num_nodes``, ``mode``, ``config_path``, ``gpu``, ``stats``,
``wait_for_servers``.

The session (`_State`) is bitpush.torch's one module-level state: it owns the client, this
process's place in the cluster, the table of declared tensors (declarations.py) and the
push_pulls in flight (handles.py). The other modules reach it through `_require()`.

Thread-safety: `_state_lock` guards creating and dropping the session; `_State.lock` its
tables and `_State.declare_lock` declaring and starting push_pulls (see _State). Every
function may be called from any thread.
"""
import atexit
import sys
import threading
import time
import warnings

import torch

from .. import _C, _env
from .errors import _error


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


def _trace_optimizer(start_ns):
    """The timeline's `optimizer` span (docs/observability.md) from start_ns
    (time.monotonic_ns(), the engine's steady clock, and in daemon mode the node daemon's) to
    now; nothing when tracing is off or before init."""
    s = _state
    if s is not None and not s.client.closed:
        s.client.trace_optimizer(start_ns, time.monotonic_ns())


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


def shutdown(timeout=30.0, abort=False):
    """Tells the cluster this process is done and waits (bounded by `timeout` seconds) for the
    clean shutdown; pending handles fail with Cancelled. No-op when not initialized.
    abort=True (after a failure): closes at once without telling the cluster this process is
    done, so the others see it leave as after a crash instead of this process waiting for a
    clean shutdown that a failed job never reaches (the interpreter's exit does this when an
    unhandled exception ends it)."""
    global _state
    with _state_lock:
        s = _state
        _state = None
    if s is None:
        return
    try:
        if s.starter is not None:
            s.starter.close()
        if not abort:
            s.client.shutdown(float(timeout))
    finally:
        s.client.close()
        with s.lock:
            s.in_flight.clear()


def _shutdown_at_exit():
    if _state is None:
        return
    try:
        # An unhandled exception ends the interpreter (sys.last_value): leave at once.
        shutdown(abort=getattr(sys, "last_value", None) is not None)
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


def wait_for_servers(timeout=600.0):
    """With the YAML's cluster.server_rejoin_timeout_s: after a push_pull failed because a
    server died (BitpushError, code Unavailable), waits until a new process of it registered
    again, then returns; the job continues from its last checkpoint (load_checkpoint, every
    process). With no server missing yet it waits up to two heartbeat timeouts for the
    scheduler's verdict (a push can meet the dropped connection first), then returns; raises
    BitpushError when the job ended (the server did not come back in time) or after `timeout`
    seconds (docs/training.md, "A server restarted alone"). In daemon mode every training
    process of the node calls it; the node's bitpush-worker waits once for all."""
    s = _require()
    s.client.wait_for_servers(float(timeout))
