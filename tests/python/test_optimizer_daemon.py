"""CLAN checkpoints in daemon mode: 2 nodes x 2 training processes (bitpush.testing.LocalCluster
with local_size=2: one bitpush-worker daemon per node). The worker error-feedback residual is the
node's (kept by its daemon after the local reduce), read through the local protocol's
LocalErrorFeedback (docs/local-ipc.md, "Error-feedback state"); a restore is applied from local
rank 0."""

import hashlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("torch")
bp = pytest.importorskip("bitpush.torch")
testing = pytest.importorskip("bitpush.testing")


def _ef_round_trip_in_daemon_mode():
    """One training process: the embedded test's w_ef_state_round_trip (train 2*steps in one go;
    train steps, checkpoint, restore mid-run into a fresh CLAN, train steps: bit for bit; the
    same with zeroed residuals: differs), plus a digest of the node's residual afterwards."""
    import _helpers_clan as h
    import bitpush.torch as bpt
    import torch

    torch.set_num_threads(1)
    bpt.init()
    try:
        assert bpt.mode() == "daemon", bpt.mode()
        r = h.w_ef_state_round_trip()
        residual = bpt.error_feedback_state("ef.0.weight")
        r["digest"] = hashlib.sha256(residual.numpy().tobytes()).hexdigest()
        r["node"], r["local_rank"] = bpt.node_rank(), bpt.local_rank()
    finally:
        bpt.shutdown()
    return r


def test_restored_clan_onebit_run_continues_bit_for_bit_in_daemon_mode():
    # error_feedback "worker": the servers keep no residual, so the node's moments and worker
    # residuals are the whole state; min_compress_bytes 64 as in the embedded test.
    with testing.LocalCluster(workers=2, servers=1, compression="onebit",
                              error_feedback="worker", min_compress_bytes=64,
                              local_size=2) as cluster:
        results = cluster.run_workers(_ef_round_trip_in_daemon_mode, timeout=240)
        for w in results:
            assert w.returncode == 0 and w.error is None, (w.worker_rank, w.local_rank,
                                                           w.error, w.output[-4000:])
    values = [w.value for w in results]
    assert len(values) == 4
    for r in values:
        assert r["residual_names"] == ["ef.0.bias", "ef.0.weight", "ef.2.weight"], r
        assert r["numel"] == {"ef.0.bias": 16, "ef.0.weight": 112, "ef.2.weight": 80}, r
        assert all(n > 0 for n in r["nonzero"].values()), r
        assert r["diff_restored"] == 0.0, r  # bit for bit with the uninterrupted run
        assert r["diff_zeroed"] > 0.0, r     # the residual matters
    # Both processes of a node read the node's one residual; the nodes' differ.
    by_node = {}
    for r in values:
        by_node.setdefault(r["node"], set()).add(r["digest"])
    assert all(len(d) == 1 for d in by_node.values()), by_node
    assert by_node[0] != by_node[1], by_node


def _server_optimizer_in_daemon_mode():
    """ServerOptimizer in a daemon-mode process: refused at construction, naming the mode, and
    the C++ declaration refuses it too (a caller going around the Python check)."""
    import bitpush.torch as bpt
    import torch

    torch.set_num_threads(1)
    bpt.init()
    out = {}
    try:
        model = torch.nn.Linear(4, 2)
        try:
            bpt.ServerOptimizer(model.parameters(), rule="sgd", lr=0.1)
        except bpt.BitpushError as e:
            out["python"] = str(e)
        try:
            bpt.declare("so.w", torch.zeros(8), server_optimizer={"rule": "sgd"})
        except bpt.BitpushError as e:
            out["declare"] = str(e)
    finally:
        bpt.shutdown()
    return out


def test_server_optimizer_is_refused_in_daemon_mode():
    with testing.LocalCluster(workers=1, servers=1, local_size=2) as cluster:
        results = cluster.run_workers(_server_optimizer_in_daemon_mode, timeout=120)
    for w in results:
        assert w.returncode == 0 and w.error is None, (w.error, w.output[-3000:])
        assert "needs an embedded worker" in w.value["python"], w.value
        assert "need an embedded worker" in w.value["declare"], w.value
