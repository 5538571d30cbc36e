"""CLAN / LANS / DistributedOptimizer against references written with plain torch ops
(tests/python/_helpers_clan.py), on real loopback clusters (bitpush.testing.LocalCluster)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _helpers_clan as h  # noqa: E402

bp = pytest.importorskip("bitpush.torch")
testing = pytest.importorskip("bitpush.testing")

TOL = 1e-6


def test_reference_lans_zero_bias_moves_with_fallback():
    # The reference itself: a zero-initialised block moves (trust ratio 0 -> 1) with the
    # fallback and stays put without it.
    for fallback, moves in ((True, True), (False, False)):
        x, m, v = torch.zeros(4), torch.zeros(4), torch.zeros(4)
        h.reference_lans_step(x, m, v, torch.ones(4), 1, 0.1, trust_ratio_fallback=fallback)
        assert bool(x.abs().sum() > 0) == moves


def test_clan_none_one_worker_equals_reference_lans():
    with testing.LocalCluster(workers=1, servers=1, compression="none",
                              error_feedback="none") as cluster:
        (r,), = h.run_workers(cluster, 1, [("w_clan_vs_reference", {"steps": 20})])
    assert r["step"] == 20
    assert r["max_abs_diff"] <= TOL, r


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
def test_clan_on_cuda_parameters_equals_reference_lans_on_the_gpu():
    # Parameters on the GPU: push_pull of CUDA gradients (embedded mode: through host copies)
    # and the update by LansStepCuda, against the torch-ops reference on the same GPU.
    with testing.LocalCluster(workers=2, servers=1, compression="none",
                              error_feedback="none") as cluster:
        results = h.run_workers(cluster, 2, [("w_clan_vs_reference",
                                              {"steps": 20, "device": "cuda"})])
    for rank, (r,) in enumerate(results):
        assert r["step"] == 20, (rank, r)
        assert r["max_abs_diff"] <= TOL, (rank, r)


def test_two_workers():
    """One 2-worker cluster runs: CLAN vs the reference on the averaged gradient (default
    names), the same with backward_passes_per_step=2, DistributedOptimizer(SGD) vs SGD on the
    averaged gradient (with synchronize + skip_synchronize), the same with two backward
    passes per step, and the state_dict round trip."""
    jobs = [("w_clan_vs_reference", {"steps": 20}),
            ("w_clan_vs_reference", {"steps": 8, "passes": 2, "prefix": "bpps2."}),
            ("w_distributed_sgd", {"steps": 10}),
            ("w_distributed_sgd", {"steps": 6, "passes": 2, "prefix": "dsgd2."}),
            ("w_state_dict_round_trip", {})]
    with testing.LocalCluster(workers=2, servers=2, compression="none",
                              error_feedback="none") as cluster:
        results = h.run_workers(cluster, 2, jobs)
    for rank, (clan, clan2, sgd, sgd2, rt) in enumerate(results):
        assert clan["max_abs_diff"] <= TOL, (rank, clan)
        assert clan2["max_abs_diff"] <= TOL, (rank, clan2)
        assert clan2["step"] == 8
        assert sgd["is_sgd"] and sgd["skip_synchronize_used"]
        assert sgd["max_abs_diff"] <= TOL, (rank, sgd)
        assert sgd2["max_abs_diff"] <= TOL, (rank, sgd2)
        assert rt["max_abs_diff"] == 0.0, (rank, rt)
        assert rt["step"] == 12 and rt["has_moments"]
        assert rt["bitpush"]["compression"] == "none"


def test_state_dict_carries_the_worker_error_feedback_residuals():
    # error_feedback "worker": the servers keep no residual, so a checkpoint of the worker's
    # moments and residuals resumes bit for bit; min_compress_bytes 64 compresses the tensors
    # of at least 64 bytes (7x16, 16x5 and the 16-element bias), not the 5x3 one or the
    # smaller biases.
    with testing.LocalCluster(workers=1, servers=1, compression="onebit",
                              error_feedback="worker", min_compress_bytes=64) as cluster:
        (r,), = h.run_workers(cluster, 1, [("w_ef_state_round_trip", {})])
    assert r["residual_names"] == ["ef.0.bias", "ef.0.weight", "ef.2.weight"], r
    assert r["numel"] == {"ef.0.bias": 16, "ef.0.weight": 112, "ef.2.weight": 80}, r
    assert all(n > 0 for n in r["nonzero"].values()), r
    assert r["diff_restored"] == 0.0, r
    assert r["diff_zeroed"] > 0.0, r


def _yaml(tmp_path, ef):
    path = tmp_path / ("ef-%s.yaml" % ef)
    path.write_text("cluster:\n  scheduler: 127.0.0.1:1\n  servers: [127.0.0.1:2]\n"
                    "  workers: [127.0.0.1:3]\ncompression:\n  spec: onebit\n"
                    "  error_feedback: %s\n" % ef)
    return str(path)


def test_error_feedback_mismatch_names_the_yaml_key(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    monkeypatch.setenv("BITPUSH_CONFIG", _yaml(tmp_path, "none"))
    with pytest.raises(ValueError, match=r"compression\.error_feedback: both"):
        bp.CLAN(model.parameters(), compression="onebit", error_feedback=True)
    # uncompressed works with any setting
    bp.CLAN(model.parameters(), compression="none", error_feedback=True).remove_hooks()
    bp.LANS(model.parameters()).remove_hooks()
    monkeypatch.setenv("BITPUSH_CONFIG", _yaml(tmp_path, "both"))
    with pytest.raises(ValueError, match=r"compression\.error_feedback: none"):
        bp.CLAN(model.parameters(), compression="dithering:levels=63", error_feedback=False)
    bp.CLAN(model.parameters(), compression="onebit", error_feedback=True).remove_hooks()


def test_the_yaml_is_the_one_source_of_compression_defaults(tmp_path, monkeypatch):
    # CLAN's error feedback follows the cluster's compression.error_feedback when not given
    # (it was True, so a YAML saying none refused a CLAN built with no arguments).
    model = torch.nn.Linear(3, 2)
    monkeypatch.setenv("BITPUSH_CONFIG", _yaml(tmp_path, "none"))
    opt = bp.CLAN(model.parameters())
    assert opt.compression is None and opt.error_feedback is False
    opt.remove_hooks()
    monkeypatch.setenv("BITPUSH_CONFIG", _yaml(tmp_path, "both"))
    opt = bp.CLAN(model.parameters())
    assert opt.error_feedback is True
    opt.remove_hooks()
    assert bp.PushPullHookState().compression is None


def test_every_api_compresses_with_the_yaml_spec_when_given_none():
    # One cluster whose YAML says onebit with worker error feedback; 64-byte threshold: the
    # 7x16, 16x5 weights and the 16-element bias are compressed, the 5x3 weight and the
    # 5- and 3-element biases are not. CLAN, DistributedOptimizer (it defaulted to "none")
    # and push_pull all follow it.
    with testing.LocalCluster(workers=1, servers=1, compression="onebit",
                              error_feedback="worker", min_compress_bytes=64) as cluster:
        (r,), = h.run_workers(cluster, 1, [("w_default_compression", {})])
    line = ("compression: onebit:scaled=true on 3 of 6 tensors (832 B of 924 B, 90.0%); raw: "
            "3 tensors (92 B) below compression.min_compress_bytes=64; error_feedback: worker")
    assert r["clan"] == line, r
    assert r["dsgd"] == line, r
    assert r["clan_error_feedback"] is True, r
    assert r["dsgd_bytes"] == r["clan_bytes"] < 924, r
    assert r["push_pull"].startswith("compression: onebit:scaled=true on 1 of 1 tensor "), r


def test_a_mistyped_spec_is_refused_where_it_is_given():
    # Before the first step: no cluster runs here, so a check deferred to the first
    # push_pull would not fire at all.
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"^CLAN: compression 'onebt': unknown compressor "
                                         r"'onebt'; valid compressors: none, fp16"):
        bp.CLAN(model.parameters(), compression="onebt")
    with pytest.raises(ValueError, match=r"^CLAN: compression 'topk:ratio=2': .*out of range"):
        bp.CLAN(model.parameters(), compression="topk:ratio=2")
    with pytest.raises(ValueError, match=r"^DistributedOptimizer: compression "
                                         r"'onebit:scaled=maybe': .*'maybe'"):
        bp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters(),
                                compression="onebit:scaled=maybe")
    with pytest.raises(ValueError, match=r"^PushPullHookState: compression 'fp61'"):
        bp.PushPullHookState(compression="fp61")
    # Valid specs, in any spelling the registry accepts, still construct.
    bp.CLAN(model.parameters(), compression="topk:ratio=0.01").remove_hooks()
    assert bp.PushPullHookState(compression="fp16").compression == "fp16"


def test_unsupported_parameters_are_refused():
    w = torch.nn.Parameter(torch.randn(4, 3).t())  # non-contiguous
    with pytest.raises(ValueError, match="not contiguous"):
        bp.CLAN([w], compression="none")
    with pytest.raises(TypeError, match="fp32"):
        bp.CLAN([torch.nn.Parameter(torch.randn(3).half())], compression="none")
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        bp.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.randn(2))], lr=0.1),
                                backward_passes_per_step=0)
    with pytest.raises(ValueError, match="eps"):
        bp.CLAN([torch.nn.Parameter(torch.randn(3))], eps=0.0, compression="none")


def test_ddp_comm_hook_averages_over_bitpush():
    with testing.LocalCluster(workers=2, servers=1, compression="none",
                              error_feedback="none") as cluster:
        results = h.run_workers(cluster, 2, [("w_ddp_hook", {"port": testing.free_ports(1)[0]})])
    for rank, (r,) in enumerate(results):
        assert r["max_abs_diff"] <= TOL, (rank, r)
        assert r["bytes_pushed"] > 0, r


def _kill_server(cluster, index):
    """Kills server `index` of the LocalCluster with SIGKILL; returns its name as messages
    write it."""
    fn = getattr(cluster, "kill_server", None)
    if fn is not None:
        fn(index)
    else:
        procs = getattr(cluster, "servers", None) or getattr(cluster, "server_procs")
        procs[index].kill()
    return "server %d" % index


def test_killed_server_fails_clan_step_naming_it(tmp_path):
    import time

    hb_ms, timeout_ms = 200, 1000
    with testing.LocalCluster(workers=2, servers=2, compression="none", error_feedback="none",
                              heartbeat_interval_ms=hb_ms,
                              heartbeat_timeout_ms=timeout_ms) as cluster:
        ready = tmp_path / "ready"
        with h.start_workers(cluster, 2, [("w_train_until_error",
                                           {"ready_file": str(ready), "seconds": 60})]) as workers:
            deadline = time.time() + 60
            while not ready.exists():
                assert time.time() < deadline, "workers never trained 5 steps"
                time.sleep(0.02)
            name = _kill_server(cluster, 1)
            t_kill = time.time()
            results = workers.wait(timeout=90)
    for rank, (r,) in enumerate(results):
        assert r["error"] is not None, (rank, r)
        assert r["type"] == "BitpushError", r
        assert name in r["error"], r
        # the heartbeat bound: the scheduler's verdict after heartbeat_timeout, plus slack for
        # 2 shared cores
        assert r["t_error"] - t_kill < timeout_ms / 1000.0 + 4.0, r
