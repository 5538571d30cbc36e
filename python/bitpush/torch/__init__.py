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

This module only gathers the API; each piece lives in its own module, and none of them imports
this one (tests/python/test_import_graph.py):

    errors             ``BitpushError`` and its code
    session            init / shutdown, rank, size, ... stats, wait_for_servers (the session)
    declarations       a tensor's declaration by name; ``declare``
    handles            ``Handle``, ``synchronize``, ``poll``; the deferred start of CUDA tensors
    collectives        ``push_pull*``, ``allreduce*``, ``barrier``
    broadcast          ``broadcast_parameters``, ``broadcast_optimizer_state``
    compression        ``Compression``, ``compression_report``
    error_feedback     the worker's and the servers' error-feedback residuals
    server_weights     the tensors of the optimizer on the servers (ServerOptimizer's calls)
    cluster_knobs      the cluster YAML's knobs the optimizers follow (``cluster_*``)
    gradient_exchange  the gradient hooks every bitpush optimizer shares
    optimizer          ``CLAN``, ``LANS``
    server_optimizer   ``ServerOptimizer``, ``QWD``
    distributed_optimizer  ``DistributedOptimizer`` (on the workers or, by the YAML, the servers)
    binsgdm            ``BinSGDM``
    hooks              the DDP comm hook
    checkpoint         ``save_checkpoint``, ``load_checkpoint``
    checkpointer       ``Checkpointer``: periodic checkpoints in a directory, resume, recover
"""
from .errors import BitpushError
from .session import (init, shutdown, is_initialized, rank, size, local_rank, local_size,
                      node_rank, num_nodes, mode, config_path, gpu, stats, wait_for_servers,
                      _require)  # noqa: F401 (tests read the session through it)
from .declarations import declare
from .handles import Handle, synchronize, poll
from .collectives import (push_pull, push_pull_inplace, push_pull_async, allreduce,
                          allreduce_async, allreduce_, Average, Sum, barrier)
from .broadcast import broadcast_parameters, broadcast_optimizer_state
from .compression import Compression, compression_report
from .error_feedback import (error_feedback_state, restore_error_feedback_state,
                             server_error_feedback_state, restore_server_error_feedback_state,
                             set_error_feedback_decay)
from .server_weights import (init_server_weights, pull_server_weights, server_optimizer_state,
                             restore_server_optimizer_state)
from .cluster_knobs import (cluster_error_feedback, cluster_compression,
                            cluster_optimizer_placement, cluster_optimizer_pull,
                            cluster_partition_bytes)
from .optimizer import CLAN, LANS, ONEBIT_ERROR_FEEDBACK_DECAY, ONEBIT_WIDE_SCALE_ELEMENTS
from .server_optimizer import ServerOptimizer, QWD
from .distributed_optimizer import DistributedOptimizer
from .binsgdm import BinSGDM
from .hooks import PushPullHookState, push_pull_hook
from .checkpoint import save_checkpoint, load_checkpoint
from .checkpointer import Checkpointer

__all__ = [
    "BitpushError", "Handle", "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
    "local_size", "node_rank", "num_nodes", "mode", "config_path", "gpu", "push_pull",
    "push_pull_inplace", "push_pull_async", "synchronize", "poll", "barrier",
    "broadcast_parameters", "broadcast_optimizer_state", "stats", "declare",
    "error_feedback_state", "restore_error_feedback_state", "set_error_feedback_decay",
    "compression_report",
    "server_error_feedback_state", "restore_server_error_feedback_state",
    "init_server_weights", "pull_server_weights", "server_optimizer_state",
    "restore_server_optimizer_state", "wait_for_servers", "Compression", "allreduce",
    "allreduce_async", "allreduce_", "Average", "Sum",
    "CLAN", "LANS", "DistributedOptimizer", "cluster_error_feedback", "cluster_compression",
    "ONEBIT_ERROR_FEEDBACK_DECAY", "PushPullHookState", "push_pull_hook", "save_checkpoint",
    "load_checkpoint", "ServerOptimizer", "QWD", "cluster_optimizer_placement",
    "cluster_optimizer_pull", "BinSGDM", "cluster_partition_bytes", "ONEBIT_WIDE_SCALE_ELEMENTS",
    "Checkpointer",
]
