"""bitpush.torch.ServerOptimizer (docs/optimizer.md, "Server-side optimizer"): the servers run
SGD / AdamW / LANS on the averaged gradient and the workers' parameters follow torch's (or the
reference LANS's) result with an lr schedule, every rank starts from rank 0's values and keeps
no optimizer state; a job killed after a checkpoint and resumed in a new cluster continues bit
for bit with TLq-HS pushes and qWD pulls; DistributedOptimizer switches to it under
optimizer.placement: server.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch = pytest.importorskip("torch")
testing = pytest.importorskip("bitpush.testing")
import _helpers_clan as h  # noqa: E402


def _cluster(**kw):
    return testing.LocalCluster(workers=2, servers=2, min_compress_bytes=64,
                                extra={"optimizer": {"placement": "server"}}, **kw)


def test_server_side_sgd_adamw_lans_follow_the_one_process_optimizer():
    with _cluster() as cluster:
        out = h.run_workers(cluster, 2, [("w_server_vs_torch", {"rule": r})
                                         for r in ("sgd", "adamw", "lans")])
    for rank in range(2):
        for r in out[rank]:
            # fp32 on both sides, torch's kernels vs the servers' (different operation order):
            # within a few ulps of the weights after 8 steps.
            assert r["max_abs_diff"] < 2e-6, r["max_abs_diff"]
            assert r["started_equal"], "rank %d did not start from rank 0's weights" % rank
            assert r["worker_state"] == 0
            assert r["lr"] == pytest.approx(0.05 * 0.25)
    for a, b in zip(out[0], out[1]):
        assert a["params"] == b["params"]  # every replica bit-identical


def test_killed_job_resumes_bit_for_bit_with_tlq_pushes_and_qwd_pulls(tmp_path):
    path = str(tmp_path / "ckpt" / "job.pt")
    kw = {"path": path, "before": 4, "after": 3}
    with _cluster(compression="sdp4bit") as cluster:
        first = h.run_workers(cluster, 2, [("w_server_checkpoint", dict(kw, resume=False))])
    saved = torch.load(path)
    assert set(saved["optimizer"]["bitpush_server_state"]) == \
        {"sc.0.weight", "sc.0.bias", "sc.2.weight", "sc.2.bias", "sc.4.weight", "sc.4.bias"}
    with _cluster(compression="sdp4bit") as cluster:
        resumed = h.run_workers(cluster, 2, [("w_server_checkpoint", dict(kw, resume=True))])
    for rank in range(2):
        assert resumed[rank][0]["at_save"] == first[rank][0]["at_save"]
        assert resumed[rank][0]["params"] == first[rank][0]["params"], rank
    assert first[0][0]["params"] == first[1][0]["params"]


def test_distributed_optimizer_moves_to_the_servers_under_placement_server():
    with _cluster() as cluster:
        out = h.run_workers(cluster, 2, [("w_distributed_placement", {})])
    for r in (out[0][0], out[1][0]):
        assert r["type"] == "ServerOptimizer" and r["rule"] == "sgd"
        assert r["worker_state"] == 0
        assert "RMSprop has no server rule" in r["refused"]
    assert out[0][0]["params"] == out[1][0]["params"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the CUDA parameters "
                    "of ServerOptimizer are staged through host memory; this checks that path)")
def test_cuda_parameters_follow_torch_sgd():
    with _cluster() as cluster:
        out = h.run_workers(cluster, 2, [("w_server_cuda", {})])
    for rank in range(2):
        assert out[rank][0]["max_abs_diff"] < 2e-6, out[rank][0]
        assert out[rank][0]["worker_state"] == 0


@pytest.mark.parametrize("kind", ["server", "clan", "clan-idle"])
def test_a_server_restarted_alone_rejoins_and_the_job_continues_from_its_checkpoint(tmp_path,
                                                                                     kind):
    """cluster.server_rejoin_timeout_s: server 1 is killed mid-run and a new process of it
    started; every worker's failed step raises Unavailable naming it, the workers wait for it
    to rejoin, restore the last checkpoint and finish: the same parameters, bit for bit, as a
    run without the failure. "server": ServerOptimizer (the servers' weights and moments come
    back from the checkpoint); "clan": CLAN with onebit and error feedback on both sides (the
    workers' and the servers' residuals come back); "clan-idle": the same, with worker 1
    pushing nothing until the server rejoined — its next step still fails with Unavailable
    (the job rolled back), so it restores the checkpoint with worker 0 instead of going on
    alone."""
    import time as _time

    idle = kind == "clan-idle"
    kind = "clan" if idle else kind
    extra = {"cluster": {"server_rejoin_timeout_s": 30}}
    if kind == "server":
        extra["optimizer"] = {"placement": "server"}
    spec, ef = ("onebit", "both") if kind == "clan" else ("none", "none")
    flags = tmp_path / "flags"
    flags.mkdir()
    with testing.LocalCluster(workers=2, servers=2, min_compress_bytes=64, compression=spec,
                              error_feedback=ef, extra=extra) as cluster:
        reference = h.run_workers(cluster, 2, [("w_server_rejoin",
                                                {"path": str(tmp_path / "ref.pt"),
                                                 "flag_dir": str(flags), "kind": kind})])
    with testing.LocalCluster(workers=2, servers=2, min_compress_bytes=64, compression=spec,
                              error_feedback=ef, extra=extra) as cluster:
        workers = h.start_workers(cluster, 2, [("w_server_rejoin",
                                                {"path": str(tmp_path / "job.pt"),
                                                 "flag_dir": str(flags), "fail_at": 5,
                                                 "kind": kind, "idle": idle})])
        deadline = _time.time() + 60
        while not (flags / "kill").exists():
            assert _time.time() < deadline, "the workers never asked for the kill"
            _time.sleep(0.02)
        cluster.kill_server(1)
        (flags / "killed").touch()
        cluster.restart_server(1)
        if idle:
            log = os.path.join(cluster.dir, "server1.restart1.log")
            while "rejoined" not in (open(log).read() if os.path.exists(log) else ""):
                assert _time.time() < deadline + 60, "server 1 never rejoined"
                _time.sleep(0.02)
            (flags / "rejoined").touch()
        out = workers.wait(240)
    for rank in range(2):
        r = out[rank][0]
        assert r["recovered"] == 1, r
        # The scheduler's verdict, or a push that met the dropped connection first.
        assert "server 1" in r["errors"][0], r
        assert r["params"] == reference[rank][0]["params"], rank


def test_optimizer_overrides_keep_some_parameters_on_the_workers():
    """optimizer.overrides: the biases stay on the workers (their SGD momentum lives there), the
    weights go to the servers; every parameter follows torch SGD on the averaged gradient with
    an lr schedule."""
    extra = {"optimizer": {"placement": "server",
                           "overrides": [{"pattern": "*.bias", "placement": "worker"}]}}
    with testing.LocalCluster(workers=2, servers=2, min_compress_bytes=64,
                              extra=extra) as cluster:
        out = h.run_workers(cluster, 2, [("w_distributed_mixed", {})])
    for r in (out[0][0], out[1][0]):
        assert r["type"] == "ServerOptimizer", r
        assert r["max_abs_diff"] < 2e-6, r
        assert sorted(r["local_state"]) == ["mx.0.bias", "mx.2.bias", "mx.4.bias"], r
        assert r["worker_state"] == 0, r
