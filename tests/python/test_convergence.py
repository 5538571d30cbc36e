"""Convergence of CLAN on the digits example (2 workers on loopback, 3 seeds): compressed
CLAN reaches the test accuracy of uncompressed LANS within a few points (paper 001 Section 5's
claim, in miniature), LoCo and SDP4Bit within half a point, and the optimizer on the servers
(LANS within 0.2 point of LANS on the workers; SDP4Bit's TLq-HS pushes with qWD pulls within
half a point); BinSGDM (one-bit pushes and pulls) and SEPARATE (CR 16, the stable error
feedback) within a point of their optimizer uncompressed (AdamW; SGD with momentum). Prints the
accuracy table (docs/training.md has the measured one)."""

import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _helpers_clan as h  # noqa: E402

pytest.importorskip("bitpush.torch")
testing = pytest.importorskip("bitpush.testing")

SEEDS = (0, 1, 2)
# 40 epochs with the example's defaults (lr 0.01, 5 % linear warm-up then cosine decay to 0,
# batch 32 per worker): where the biased compressors with error feedback catch up with LANS
# (docs/training.md has the measurements: at 25 epochs and a constant lr they did not).
EPOCHS = int(os.environ.get("BITPUSH_CONVERGENCE_EPOCHS", "40"))
# Small enough that the MLP's weight matrices (8 KiB .. 64 KiB) are compressed; the biases
# (<= 512 bytes) go uncompressed.
MIN_COMPRESS_BYTES = 2048

# (label, cluster error_feedback, example argv, allowed accuracy drop in points vs the
# baseline row: LANS unless a fifth entry names another)
CONFIGS = [
    ("LANS (none)", "both", ["--optimizer", "lans"], None),
    ("CLAN onebit+EF", "both", ["--optimizer", "clan", "--compression", "onebit"], 1.0),
    ("CLAN topk:ratio=0.01+EF", "both",
     ["--optimizer", "clan", "--compression", "topk:ratio=0.01"], 1.5),
    ("CLAN dithering:levels=63 (no EF)", "none",
     ["--optimizer", "clan", "--compression", "dithering:levels=63", "--no-error-feedback"],
     2.0),
    # LoCo and SDP4Bit (papers 000 and 002): within 0.5 point of LANS. LoCo keeps its error on
    # workers and servers (two-hop); scale 2^12 fits the MLP's gradients (2^19, the paper's
    # fine-tuning value, saturates 84 % of them; docs/compressors.md). SDP4Bit runs without
    # error feedback.
    ("CLAN loco:scale=4096", "both",
     ["--optimizer", "clan", "--compression", "loco:scale=4096"], 0.5),
    # SDP4Bit's stochastic rounding (push and 4-bit pull) makes its figure move by about
    # +-0.3 point with the random streams, which follow the keys, which follow how many runs
    # this process made before (docs/training.md): its guard here is 1.0 point.
    ("CLAN sdp4bit (TLq-HS)", "none", ["--optimizer", "clan", "--compression", "sdp4bit"], 1.0),
    # The optimizer on the servers (bitpush.torch.ServerOptimizer): LANS there equals LANS on
    # the workers within 0.2 point; SDP4Bit's whole scheme — TLq-HS pushes, qWD pulls of the
    # weight differences — within 0.5 point of uncompressed LANS.
    ("LANS on the servers", "both", ["--optimizer", "lans", "--server-side"], 0.2),
    ("SDP4Bit on the servers (TLq-HS + qWD)", "none",
     ["--optimizer", "clan", "--compression", "sdp4bit", "--server-side"], 0.5),
    # Papers 003 and 004, against uncompressed AdamW (both compressed-domain methods: the
    # servers sum projections / count sign bits). BinSGDM runs paper 004's Algorithm 1 (worker
    # and server errors: both); SEPARATE keeps its error on the workers.
    ("AdamW (none)", "none", ["--optimizer", "adamw", "--compression", "none"], None),
    ("BinSGDM", "both", ["--optimizer", "binsgdm"], 1.0, "AdamW (none)"),
    # SEPARATE against its optimizer uncompressed, at the same hyper-parameters (the paper
    # re-tunes nothing): SGD with momentum 0.9, lr 0.05. Under AdamW the projection noise also
    # enters the second moment and costs more (the contrast rows below; docs/training.md).
    ("SGD (none)", "none", ["--optimizer", "sgd", "--compression", "none"], None),
    ("SGD separate (CR 16, stable EF)", "worker",
     ["--optimizer", "sgd", "--compression", "separate"], 1.0, "SGD (none)"),
]
# The contrast row of docs/training.md (LoCo's 4 bits without its compensation; no bound):
# BITPUSH_CONVERGENCE_CONTRAST=1 adds it (three more runs, kept out of CI's time).
if os.environ.get("BITPUSH_CONVERGENCE_CONTRAST") == "1":
    CONFIGS.append(("CLAN loco:scale=4096 without compensation", "none",
                    ["--optimizer", "clan", "--compression", "loco:scale=4096",
                     "--no-error-feedback"], None))
    # SEPARATE's error feedback as paper 003 prints it (e <- (1 - beta) e + beta r): mean-square
    # unstable at CR 16 and beta 0.95 (docs/separate.md).
    CONFIGS.append(("SGD separate (CR 16, printed EF)", "worker",
                    ["--optimizer", "sgd", "--compression", "separate:ema=printed"], None,
                    "SGD (none)"))
    CONFIGS.append(("AdamW separate (CR 16, stable EF)", "worker",
                    ["--optimizer", "adamw", "--compression", "separate"], None, "AdamW (none)"))


