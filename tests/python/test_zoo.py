"""The model zoo: every compression method, with its recommended optimizer and error-feedback
policy, trains every model of the zoo without diverging, close to its optimizer uncompressed.

Models (data from Debian packages): the digits MLP and a small CNN on scikit-learn's bundled
digits (examples/train_digits.py --model mlp|cnn), and a small character-level transformer on
the Python standard library's sources (examples/train_charlm.py); on request (BITPUSH_ZOO_MODELS
naming "wide") the wide MLP, two 4096-wide hidden layers (17M parameters) at batch 8 per worker,
constant lr, 4 epochs (about 7 minutes a run here). The clusters run compression.partition_bytes
262144, the wide-layer recipe for onebit (docs/training.md, "Wide layers"); every tensor of the
other models is below it, so it changes nothing for them. Methods: the rows of RECIPES,
each against its baseline (its optimizer with compression none). Thresholds: the default
(min_compress_bytes 4096) and every tensor compressed (min_compress_bytes 0; a method's own
minimum tensor size still sends the smallest tensors raw, docs/compressors.md).

Two sizes:
- CI (default): one seed, every tensor compressed, the CNN at the example's default length
  (210 steps), the recipes of CI_RECIPES (SEPARATE, which diverged with every tensor
  compressed; CLAN onebit, the examples' default; AdamW sdp4bit, the compressed-Adam recipe; and
  their baselines: CI runs the Python suites one at a time, so each run here is CI time); every
  run must finish (a NaN fails it with BitpushError, docs/errors.md) with a finite metric within a
  loose bound of its baseline (8 points, 15 %; a diverged run lands near 10 % accuracy): a guard
  against divergence, not the measurement.
- BITPUSH_ZOO=full: three seeds (BITPUSH_ZOO_SEEDS=0,1,... to choose), both thresholds
  (BITPUSH_ZOO_THRESHOLDS=default or all for one), every model (BITPUSH_ZOO_MODELS=mlp,cnn to
  choose) at the examples' default lengths (charlm 300 steps), the issue's bounds (mean accuracy
  within 1.0 point, validation loss within 2 %); BITPUSH_ZOO_RECIPES=LANS,CLAN onebit (labels of
  RECIPES, comma-separated) runs some recipes only. The table it prints is docs/training.md's
  "The model zoo".
"""

import math
import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _helpers_clan as h  # noqa: E402

pytest.importorskip("bitpush.torch")
testing = pytest.importorskip("bitpush.testing")
pytest.importorskip("sklearn")

FULL = os.environ.get("BITPUSH_ZOO") == "full"
SEEDS = tuple(int(x) for x in os.environ.get("BITPUSH_ZOO_SEEDS", "0,1,2").split(",")) \
    if FULL else (0,)
THRESHOLDS = tuple(t for t in (("default", 4096), ("all", 0))
                   if t[0] in os.environ.get("BITPUSH_ZOO_THRESHOLDS", "default,all").split(",")) \
    if FULL else (("all", 0),)
CHARLM_STEPS = 300
CI_RECIPES = ("LANS", "AdamW", "SGD", "CLAN onebit", "AdamW sdp4bit", "SGD separate")
# Allowed shortfall against the baseline: accuracy points (digits), relative validation loss
# (charlm). CI's single short seed only guards against divergence and gross loss.
BOUND = {"acc": 1.0, "loss": 0.02} if FULL else {"acc": 8.0, "loss": 0.15}

# (label, cluster error_feedback, example argv, baseline label). Baselines are the
# optimizers uncompressed (the rows with baseline None); a method's optimizer and policy are
# its recommended ones (docs/training.md).
RECIPES = [
    ("LANS", "none", ["--optimizer", "lans", "--compression", "none"], None),
    ("AdamW", "none", ["--optimizer", "adamw", "--compression", "none"], None),
    ("SGD", "none", ["--optimizer", "sgd", "--compression", "none"], None),
    ("CLAN onebit", "both", ["--optimizer", "clan", "--compression", "onebit"], "LANS"),
    ("CLAN topk:ratio=0.01", "both",
     ["--optimizer", "clan", "--compression", "topk:ratio=0.01"], "LANS"),
    ("CLAN loco", "both", ["--optimizer", "clan", "--compression", "loco"], "LANS"),
    ("CLAN dithering:levels=63", "none",
     ["--optimizer", "clan", "--compression", "dithering:levels=63"], "LANS"),
    ("CLAN sdp4bit", "none", ["--optimizer", "clan", "--compression", "sdp4bit"], "LANS"),
    ("CLAN fp16", "none", ["--optimizer", "clan", "--compression", "fp16"], "LANS"),
    ("BinSGDM", "both", ["--optimizer", "binsgdm"], "AdamW"),
    ("AdamW sdp4bit", "none", ["--optimizer", "adamw", "--compression", "sdp4bit"], "AdamW"),
    ("AdamW onebit", "both", ["--optimizer", "adamw", "--compression", "onebit"], "AdamW"),
    ("SGD separate", "worker", ["--optimizer", "sgd", "--compression", "separate"], "SGD"),
]
MODELS = tuple(os.environ.get("BITPUSH_ZOO_MODELS", "mlp,cnn,charlm").split(",")) if FULL \
    else ("cnn",)
