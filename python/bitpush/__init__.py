"""bitpush: a parameter-server training system with gradient compression (docs/python.md).

    import bitpush.torch as bp      # the PyTorch API: init, push_pull, broadcast_parameters, ...
    from bitpush.testing import LocalCluster   # a local multi-worker cluster for tests/examples

``bitpush._C`` is the compiled extension (the C++ worker client and the LANS kernel); this
package is the supported API on top of it.
"""
from ._C import BitpushError  # noqa: F401  (a RuntimeError subclass with a .code string)

__version__ = "0.1.0"

__all__ = ["BitpushError", "__version__"]