def _runs(ef):
    runs = []
    for label, cfg_ef, argv, *_ in CONFIGS:
        if cfg_ef != ef:
            continue
        for seed in SEEDS:
            runs.append((label, seed, argv + ["--seed", str(seed), "--epochs", str(EPOCHS)]))
    return runs


def test_clan_digits_accuracy_close_to_lans():
    results = {}
    for ef in ("both", "none", "worker"):
        runs = _runs(ef)
        # One cluster per error-feedback setting (a cluster-wide key); every run of it in one
        # process per worker, tensors named per run.
        with testing.LocalCluster(workers=2, servers=2, compression="onebit", error_feedback=ef,
                                  min_compress_bytes=MIN_COMPRESS_BYTES) as cluster:
            out = h.run_workers(cluster, 2, [("w_digits_runs",
                                              {"configs": [argv for _, _, argv in runs]})],
                                timeout=600)
        for (label, seed, _), summary in zip(runs, out[0][0]):
            results.setdefault(label, []).append(summary)

    def mean_acc(label):
        return statistics.mean(s["test_accuracy"] for s in results[label])

    def baseline(cfg):
        return cfg[4] if len(cfg) > 4 else "LANS (none)"

    lines = ["| optimizer | acc seed 0 | seed 1 | seed 2 | mean | vs baseline | wire / fp32 |",
             "|---|---|---|---|---|---|---|"]
    for cfg in CONFIGS:
        label = cfg[0]
        accs = [s["test_accuracy"] for s in results[label]]
        ratio = (sum(s["bytes_pushed"] for s in results[label])
                 / sum(s["bytes_fp32"] for s in results[label]))
        mean = statistics.mean(accs)
        ratios = [s["error_ratio"] for s in results[label] if "error_ratio" in s]
        lines.append("| %s | %s | %.2f | %+.2f (%s) | %.4f%s |"
                     % (label, " | ".join("%.2f" % a for a in accs), mean,
                        mean - mean_acc(baseline(cfg)), baseline(cfg), ratio,
                        " (end of run: ||e||/||g|| %s)" % ", ".join("%.3g" % r for r in ratios)
                        if ratios else ""))
    print("\ndigits, 2 workers, %d epochs, min_compress_bytes=%d\n%s"
          % (EPOCHS, MIN_COMPRESS_BYTES, "\n".join(lines)))

    misses = []
    for cfg in CONFIGS:
        label, allowed = cfg[0], cfg[3]
        runs = results[label]
        assert all(s["steps"] == runs[0]["steps"] > 0 for s in runs)
        if allowed is None:
            continue
        if "--compression" in cfg[2] or "binsgdm" in cfg[2]:
            assert all(s["bytes_pushed"] < s["bytes_fp32"] for s in runs), (label, runs)
        mean, base = mean_acc(label), mean_acc(baseline(cfg))
        if mean < base - allowed:
            misses.append("%s: mean accuracy %.2f vs %s %.2f (allowed drop %.1f)"
                          % (label, mean, baseline(cfg), base, allowed))
    assert not misses, misses