if not FULL:
    RECIPES = [r for r in RECIPES if r[0] in CI_RECIPES]
elif os.environ.get("BITPUSH_ZOO_RECIPES"):
    RECIPES = [r for r in RECIPES if r[0] in os.environ["BITPUSH_ZOO_RECIPES"].split(",")]
# The wide MLP (issue-reported setting: CLAN + onebit trailed LANS there at one scale per 1M
# elements).
WIDE_ARGV = ["--model", "mlp", "--hidden", "4096", "--batch-size", "8", "--lr-schedule",
             "constant", "--epochs", "4"]
# One onebit scale per 65536 elements (docs/training.md, "Wide layers").
PARTITION_BYTES = 262144


def _argv(model, recipe_argv, seed):
    if model == "charlm":
        return recipe_argv + ["--seed", str(seed), "--steps", str(CHARLM_STEPS)]
    if model == "wide":
        return recipe_argv + WIDE_ARGV + ["--seed", str(seed)]
    return recipe_argv + ["--model", model, "--seed", str(seed)]


def _metric(model, summary):
    """(kind, value): accuracy in % for digits, validation loss in nats/byte for charlm."""
    if model == "charlm":
        return "loss", summary["val_loss"]
    return "acc", summary["test_accuracy"]


def _train(threshold_bytes):
    """{(label, model): [summary per seed]} for every recipe at one threshold."""
    results = {}
    for ef in ("none", "both", "worker"):
        runs = [(label, model, seed, _argv(model, argv, seed))
                for label, cfg_ef, argv, _ in RECIPES if cfg_ef == ef
                for model in MODELS for seed in SEEDS]
        if not runs:
            continue  # BITPUSH_ZOO_RECIPES left no recipe with this policy
        digits = [r for r in runs if r[1] != "charlm"]
        lm = [r for r in runs if r[1] == "charlm"]
        with testing.LocalCluster(workers=2, servers=2, compression="onebit", error_feedback=ef,
                                  min_compress_bytes=threshold_bytes,
                                  partition_bytes=PARTITION_BYTES) as cluster:
            out = h.run_workers(cluster, 2, [
                ("w_digits_runs", {"configs": [r[3] for r in digits]}),
                ("w_charlm_runs", {"configs": [r[3] for r in lm]})],
                timeout=(6 * 3600 if "wide" in MODELS else 3600) if FULL else 900)
        for (label, model, _, _), summary in zip(digits + lm, out[0][0] + out[0][1]):
            results.setdefault((label, model), []).append(summary)
    return results


@pytest.mark.parametrize("threshold", [t for t in THRESHOLDS], ids=[t[0] for t in THRESHOLDS])
def test_every_method_trains_every_model(threshold):
    name, threshold_bytes = threshold
    results = _train(threshold_bytes)
    lines = ["| method | baseline | %s |" % " | ".join(MODELS),
             "|---|---|" + "---|" * len(MODELS)]
    misses = []
    for label, _, _, base in RECIPES:
        cells = []
        for model in MODELS:
            runs = results[(label, model)]
            kind, values = None, []
            for s in runs:
                kind, v = _metric(model, s)
                values.append(v)
            assert all(math.isfinite(v) for v in values), (label, model, runs)
            mean = statistics.mean(values)
            cell = ("%.2f" % mean) if kind == "acc" else ("%.4f" % mean)
            if base is not None and (base, model) in results:  # (BITPUSH_ZOO_RECIPES)
                base_mean = statistics.mean(_metric(model, s)[1] for s in results[(base, model)])
                if kind == "acc":
                    delta = mean - base_mean
                    cell += " (%+.2f)" % delta
                    if delta < -BOUND["acc"]:
                        misses.append("%s on %s: %.2f vs %s %.2f" % (label, model, mean, base,
                                                                      base_mean))
                else:
                    rel = mean / base_mean - 1.0
                    cell += " (%+.1f %%)" % (100 * rel)
                    if rel > BOUND["loss"]:
                        misses.append("%s on %s: %.4f vs %s %.4f" % (label, model, mean, base,
                                                                      base_mean))
                assert all(s["bytes_pushed"] < s["bytes_fp32"] for s in runs), (label, model)
            cells.append(cell)
        lines.append("| %s | %s | %s |" % (label, base or "-", " | ".join(cells)))
    print("\nzoo, threshold %s (min_compress_bytes %d), 2 workers, seeds %s, charlm %d steps\n%s"
          % (name, threshold_bytes, ",".join(map(str, SEEDS)), CHARLM_STEPS, "\n".join(lines)))
    assert not misses, misses
