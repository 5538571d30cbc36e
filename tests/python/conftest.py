"""Shared fixtures of the Python tests (tests/python/).

Run through ctest (one entry per file, `python_<file>`, which sets PYTHONPATH=build/python and
BITPUSH_BIN_DIR) or by hand:

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python

Fixtures:
    local_cluster   a factory: local_cluster(workers=2, servers=2, ...) -> a started
                    bitpush.testing.LocalCluster, stopped (and its logs printed on failure)
                    at the end of the test.
    clean_env       removes every BITPUSH_* bootstrap variable for the test (in-process
                    bitpush.torch.init tests), and shuts bitpush.torch down afterwards.
"""
import os

import pytest

try:
    import bitpush  # noqa: F401
    import bitpush.testing
    _IMPORT_ERROR = None
except ImportError as e:  # the extension was not built (or PYTHONPATH is not set)
    _IMPORT_ERROR = e


def pytest_collection_modifyitems(config, items):
    if _IMPORT_ERROR is None:
        return
    if os.environ.get("BITPUSH_BIN_DIR"):
        # Under ctest (python_<file> sets BITPUSH_BIN_DIR) the package was built: failing to
        # import it is an error, never a silent skip.
        pytest.exit("bitpush is not importable from PYTHONPATH=%s: %s"
                    % (os.environ.get("PYTHONPATH", ""), _IMPORT_ERROR), returncode=1)
    skip = pytest.mark.skip(reason="bitpush is not importable (build python/ and set "
                                   "PYTHONPATH=build/python): %s" % _IMPORT_ERROR)
    for item in items:
        item.add_marker(skip)


@pytest.fixture
def local_cluster(request):
    clusters = []

    def make(**kwargs):
        c = bitpush.testing.LocalCluster(**kwargs)
        clusters.append(c)
        return c.start()

    yield make
    failed = getattr(request.node, "rep_call", None)
    for c in clusters:
        if failed is not None and failed.failed:
            print(c.logs_text())
        c.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("BITPUSH_") and k != "BITPUSH_BIN_DIR":
            monkeypatch.delenv(k, raising=False)
    yield
    import bitpush.torch as bp
    bp.shutdown()
