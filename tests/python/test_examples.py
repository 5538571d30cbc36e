"""The examples run end to end (own local cluster, 2 workers) for a few steps and write a
sane --json summary."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _helpers_clan as h  # noqa: E402

pytest.importorskip("bitpush.testing")


def _run(script, args, tmp_path):
    out = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BITPUSH_")}
    proc = subprocess.run([sys.executable, os.path.join(h.EXAMPLES, script), "--json",
                           str(out), "--no-progress",
                           # a few steps: no warm-up and decay, so progress shows at once
                           "--lr-schedule", "constant"] + args, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("optimizer,extra", [
    ("clan", ["--compression", "onebit"]),
    ("sgd", []),
])
def test_train_digits(tmp_path, optimizer, extra):
    s = _run("train_digits.py", ["--optimizer", optimizer, "--steps", "15"] + extra, tmp_path)
    assert s["steps"] == 15 and s["workers"] == 2
    assert 0.0 <= s["test_accuracy"] <= 100.0
    assert s["test_accuracy"] > 30.0  # 10 classes: well above chance after 15 steps
    assert s["wall_time_s"] > 0 and s["bytes_pushed"] > 0
    assert s["bytes_fp32"] == 15 * 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)
    if optimizer == "clan":
        assert s["bytes_pushed"] < s["bytes_fp32"]


def test_train_charlm(tmp_path):
    s = _run("train_charlm.py", ["--optimizer", "clan", "--compression", "topk:ratio=0.05",
                                 "--steps", "4", "--val-batches", "2", "--text-bytes",
                                 "200000"], tmp_path)
    assert s["steps"] == 4 and s["workers"] == 2
    assert 0.0 < s["val_loss"] < 8.0  # ln(256) = 5.55 at chance
    assert 0 < s["bytes_pushed"] < s["bytes_fp32"]
