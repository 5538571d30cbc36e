"""bitpush.torch.BinSGDM (paper 004) over real worker and server processes on loopback: every
worker ends with the same parameters bit for bit, every compressed weight moves by exactly
+-lr per step (the servers' re-binarised signs, no scale), a push of d elements is ceil(d/8)
bytes plus the payload header, the worker state (m, b, e) is what checkpoints carry, and a
cluster without worker error feedback is refused by name. The bit-exact comparison with the
single-process reference of Algorithm 1 is tests/unit/compressed_domain_e2e_test.cc."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _helpers_clan as h  # noqa: E402

pytest.importorskip("bitpush.torch")
testing = pytest.importorskip("bitpush.testing")


def test_binsgdm_workers_agree_move_by_lr_and_push_one_bit_per_element():
    steps, lr = 5, 0.01
    with testing.LocalCluster(workers=2, servers=2, compression="none", error_feedback="both",
                              min_compress_bytes=1024, partition_bytes=4096) as cluster:
        out = h.run_workers(cluster, 2, [("w_binsgdm_run", {"steps": steps, "lr": lr})])
    r0, r1 = out[0][0], out[1][0]
    assert r0["w"] == r1["w"] and r0["b"] == r1["b"]
    # x <- x - lr * u with u = +-1: every move is lr up to the rounding of x +- lr.
    assert r0["worst_move_error"] < 1e-6, r0["worst_move_error"]
    # The weight: keys of 1024, 1024 and 952 elements, each a 16-byte header and ceil(d/8)
    # bytes; the bias goes raw (16 + 40 x 4).
    per_step = 3 * 16 + 128 + 128 + 119 + 16 + 160
    assert r0["bytes_pushed"] == steps * per_step, r0["bytes_pushed"]
    assert r0["state_values"] == 3 * 3000  # m, b and e of every element
    assert r0["state_restored"]
    assert r0["bias_state"] == ["b", "m"]  # the raw bias runs SoftSignSGD in Python


def test_binsgdm_needs_worker_error_feedback():
    with testing.LocalCluster(workers=1, servers=1, compression="none",
                              error_feedback="none") as cluster:
        out = h.run_workers(cluster, 1, [("w_binsgdm_refused", {})])
    msg = out[0][0]
    assert msg is not None and "compression.error_feedback: none" in msg, msg
