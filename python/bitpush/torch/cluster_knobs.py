"""The cluster YAML's knobs that bitpush.torch's optimizers follow: compression.error_feedback,
compression.spec, compression.non_finite, optimizer.placement (with optimizer.overrides) and optimizer.pull.

They come from the C++ parser (bitpush._C.load_cluster_config, the one reader of the cluster
YAML), applied to the YAML this process was initialised with, else the one BITPUSH_CONFIG names
(the launcher's and LocalCluster's environment; read through bitpush._env, the package's one
reader of environment variables). With neither, every reader returns None.

Stateless; any thread.
"""
import fnmatch
import os

from .. import _C, _env
from .session import config_path

__all__ = ["cluster_error_feedback", "cluster_compression", "cluster_optimizer_placement",
           "cluster_optimizer_pull", "cluster_non_finite", "cluster_partition_bytes"]


def cluster_error_feedback():
    """The cluster's compression.error_feedback ("none", "worker", "server", "both"), or None
    when no cluster config is known (not initialised and BITPUSH_CONFIG unset).

    The value comes from the C++ parser (bitpush._C.load_cluster_config, the one reader of the
    cluster YAML): the config this process was initialised with, else the YAML named by
    BITPUSH_CONFIG (the launcher's and LocalCluster's environment; read through bitpush._env,
    the package's one reader of environment variables). A config the parser refuses raises
    BitpushError naming the file, line and key.
    """
    return _cluster_knob("compression.error_feedback")


def cluster_compression():
    """The cluster's compression.spec (canonical, e.g. "onebit:scaled=true"): what a tensor
    declared without a spec of its own gets (unless a compression.overrides pattern matches its
    name), or None when no cluster config is known. Read like cluster_error_feedback()."""
    return _cluster_knob("compression.spec")


def cluster_non_finite():
    """The cluster's compression.non_finite ("error" or "skip"), or None when no cluster config
    is known (read like cluster_error_feedback())."""
    return _cluster_knob("compression.non_finite")


def cluster_partition_bytes():
    """The cluster's compression.partition_bytes (int): a compressed tensor's partition, and so
    the extent of one onebit scale; None when no cluster config is known."""
    v = _cluster_knob("compression.partition_bytes")
    return None if v is None else int(v)


def cluster_optimizer_placement():
    """The cluster's optimizer.placement ("worker" or "server"), or None when no cluster config
    is known (read like cluster_error_feedback())."""
    return _cluster_knob("optimizer.placement")


def cluster_optimizer_pull():
    """The cluster's optimizer.pull (canonical compressor spec): how a ServerOptimizer built
    without `pull` receives the weights; None when no cluster config is known."""
    return _cluster_knob("optimizer.pull")


def _config_path():
    """The cluster YAML this process runs with: the one init() was given, else the one
    BITPUSH_CONFIG names; None when neither is known."""
    try:
        path = config_path()
    except Exception:  # not initialised
        path = None
    if not path:
        path = _env.bootstrap().config
    return path


def _cluster_knob(key):
    path = _config_path()
    if not path or not os.path.exists(path):
        return None
    return _C.load_cluster_config(path)["knobs"][key]


def _cluster_placements():
    """(placement, [(pattern, placement), ...]) of the cluster's YAML, or (None, [])."""
    placement = _cluster_knob("optimizer.placement")
    if placement is None:
        return None, []
    overrides = _C.load_cluster_config(_config_path())["optimizer_overrides"]
    return placement, [tuple(o) for o in overrides]


def placement_of(name, placement, overrides):
    """The placement of parameter `name`: the first override whose pattern matches it (fnmatch,
    as the C++ side matches compression.overrides), else `placement`."""
    for pattern, where in overrides:
        if fnmatch.fnmatchcase(name, pattern):
            return where
    return placement
