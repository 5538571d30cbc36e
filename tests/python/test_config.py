"""The cluster YAML as Python sees it: only through the C++ parser (bitpush._C.knobs,
bitpush._C.load_cluster_config; docs/config.md), never by reading the file itself."""
import os

import pytest

from bitpush import _C
from bitpush.torch import optimizer

MINIMAL = ("cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n"
           "  workers: [127.0.0.1:3]\n")


def _write(tmp_path, text, name="cluster.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_knobs_lists_the_table():
    knobs = {k["path"]: k for k in _C.knobs()}
    assert knobs["worker.op_timeout_s"]["default"] == "300"
    assert knobs["worker.op_timeout_s"]["scalar"]
    assert not knobs["cluster.servers"]["scalar"]
    assert knobs["worker.socket"]["env"] == "BITPUSH_DAEMON_SOCKET"
    assert knobs["worker.reduce_threads"]["flag"] == "--reduce-threads"
    assert knobs["server.numa"]["type"] == "`auto` \\| `on` \\| `off`"
    assert all(k["doc"] for k in knobs.values())


def test_load_gives_every_scalar_knob_in_canonical_text(tmp_path):
    path = _write(tmp_path, MINIMAL + "  token: s3cret\ncompression:\n  spec: onebit\n"
                  "  error_feedback: both\nworker:\n  op_timeout_s: 2.50\n  numa: off\n")
    knobs = _C.load_cluster_config(path)["knobs"]
    assert knobs["compression.spec"] == "onebit:scaled=true"
    assert knobs["compression.error_feedback"] == "both"
    assert knobs["worker.op_timeout_s"] == "2.5"
    assert knobs["worker.numa"] == "off"
    assert knobs["server.numa"] == "auto"
    assert "cluster.token" not in knobs  # a secret is never handed out
    scalar = {k["path"] for k in _C.knobs() if k["scalar"]} - {"cluster.token"}
    assert set(knobs) == scalar


def test_error_feedback_comes_from_the_cpp_parser(tmp_path, monkeypatch):
    # Equivalent spellings the parser accepts are read the same way; the value is the parser's.
    monkeypatch.setenv("BITPUSH_CONFIG", _write(
        tmp_path, MINIMAL + "compression: {spec: onebit, error_feedback: worker}\n"))
    assert optimizer.cluster_error_feedback() == "worker"
    monkeypatch.setenv("BITPUSH_CONFIG", _write(tmp_path, MINIMAL, "default.yaml"))
    assert optimizer.cluster_error_feedback() == "none"
    # A file the daemons would refuse is refused here too, naming the file, line and key.
    monkeypatch.setenv("BITPUSH_CONFIG", _write(
        tmp_path, MINIMAL + "server:\n  numa: yes\n", "bad.yaml"))
    with pytest.raises(RuntimeError, match=r"bad\.yaml:6: server\.numa: unknown value 'yes'; "
                                           r"valid: auto, on, off"):
        optimizer.cluster_error_feedback()
    monkeypatch.delenv("BITPUSH_CONFIG")
    assert optimizer.cluster_error_feedback() is None


def test_default_daemon_socket_is_in_the_private_directory(tmp_path, monkeypatch):
    """One rule for the daemon and its clients (C++ computes it; docs/local-ipc.md)."""
    path = _write(tmp_path, MINIMAL)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert _C.load_cluster_config(path)["worker_sockets"] == [
        str(tmp_path / "bitpush" / "worker-0.sock")]
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/bitpush")  # systemd's RuntimeDirectory=
    assert _C.load_cluster_config(path)["worker_sockets"] == ["/run/bitpush/worker-0.sock"]
    monkeypatch.delenv("RUNTIME_DIRECTORY")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert _C.load_cluster_config(path)["worker_sockets"] == [
        "/tmp/bitpush-%d/worker-0.sock" % os.geteuid()]


def test_environment_variables_of_knobs_are_the_ones_the_package_reads():
    # A knob's environment variable is declared in the C++ table; bitpush._env reads it.
    from bitpush import _env
    by_env = {k["env"]: k["path"] for k in _C.knobs() if k["env"]}
    assert by_env == {_env.DAEMON_SOCKET: "worker.socket", _env.KEYS_DIR: "security.keys_dir",
                      _env.KEY_FILE: "security.key_file", _env.TRACE_DIR: "trace.dir"}
