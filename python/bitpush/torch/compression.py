"""Compressor specs as bitpush.torch names and reports them: ``Compression`` (specs by name,
for users of Horovod's and BytePS's), the check of a spec where it is given, and
``compression_report`` (how the declared tensors travel; printed once by the optimizers).

Stateless but for the session it reads; any thread.
"""
import sys

from .. import _C
from . import session
from .declarations import _BROADCAST_PREFIX
from .errors import BitpushError, _error
from .session import _require, rank


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
    s = session._state
    if s is None or s.log_level in ("error", "off") or rank() != 0:
        return
    print(compression_report(names), file=sys.stderr, flush=True)


def _compressor_method(name):
    """The compressor method ("onebit", "topk", ..., "none") tensor `name` travels with, as the
    engine's rule resolves it (CLAN's spec, else the cluster's compression.spec or a matching
    compression.overrides pattern; "none" below compression.min_compress_bytes)."""
    s = _require()
    with s.lock:
        index = s.declarations[name].index
    spec, _why = s.client.compression_of([index])[0]
    return spec.split(":")[0]
