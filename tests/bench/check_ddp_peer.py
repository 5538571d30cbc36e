#!/usr/bin/env python3
"""Smoke test of `bitpush-bench pushpull --peer ddp` (bench/peers/ddp_peer.cc, ddp_driver.py):
tiny runs (2 workers, 1 MiB, 2 timed rounds, one alternation) of each DDP variant side by side
with bitpush, the records' fields (not the speed), the usage errors, and bitpush alone (exit 0)
when the peer's Python has no torch. CI has Debian's torch with gloo under /usr/bin/python3
(deploy/install-deps.sh); where it has none, the runs must say so and run bitpush alone."""
import json
import os
import stat
import subprocess
import sys
import tempfile

bench = sys.argv[1]
MIB = 1 << 20


def run(*args, **kwargs):
    return subprocess.run([bench, "pushpull", *args], capture_output=True, text=True, timeout=300,
                          **kwargs)


def pushpull(*args):
    """The records and stderr of a tiny `pushpull --json --peer ddp ARGS` run."""
    r = run("--json", "--peer", "ddp", "--mb", "1", "--partition-kb", "256", "--iters", "2",
            "--warmup", "1", "--workers", "2", "--peer-reps", "1", "--raw-reps", "1",
            "--timeout-s", "120", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def close(a, b):
    return abs(a - b) <= 1e-3 * abs(b)


# Usage errors, before anything runs.
for bad, says in ((("--peer", "ddp", "--link-gbit", "1"), "bench/emulated_network.py"),
                  (("--peer-variant", "fp16"), "--peer-variant needs --peer ddp"),
                  (("--peer-python", "/usr/bin/python3"), "--peer-python needs --peer ddp"),
                  (("--peer", "ddp", "--peer-variant", "bogus"), "bogus"),
                  (("--peer", "ddp", "--peer-variant", "powersgd", "--dtype", "float16"),
                   "--dtype float16"),
                  (("--peer", "ddp", "--dtype", "bfloat16"), "--dtype bfloat16"),
                  (("--peer", "ddp", "--pslite-dir", "/tmp"), "--pslite-dir needs --peer pslite")):
    r = run(*bad)
    assert r.returncode == 2 and says in r.stderr, (bad, r.stderr)

torch_here = subprocess.run(
    ["/usr/bin/python3", "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
    capture_output=True).returncode == 0

# Without torch under --peer-python: why, how to get it, then bitpush alone (exit 0). A Python
# without site-packages (-S) is one without Debian's torch.
with tempfile.TemporaryDirectory(prefix="bp-ddp-test-") as tmp:
    bare = os.path.join(tmp, "python-without-torch")
    with open(bare, "w") as f:
        f.write('#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
    os.chmod(bare, stat.S_IRWXU)
    for python, why in ((bare, "cannot import torch"), ("/nonexistent/python3", "no Python at")):
        records, err = pushpull("--peer-python", python, "--iters", "1", "--warmup", "0",
                                "--workers", "1")
        assert why in err and "running bitpush alone" in err, err
        assert "bench/peers/README.md" in err and "--peer-python" in err, err
        assert [(x["peer"], x["compressor"]) for x in records] == [("bitpush", "none")], records
        assert records[0]["ratio_to_ddp"] is None, records

DDP_FIELDS = ["peer", "backend", "variant", "hook", "dtype", "workers", "mb", "tensors", "iters",
              "warmup", "goodput_gbps", "goodput_min_gbps", "goodput_max_gbps", "peer_reps",
              "best_iter_gbps", "raw_tcp_gbps", "raw_tcp_median_gbps", "ratio_to_raw_tcp",
              "raw_tcp_duplex_gbps", "raw_tcp_duplex_median_gbps", "ratio_to_raw_tcp_duplex",
              "link_gbit", "ratio_to_bitpush", "iter_ms", "round_ms", "local_ms",
              "allreduce_bytes_per_iter", "wire_compression_ratio", "line_rate_bound_ms",
              "ratio_to_bound", "bucket_cap_mb", "parameters", "worker_peak_rss_mb",
              "wall_seconds", "torch_version", "python"]

# Each variant side by side with bitpush none (2 workers, 2 servers, 1 MiB of fp32).
for variant, allreduced in (("allreduce", MIB), ("fp16", MIB // 2), ("powersgd", None)):
    records, err = pushpull("--servers", "2", "--peer-variant", variant)
    if not torch_here:
        assert "running bitpush alone" in err, err
        assert [x["peer"] for x in records] == ["bitpush"], records
        continue
    assert [(x["peer"], x.get("compressor")) for x in records] == \
        [("bitpush", "none"), ("ddp", None)], records
    bitpush, ddp = records
    assert list(ddp) == DDP_FIELDS, list(ddp)  # the fields and their order are a contract
    assert ddp["backend"] == "gloo" and ddp["variant"] == variant, ddp
    assert ddp["dtype"] == "float32" and ddp["workers"] == 2 and ddp["mb"] == 1, ddp
    assert ddp["iters"] == 2 and ddp["peer_reps"] == 1 and ddp["torch_version"], ddp
    for key in ("goodput_gbps", "best_iter_gbps", "iter_ms", "round_ms", "worker_peak_rss_mb"):
        assert ddp[key] > 0, (key, ddp)
    # goodput as bitpush's: the tensor bytes per worker per round over the timed loop.
    assert close(ddp["goodput_gbps"], MIB / (ddp["iter_ms"] / 1e3) / 1e9), ddp
    assert close(ddp["ratio_to_bitpush"], ddp["goodput_gbps"] / bitpush["goodput_gbps"]), records
    assert close(bitpush["ratio_to_ddp"], bitpush["goodput_gbps"] / ddp["goodput_gbps"]), records
    assert ddp["line_rate_bound_ms"] is None and ddp["ratio_to_bound"] is None, ddp  # loopback
    assert "line_rate_bound_ms" not in bitpush, bitpush  # only with --link-gbit
    if allreduced is not None:
        assert close(ddp["allreduce_bytes_per_iter"], allreduced), ddp  # 6 digits in JSON
    else:  # PowerSGD rank 4 of a 256 x 1024 matrix: P (256 x 4) and Q (1024 x 4), fp32
        assert close(ddp["allreduce_bytes_per_iter"], (256 + 1024) * 4 * 4), ddp
        assert ddp["warmup"] >= 3, ddp  # after start_powerSGD_iter
    assert close(ddp["wire_compression_ratio"], MIB / ddp["allreduce_bytes_per_iter"]), ddp
    if variant == "allreduce":
        assert ddp["hook"] == "" and ddp["bucket_cap_mb"] is None and ddp["local_ms"] is None, ddp
    else:
        assert ddp["hook"].endswith(variant == "fp16" and "fp16_compress_hook" or
                                    "powerSGD_hook"), ddp
        assert ddp["bucket_cap_mb"] == 25 and ddp["parameters"] == 1 and ddp["local_ms"] > 0, ddp

print("ddp peer ok" if torch_here else "ddp peer ok (no torch with gloo here: bitpush alone)")
