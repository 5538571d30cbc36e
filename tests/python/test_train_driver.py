"""bench/train_driver.py: a layout's training step under DDP and bitpush, on loopback.

A three-layer layout with a few KiB of tensors keeps every run to a few seconds. Checks the
result's fields and the exact byte arithmetic, that bitpush's averaged gradients equal the
single-process reference bit for bit (and that the comparison catches a difference), and
that a layout naming a tensor it does not list is refused with that name.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(REPO, "bench", "train_driver.py")

torch = pytest.importorskip("torch", reason="bench/train_driver.py needs torch")


def load_driver():
    spec = importlib.util.spec_from_file_location("train_driver", DRIVER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Backward order: the head first.
LAYERS = [
    ("head", 2.0, [("head.weight", [10, 32]), ("head.bias", [10])]),
    ("fc", 3.0, [("fc.weight", [32, 64]), ("fc.bias", [32])]),
    ("embed", 1.0, [("embed.weight", [100, 64])]),
]


def write_layout(path, layers=LAYERS):
    tensors = [{"name": n, "shape": s, "dtype": "float32"} for _, _, t in layers for n, s in t]
    doc = {"model": "tiny", "tensors": tensors,
           "layers": [{"name": name, "backward_ms": ms, "tensors": [n for n, _ in t]}
                      for name, ms, t in layers]}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def model_bytes():
    total = 0
    for _, _, t in LAYERS:
        for _, s in t:
            n = 1
            for d in s:
                n *= d
            total += 4 * n
    return total


def run(args, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, DRIVER] + args, capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p


def test_ddp_step_fields_and_ring_bytes(tmp_path):
    dist = pytest.importorskip("torch.distributed", reason="this torch has no torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    layout = write_layout(str(tmp_path / "tiny.json"))
    p = run(["--layout", layout, "--system", "ddp", "--steps", "3", "--warmup", "1",
             "--local", "2", "--master-port", "29447"])
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout)
    assert r["peer"] == "ddp" and r["backend"] == "gloo" and r["variant"] == "fp32"
    assert r["workers"] == 2 and r["tensors"] == 5 and r["model_bytes"] == model_bytes()
    assert r["compute_ms"] == pytest.approx(6.0)
    # A ring all-reduce at W = 2: each rank sends and receives half the payload twice.
    assert r["bytes_per_worker"] == 2 * model_bytes()
    assert len(r["step_ms_all"]) == 3
    assert r["comm_exposed_ms"] == pytest.approx(r["step_ms"] - r["local_ms"])


def test_bitpush_none_equals_the_reference_bit_for_bit(tmp_path):
    layout = write_layout(str(tmp_path / "tiny.json"))
    p = run(["--layout", layout, "--system", "bitpush", "--compression", "none",
             "--steps", "2", "--warmup", "1", "--check-result", "--local", "2",
             "--servers", "2"])
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout)
    assert r["peer"] == "bitpush" and r["compression"] == "none" and r["workers"] == 2
    # none moves each tensor's fp32 bytes once each way per step (plus payload headers).
    assert r["bytes_per_worker"] >= 2 * model_bytes()
    assert r["bytes_per_worker"] < 2 * model_bytes() * 1.05


def test_the_reference_check_names_the_tensor_that_differs():
    d = load_driver()
    layers = [(name, 0.0, [(n, tuple(s)) for n, s in t]) for name, _, t in LAYERS]
    model, _ = d.build_model(torch, layers, 0, 1.0)
    for layer in model.layers:
        for name, p in zip(layer.names, layer.params):
            ref = d.rank_gradient(torch, 0, name, p.shape).clone()
            ref += d.rank_gradient(torch, 1, name, p.shape)
            ref *= 0.5
            p.grad = ref
    d.check_average(torch, model, 2)  # the exact reference passes
    model.layers[1].params[0].grad.view(-1)[3] += 1e-6
    with pytest.raises(SystemExit, match="fc.weight"):
        d.check_average(torch, model, 2)


def test_a_layer_naming_an_unknown_tensor_is_refused(tmp_path):
    d = load_driver()
    bad = [("head", 1.0, [("head.weight", [2, 2])])]
    path = write_layout(str(tmp_path / "bad.json"), bad)
    with open(path) as f:
        doc = json.load(f)
    doc["layers"][0]["tensors"].append("head.gone")
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(ValueError, match="head.gone"):
        d.load_layout(path)


def test_a_compute_profile_replaces_every_layers_time_and_must_name_each(tmp_path):
    d = load_driver()
    layers = [(name, ms, [(n, tuple(s)) for n, s in t]) for name, ms, t in LAYERS]
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps({"head": 0.5, "fc": 7, "embed": 0}))
    out = d.apply_profile(str(prof), layers)
    assert [(n, ms) for n, ms, _ in out] == [("head", 0.5), ("fc", 7.0), ("embed", 0.0)]
    assert [t for _, _, t in out] == [t for _, _, t in layers]
    # Another layout's per-layer times serve as a profile too.
    other = write_layout(str(tmp_path / "other.json"),
                         [(name, 2 * ms, t) for name, ms, t in LAYERS])
    assert [ms for _, ms, _ in d.apply_profile(other, layers)] == [4.0, 6.0, 2.0]
    prof.write_text(json.dumps({"head": 0.5, "fc": 7}))
    with pytest.raises(ValueError, match="no time for embed"):
        d.apply_profile(str(prof), layers)
    prof.write_text(json.dumps({"head": 0.5, "fc": 7, "embed": 1, "decoder": 2}))
    with pytest.raises(ValueError, match="unknown layers decoder"):
        d.apply_profile(str(prof), layers)
    prof.write_text(json.dumps({"head": -1, "fc": 7, "embed": 1}))
    with pytest.raises(ValueError, match="'head'"):
        d.apply_profile(str(prof), layers)


def test_bitpush_bench_train_runs_both_systems_and_compares_them(tmp_path):
    """`bitpush-bench train` (bench/train_bench.py): bitpush and DDP (fp32 and the PowerSGD
    hook) alternating on one layout; each bitpush record's ratios are DDP's steps over its
    own."""
    dist = pytest.importorskip("torch.distributed", reason="this torch has no torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    bin_dir = os.environ.get("BITPUSH_BIN_DIR", os.path.join(REPO, "build", "bin"))
    bench = os.path.join(bin_dir, "bitpush-bench")
    if not os.access(bench, os.X_OK):
        pytest.skip("no bitpush-bench in %s (build it, or set BITPUSH_BIN_DIR)" % bin_dir)
    layout = write_layout(str(tmp_path / "tiny.json"))
    p = subprocess.run([bench, "train", "--layout", layout, "--workers", "2", "--servers", "1",
                        "--compressors", "none", "--peer", "ddp", "--peer-variant",
                        "fp32,powersgd", "--steps", "2", "--warmup", "2", "--repeats", "2",
                        "--compute-scale", "0.5", "--master-port", "29461", "--json"],
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(p.stdout)
    assert [(r["peer"], r.get("compression") or r.get("variant")) for r in rows] == \
        [("bitpush", "none"), ("ddp", "fp32"), ("ddp", "powersgd")]
    bp, fp32, psgd = rows
    assert psgd["hook"] == "powerSGD_hook" and fp32["hook"] == ""
    for r in rows:
        assert r["repeats"] == 2 and len(r["step_ms_reps"]) == 2
        assert r["step_ms"] == pytest.approx(sorted(r["step_ms_reps"])[1], abs=1e-3)
        assert r["compute_ms"] == pytest.approx(3.0) and r["link"] == "loopback"
    assert bp["servers"] == 1 and bp["bytes_per_worker"] >= 2 * model_bytes()
    assert bp["ratio_to_ddp"] == bp["ratio_to_ddp_fp32"] == fp32["step_ms"] / bp["step_ms"]
    assert bp["ratio_to_ddp_powersgd"] == psgd["step_ms"] / bp["step_ms"]
    # Refused before anything runs: an unknown layout, named.
    p = subprocess.run([bench, "train", "--layout", "no-such-model"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "no layout 'no-such-model'" in p.stderr
