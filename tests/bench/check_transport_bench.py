#!/usr/bin/env python3
"""Smoke test of `bitpush-bench transport --json`: the command, flags and JSON fields are a
contract other tools rely on. Runs a tiny configuration (two processes on loopback) and checks
the records, not the speed: the speed target lives in the benchmark, not in tests."""
import json
import math
import subprocess
import sys

bench = sys.argv[1]
REQUIRED = {"backend", "link", "mode", "msg_bytes", "gbps", "ratio_to_raw_tcp", "rtt_us"}


def run(*args):
    return subprocess.run([bench, *args], capture_output=True, text=True, timeout=120)


r = run("transport", "--json", "--sizes-kib", "64,1024", "--mib-per-rep", "4", "--reps", "1",
        "--rtt-count", "20")
assert r.returncode == 0, r.stderr
records = json.loads(r.stdout)
assert isinstance(records, list) and records, "expected a non-empty JSON list"
for rec in records:
    missing = REQUIRED - rec.keys()
    assert not missing, f"record {rec} lacks {missing}"

by_key = {(x["backend"], x["link"], x["mode"], x["msg_bytes"]): x for x in records}
for size in (64 << 10, 1 << 20):
    for key in (("raw_tcp", "tcp"), ("raw_tcp_ceiling", "tcp"), ("zmq", "tcp"), ("zmq", "ipc"),
                ("memcpy", "memory")):
        rec = by_key.get((*key, "throughput", size))
        assert rec, f"no throughput record for {key} at {size} bytes"
        assert rec["gbps"] > 0 and rec["ratio_to_raw_tcp"] > 0, rec
        assert rec["ratio_to_raw_tcp_ceiling"] > 0, rec
        assert rec["rtt_us"] is None, rec
    assert by_key[("raw_tcp", "tcp", "throughput", size)]["ratio_to_raw_tcp"] == 1
    zmq = by_key[("zmq", "tcp", "throughput", size)]
    raw = by_key[("raw_tcp", "tcp", "throughput", size)]
    assert math.isclose(zmq["ratio_to_raw_tcp"], zmq["gbps"] / raw["gbps"], rel_tol=1e-3), zmq
for key in (("raw_tcp", "tcp"), ("zmq", "tcp"), ("zmq", "ipc")):
    rec = by_key.get((*key, "rtt", 64))
    assert rec, f"no rtt record for {key}"
    assert rec["rtt_us"] > 0 and rec["ratio_to_raw_tcp"] > 0 and rec["gbps"] is None, rec

r = run("transport", "--no-ipc", "--json", "--sizes-kib", "64", "--mib-per-rep", "1", "--reps",
        "1", "--rtt-count", "10")
assert r.returncode == 0, r.stderr
assert all(x["link"] != "ipc" for x in json.loads(r.stdout))
r = run("transport", "--bogus")
assert r.returncode == 2 and "--bogus" in r.stderr, r.stderr
r = run("transport", "--sizes-kib", "0")
assert r.returncode == 2 and "--sizes-kib" in r.stderr, r.stderr
r = run("--help")
assert r.returncode == 0 and "transport" in r.stdout, r.stdout
print(f"transport bench JSON contract ok: {len(records)} records")
