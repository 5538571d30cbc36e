"""Job checkpoints (bitpush.torch.save_checkpoint / load_checkpoint, docs/training.md): a run
of N steps, checkpointed, every process gone, resumed by a new job for M more steps ends with
the parameters of an uninterrupted N + M run, bit for bit (error feedback none, worker and both:
the servers' residuals travel through the checkpoint); a checkpoint of another job is
refused naming the field; the "rank 0 saves, everyone loads" habit with state_dict is refused.

Each case runs two clusters: the first runs the uninterrupted reference and the first N steps
(other tensor names), then saves; its processes and servers exit; a fresh cluster resumes.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch = pytest.importorskip("torch")
testing = pytest.importorskip("bitpush.testing")
import _helpers_clan as h  # noqa: E402

BEFORE, AFTER = 4, 3


def _first(tmp_path, spec, ef):
    path = str(tmp_path / "ckpt" / "job.pt")
    with testing.LocalCluster(workers=2, servers=2, compression=spec, error_feedback=ef,
                              min_compress_bytes=64) as cluster:
        out = h.run_workers(cluster, 2, [("w_checkpoint_first",
                                          {"path": path, "before": BEFORE, "after": AFTER})])
    return path, [r[0] for r in out]


def _resume(path, spec, ef, compression=None):
    with testing.LocalCluster(workers=2, servers=2, compression=spec, error_feedback=ef,
                              min_compress_bytes=64) as cluster:
        out = h.run_workers(cluster, 2, [("w_checkpoint_resume",
                                          {"path": path, "before": BEFORE, "after": AFTER,
                                           "compression": compression})])
    return [r[0] for r in out]


@pytest.mark.parametrize("spec", ["onebit", "topk:ratio=0.25"])
@pytest.mark.parametrize("ef", ["none", "worker", "both"])
def test_resumed_job_is_bit_identical_to_the_uninterrupted_run(tmp_path, spec, ef):
    path, first = _first(tmp_path, spec, ef)
    assert os.path.exists(path) and os.path.exists(path + ".node0") and \
        os.path.exists(path + ".node1")
    assert all(not f["warnings"] for f in first), first
    resumed = _resume(path, spec, ef)
    for rank in range(2):
        assert resumed[rank]["params"] == first[rank]["reference"], (spec, ef, rank)
    if ef == "both":  # the servers' residuals are in the main file
        saved = torch.load(path)["server_residuals"]
        assert set(saved) == {"c.0.weight", "c.0.bias", "c.2.weight"}, saved
        assert all(v.abs().sum() > 0 for v in saved.values()), saved
    # The nodes' residuals differ, and they mattered: rank 1 loading node 0's would diverge.
    if ef in ("worker", "both"):
        n0 = torch.load(path + ".node0")["residuals"]
        n1 = torch.load(path + ".node1")["residuals"]
        assert n0 and set(n0) == set(n1)
        assert any(not torch.equal(n0[k], n1[k]) for k in n0)


def test_a_checkpoint_of_another_job_is_refused_naming_the_field(tmp_path):
    path, _ = _first(tmp_path, "onebit", "worker")
    refused = _resume(path, "onebit", "worker", compression="topk:ratio=0.25")
    for r in refused:
        assert "does not fit this job: the compressor of tensor 'c.0.weight' is " \
               "'onebit:scaled=true' in the checkpoint but 'topk:" in r["refused"], r
    refused = _resume(path, "onebit", "none")
    for r in refused:
        assert "compression.error_feedback is 'worker' in the checkpoint but 'none' here" in \
            r["refused"], r


def test_rank0_state_dict_loaded_everywhere_is_refused_on_the_other_nodes():
    with testing.LocalCluster(workers=2, servers=1, compression="onebit",
                              error_feedback="worker", min_compress_bytes=64) as cluster:
        out = h.run_workers(cluster, 2, [("w_rank0_state_dict_everywhere", {})])
    assert out[0][0] is None, out  # rank 0 loads its own
    assert "holds node 0's worker error-feedback residuals, but this process is on node 1" \
        in out[1][0], out
