"""How bitpush.torch reports a failure: ``BitpushError`` (the extension's RuntimeError
subclass) with its ``.code`` string, one of the C++ Status codes (docs/errors.md, "Python").

Stateless; any thread.
"""
from .._C import BitpushError

__all__ = ["BitpushError"]


def _error(code, message):
    e = BitpushError(message)
    e.code = code
    return e
