#!/usr/bin/env python3
"""Smoke test of `bitpush-bench transport --json`: the command, flags and JSON fields are a
contract other tools rely on. Runs a tiny configuration (two processes on loopback) and checks
the records, not the speed: the speed target lives in the benchmark, not in tests. Also the
ucx links (--transport zmq,ucx, --ucx-tls) and `transport --list` (what UCX finds here)."""
import json
import math
import os
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
# Every zmq record says its transport.
assert all(x.get("transport") == "zmq" for x in records if x["backend"] == "zmq"), records

# --transport zmq,ucx: one ucx link per --ucx-tls, in the same run as zmq; each record says what
# UCX chose for the connection (the transport/device of its lanes).
r = run("transport", "--transport", "zmq,ucx", "--ucx-tls", "tcp", "--no-ipc", "--json",
        "--sizes-kib", "64", "--mib-per-rep", "1", "--reps", "1", "--rtt-count", "10")
assert r.returncode == 0, r.stderr
ucx_records = json.loads(r.stdout)
ucx = [x for x in ucx_records if x["backend"] == "ucx"]
assert {x["mode"] for x in ucx} == {"throughput", "rtt"}, ucx_records
for rec in ucx:
    missing = REQUIRED - rec.keys()
    assert not missing, f"record {rec} lacks {missing}"
    assert rec["transport"] == "ucx" and rec["link"] == "tcp", rec
    assert rec["ucx_tls_configured"] == "tcp", rec
    chosen = rec["ucx_tls"].split(",")
    assert chosen and all(c.startswith("tcp/") for c in chosen), rec  # TLS tcp: only tcp lanes
    assert "am" in rec["ucx_lanes"], rec
tput = next(x for x in ucx if x["mode"] == "throughput")
zmq_tcp = next(x for x in ucx_records
               if (x["backend"], x["link"], x["mode"]) == ("zmq", "tcp", "throughput"))
assert math.isclose(tput["ratio_to_zmq_tcp"], tput["gbps"] / zmq_tcp["gbps"], rel_tol=1e-3), tput
r = run("transport", "--transport", "ucx", "--no-ipc", "--json", "--sizes-kib", "64",
        "--mib-per-rep", "1", "--reps", "1", "--rtt-count", "10")
assert r.returncode == 0, r.stderr
only_ucx = json.loads(r.stdout)
assert {x["backend"] for x in only_ucx} == {"raw_tcp", "raw_tcp_ceiling", "memcpy", "ucx"}, only_ucx
assert all(x["link"] == "default" and x["ucx_tls_configured"] == "" and x["ucx_tls"]
           for x in only_ucx if x["backend"] == "ucx"), only_ucx
r = run("transport", "--transport", "rdma")
assert r.returncode == 2 and "--transport" in r.stderr, r.stderr
r = run("transport", "--ucx-tls", "tcp")
assert r.returncode == 2 and "--ucx-tls needs --transport ucx" in r.stderr, r.stderr

# --list: what UCX finds here, at least TCP on the loopback interface, and the RDMA devices or
# why there is none.
ib = "/sys/class/infiniband"
r = run("transport", "--list")
assert r.returncode == 0, r.stderr
lines = r.stdout.splitlines()
assert lines[0].startswith("UCX 1."), r.stdout
assert any(line.split()[:2] == ["tcp/lo", "net"] for line in lines), r.stdout
assert "RDMA devices:" in lines, r.stdout
if not os.path.exists(ib):
    assert "  no RDMA device: /sys/class/infiniband is absent" in lines, r.stdout
r = run("transport", "--list", "--json")
assert r.returncode == 0, r.stderr
inventory = json.loads(r.stdout)
assert inventory["ucx_version"].startswith("1."), inventory
assert {"transport": "tcp", "device": "lo"}.items() <= next(
    (x for x in inventory["resources"] if x["transport"] == "tcp" and x["device"] == "lo"),
    {}).items(), inventory
if not os.path.exists(ib):
    assert inventory["rdma_devices"] == [], inventory
    assert inventory["rdma_absent_reason"] == "no RDMA device: /sys/class/infiniband is absent"
else:
    assert inventory["rdma_devices"] or inventory["rdma_absent_reason"], inventory
    for port in inventory["rdma_devices"]:
        assert port["link_layer"] in ("InfiniBand", "Ethernet"), port

r = run("--help")
assert r.returncode == 0 and "transport" in r.stdout, r.stdout
print(f"transport bench JSON contract ok: {len(records)} records")
