"""The one place the bitpush Python package reads environment variables.

The bootstrap contract (set by the launcher, or by ``bitpush.testing.LocalCluster.env``):

=========================  ==========================================================
BITPUSH_CONFIG             path of the cluster YAML (docs/config.md)
BITPUSH_WORKER_RANK        this process's node: the worker's rank in the YAML's workers
BITPUSH_LOCAL_RANK         this process's rank on its node (default 0)
BITPUSH_LOCAL_SIZE         training processes on the node (default 1)
BITPUSH_MODE               embedded | daemon (default: daemon when local size > 1)
BITPUSH_DAEMON_SOCKET      the node daemon's Unix socket (optional; default: the YAML's
                           worker.socket, else worker-<rank>.sock in the user's private
                           socket directory, computed by the C++ library: docs/local-ipc.md)
BITPUSH_BIN_DIR            where bitpush-scheduler/-server/-worker live (LocalCluster;
                           default: the build tree this package was built in)
BITPUSH_GPU                the CUDA device of this process (the YAML's gpus of its node,
                           by local rank); init() makes it torch's current device
BITPUSH_LOG_LEVEL          the level of this process's bitpush log: trace, debug, info,
                           warn (the default), error or off; warn and below also print the
                           one `compression:` line at the start of training
BITPUSH_ROLE, BITPUSH_SCHEDULER, BITPUSH_RANK, BITPUSH_SIZE
                           informational, set by the launcher: "worker", the scheduler's
                           address, this process's global rank and the process count (what
                           bitpush.torch.rank()/size() return after init)
BITPUSH_RESTART_COUNT      how many times the launcher started the job again before this
                           run (0 in the first; docs/launch.md, "Restarts"); read by
                           ``restart_count()`` (bitpush.torch.Checkpointer logs it)
=========================  ==========================================================

Arguments given to ``bitpush.torch.init`` override these.

`bitpush launch --slurm` (bitpush/slurm.py, docs/launch.md) reads the Slurm environment through
``slurm_environ()``: the SLURM_* variables, CUDA_VISIBLE_DEVICES, TMPDIR, and
BITPUSH_SLURM_TASKS_PER_NODE, which the launcher sets for the srun step it starts (the job's
SLURM_TASKS_PER_NODE; srun gives the step its own).
"""
import os
from dataclasses import dataclass
from typing import Optional

CONFIG = "BITPUSH_CONFIG"
WORKER_RANK = "BITPUSH_WORKER_RANK"
LOCAL_RANK = "BITPUSH_LOCAL_RANK"
LOCAL_SIZE = "BITPUSH_LOCAL_SIZE"
MODE = "BITPUSH_MODE"
DAEMON_SOCKET = "BITPUSH_DAEMON_SOCKET"
# security.keys_dir / security.key_file (docs/security.md): read by the C++ node
# (config/node_security.cc); the launcher sets KEYS_DIR to keys it makes for a single-host run.
KEYS_DIR = "BITPUSH_KEYS_DIR"
# trace.dir (config/cluster_knobs.cc): `bitpush launch --timeline DIR` sets it for every process
# it starts (docs/observability.md).
TRACE_DIR = "BITPUSH_TRACE_DIR"
KEY_FILE = "BITPUSH_KEY_FILE"
BIN_DIR = "BITPUSH_BIN_DIR"
GPU = "BITPUSH_GPU"
LOG_LEVEL = "BITPUSH_LOG_LEVEL"
ROLE = "BITPUSH_ROLE"
SCHEDULER = "BITPUSH_SCHEDULER"
RANK = "BITPUSH_RANK"
SIZE = "BITPUSH_SIZE"
SLURM_TASKS_PER_NODE = "BITPUSH_SLURM_TASKS_PER_NODE"
RESTART_COUNT = "BITPUSH_RESTART_COUNT"

MODES = ("embedded", "daemon")
LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "off")
DEFAULT_LOG_LEVEL = "warn"


@dataclass
class Bootstrap:
    """What the environment says about this process; None = not set."""
    config: Optional[str] = None
    worker_rank: Optional[int] = None
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    mode: Optional[str] = None
    daemon_socket: Optional[str] = None
    gpu: Optional[int] = None
    log_level: Optional[str] = None


def _int(name: str, minimum: int) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _str(name: str) -> Optional[str]:
    raw = os.environ.get(name)
    return raw if raw else None


def bootstrap() -> Bootstrap:
    """Reads the BITPUSH_* bootstrap variables (ValueError naming a malformed one)."""
    mode = _str(MODE)
    if mode is not None and mode not in MODES:
        raise ValueError(f"{MODE}={mode!r}: must be one of {', '.join(MODES)}")
    log_level = _str(LOG_LEVEL)
    if log_level is not None:
        log_level = normalize_log_level(log_level, LOG_LEVEL)
    return Bootstrap(config=_str(CONFIG), worker_rank=_int(WORKER_RANK, 0),
                     local_rank=_int(LOCAL_RANK, 0), local_size=_int(LOCAL_SIZE, 1),
                     mode=mode, daemon_socket=_str(DAEMON_SOCKET), gpu=_int(GPU, 0),
                     log_level=log_level)


def normalize_log_level(level: str, what: str) -> str:
    """`level` in its canonical spelling ("warning" -> "warn", "err" -> "error"); ValueError
    naming `what` for anything else."""
    value = str(level).strip().lower()
    value = {"warning": "warn", "err": "error", "critical": "error"}.get(value, value)
    if value not in LOG_LEVELS:
        raise ValueError(f"{what}={level!r}: must be one of {', '.join(LOG_LEVELS)}")
    return value


def bin_dir() -> Optional[str]:
    """BITPUSH_BIN_DIR, or None."""
    return _str(BIN_DIR)


def names() -> dict:
    """The variable names, for code that builds an environment for a child process."""
    return {"config": CONFIG, "worker_rank": WORKER_RANK, "local_rank": LOCAL_RANK,
            "local_size": LOCAL_SIZE, "mode": MODE, "daemon_socket": DAEMON_SOCKET,
            "bin_dir": BIN_DIR, "gpu": GPU, "log_level": LOG_LEVEL}


def slurm_environ() -> dict:
    """The variables `bitpush launch --slurm` reads (bitpush/slurm.py), as a dict."""
    extra = (SLURM_TASKS_PER_NODE, "CUDA_VISIBLE_DEVICES", "TMPDIR")
    return {k: v for k, v in os.environ.items() if k.startswith("SLURM") or k in extra}


def restart_count():
    """BITPUSH_RESTART_COUNT (0 when unset); ValueError names a bad value."""
    value = _int(RESTART_COUNT, 0)
    return 0 if value is None else value
