#!/usr/bin/env python3
"""Smoke test of `bitpush-bench compressors --json`: the command, flags and JSON fields are a
contract other tools rely on. Runs a tiny configuration at every ISA level this CPU has and
checks the records (not the speed: speed targets live in the benchmark, not in tests)."""
import json
import subprocess
import sys

bench = sys.argv[1]
REQUIRED = {"name", "op", "bytes", "gbps", "ratio_to_memcpy", "compression_ratio"}
OPS = {"compress", "compress_ef", "decompress", "decompress_add"}


def run(*args):
    return subprocess.run([bench, *args], capture_output=True, text=True, timeout=300)


ok_isas = []
for isa in ("scalar", "avx2", "avx512"):
    r = run("compressors", "--json", "--isa", isa, "--sizes-mib", "1", "--min-time", "0.005")
    if r.returncode != 0:
        assert "not supported" in r.stderr, (isa, r.stderr)
        continue
    ok_isas.append(isa)
    records = json.loads(r.stdout)
    assert isinstance(records, list) and records, "expected a non-empty JSON list"
    for rec in records:
        missing = REQUIRED - rec.keys()
        assert not missing, f"record {rec} lacks {missing}"
        assert rec["bytes"] == 1 << 20, rec
        assert rec["gbps"] > 0 and rec["ratio_to_memcpy"] > 0, rec
        assert rec["isa"] == isa, rec
    by_spec = {}
    for rec in records:
        by_spec.setdefault(rec["spec"], {})[rec["op"]] = rec
    assert by_spec["memcpy"]["memcpy"]["ratio_to_memcpy"] == 1
    for spec, ops in by_spec.items():
        if spec == "memcpy":
            continue
        assert set(ops) == OPS, (spec, set(ops))
    # Compression ratios as the formats say (1 MiB = 262144 fp32 elements, 16-byte header).
    n = 262144
    expect = {
        "none": 4 * n / (16 + 4 * n),
        "fp16": 4 * n / (16 + 2 * n),
        "onebit": 4 * n / (16 + 4 + 8 * n // 64),
        "topk:ratio=0.001": 4 * n / (16 + 4 + 262 * 8),
        "dithering:levels=15,partition=linear,norm=max": 4 * n / (16 + 4 + n // 64 * 5 * 8),
    }
    for spec, ratio in expect.items():
        got = by_spec[spec]["compress"]["compression_ratio"]
        assert abs(got - ratio) < 1e-3 * ratio, (spec, got, ratio)

assert "scalar" in ok_isas
r = run("compressors", "--isa", "sse9")
assert r.returncode == 2 and "sse9" in r.stderr, r.stderr
r = run("compressors", "--bogus")
assert r.returncode == 2 and "--bogus" in r.stderr, r.stderr
r = run("nosuchbench")
assert r.returncode == 2 and "nosuchbench" in r.stderr, r.stderr
print(f"bench JSON contract ok for ISA levels: {', '.join(ok_isas)}")
