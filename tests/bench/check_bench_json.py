#!/usr/bin/env python3
"""Smoke test of `bitpush-bench compressors --json`, `bitpush-bench localreduce --json`,
`bitpush-bench optimizer --json`, `bitpush-bench gpureduce --json`, `bitpush-bench pushpull --json`
and `bitpush-bench cluster --json`: the commands, flags and JSON fields are a contract other tools
rely on. Runs tiny configurations (compressors: at every ISA level this CPU has; localreduce:
1 MiB per process; pushpull: a 2-worker, 2-server cluster of 1 MiB; cluster: 8 nodes per
transport) and checks the records (not the speed: speed targets live in the benchmark, not in
tests)."""
import glob
import json
import math
import subprocess
import sys

bench = sys.argv[1]
REQUIRED = {"name", "op", "bytes", "gbps", "ratio_to_memcpy", "compression_ratio"}
OPS = {"compress", "compress_ef", "decompress", "decompress_add", "server_round",
       "engine_check"}


def run(*args):
    return subprocess.run([bench, *args], capture_output=True, text=True, timeout=300)


def pushpull_records(*args):
    """The records of `pushpull --json ARGS` (one raw TCP repetition, 60 s per cluster)."""
    r = run("pushpull", "--json", *args, "--raw-reps", "1", "--timeout-s", "60")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


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
        # engine_check: the worker engine's non-finite check beside compress_ef in the same
        # run; check_cost = its time / compress_ef's (on that record only), check_folded where
        # the compression checks inside its own pass (every method here).
        check = ops["engine_check"]
        assert abs(check["check_cost"] - check["seconds"] / ops["compress_ef"]["seconds"]) \
            < 1e-4 * max(1.0, check["check_cost"]), (spec, check)  # 6 significant digits
        assert check["check_folded"] is True, (spec, check)
        assert "check_cost" not in ops["compress_ef"], (spec, ops["compress_ef"])
    # Compression ratios as the formats say (1 MiB = 262144 fp32 elements, 16-byte header).
    n = 262144
    expect = {
        "none": 4 * n / (16 + 4 * n),
        "fp16": 4 * n / (16 + 2 * n),
        "onebit": 4 * n / (16 + 4 + 8 * n // 64),
        "topk:ratio=0.001": 4 * n / (16 + 4 + 262 * 8),
        "dithering:levels=15,partition=linear,norm=max": 4 * n / (16 + 4 + n // 64 * 5 * 8),
        "binsgdm": 4 * n / (16 + n // 8),
    }
    for spec, ratio in expect.items():
        got = by_spec[spec]["compress"]["compression_ratio"]
        assert abs(got - ratio) < 1e-3 * ratio, (spec, got, ratio)

assert "scalar" in ok_isas

# `bitpush-bench localreduce --json`: the intra-node reduce vs memcpy in one run.
LOCALREDUCE_REQUIRED = {"procs", "mb", "dtype", "threads", "gbps", "memcpy_gbps",
                        "ratio_to_memcpy", "bytes", "elements", "isa", "non_temporal"}
for args, procs, threads, dtype in (
        ((), [2, 4], 1, "float32"),
        (("--procs", "3", "--threads", "2", "--dtype", "float16", "--no-nt"), [3], 2, "float16")):
    r = run("localreduce", "--json", "--mb", "1", "--min-time", "0.005", *args)
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)
    assert [x["procs"] for x in records] == procs, records
    for rec in records:
        missing = LOCALREDUCE_REQUIRED - rec.keys()
        assert not missing, f"localreduce record {rec} lacks {missing}"
        assert rec["mb"] == 1 and rec["bytes"] == 1 << 20, rec
        assert rec["threads"] == threads and rec["dtype"] == dtype, rec
        assert rec["elements"] == (1 << 20) // (4 if dtype == "float32" else 2), rec
        assert rec["gbps"] > 0 and rec["memcpy_gbps"] > 0, rec
        assert abs(rec["ratio_to_memcpy"] - rec["gbps"] / rec["memcpy_gbps"]) < \
            1e-3 * rec["ratio_to_memcpy"], rec
        assert rec["memcpy_gbps"] == records[0]["memcpy_gbps"], "one memcpy reference per run"
    if "--no-nt" in args:
        assert all(rec["non_temporal"] == 0 for rec in records), records
for bad in (("--procs", "0"), ("--dtype", "int8"), ("--mb", "-3"), ("--isa", "sse9"),
            ("--bogus",)):
    r = run("localreduce", *bad)
    assert r.returncode == 2 and bad[-1] in r.stderr, (bad, r.stderr)

# `bitpush-bench optimizer --json`: the LANS step vs the same update in torch ops.
OPTIMIZER_REQUIRED = {"name", "params", "steps", "kernel", "params_per_s", "torch_params_per_s",
                      "speedup_vs_torch", "target", "met", "torch_skipped", "blocks"}
for args in ((), ("--no-torch", "--isa", "scalar")):
    r = run("optimizer", "--json", "--params", "100000", "--steps", "2", *args)
    assert r.returncode == 0, r.stderr
    records = json.loads(r.stdout)
    assert len(records) == 1, records
    rec = records[0]
    missing = OPTIMIZER_REQUIRED - rec.keys()
    assert not missing, f"optimizer record {rec} lacks {missing}"
    assert rec["name"] == "optimizer" and rec["params"] == 100000 and rec["steps"] == 2, rec
    assert rec["params_per_s"] > 0 and rec["target"] == 3.0 and rec["met"] in (0, 1), rec
    if args:
        assert rec["kernel"] == "scalar", rec
    if rec["torch_skipped"]:  # no torch here, or --no-torch: reported, not an error
        assert rec["torch_params_per_s"] is None and rec["met"] == 0, rec
    else:
        assert abs(rec["speedup_vs_torch"] - rec["params_per_s"] / rec["torch_params_per_s"]) < \
            1e-3 * rec["speedup_vs_torch"], rec
    if "--no-torch" in args:
        assert "--no-torch" in rec["torch_skipped"], rec
for bad in (("--params", "0"), ("--steps", "-1"), ("--isa", "sse9"), ("--bogus",),
            ("--device", "tpu"), ("--python", "/usr/bin/python3;true")):
    r = run("optimizer", *bad)
    assert r.returncode == 2 and bad[-1] in r.stderr, (bad, r.stderr)

# `bitpush-bench gpureduce --json`: the GPU intra-node reduce vs CUDA copies in one run, or one
# record naming why it skipped (no usable GPU: this machine's CI). The same answer decides what
# `optimizer --device cuda` must do.
GPUREDUCE_REQUIRED = {"name", "op", "mb", "bytes", "elements", "devices", "device_name", "gbps",
                      "baseline", "baseline_gbps", "ratio_to_baseline", "seconds", "reps"}
r = run("gpureduce", "--json", "--mb", "1", "--min-time", "0.01")
assert r.returncode == 0, r.stderr
records = json.loads(r.stdout)
gpu = not (len(records) == 1 and "skipped" in records[0])
if not gpu:
    assert records[0]["name"] == "gpureduce" and "not viable" in records[0]["skipped"], records
    r = run("optimizer", "--json", "--params", "1000", "--steps", "1", "--no-torch",
            "--device", "cuda")
    assert r.returncode == 1 and "--device cuda" in r.stderr, (r.returncode, r.stderr)
else:
    assert [x["op"] for x in records] == ["reduce_to_host", "broadcast_from_host",
                                         "cast_float_to_half", "cast_half_to_float"], records
    for rec in records:
        missing = GPUREDUCE_REQUIRED - rec.keys()
        assert not missing, f"gpureduce record {rec} lacks {missing}"
        assert rec["bytes"] == 1 << 20 and rec["elements"] == 1 << 18, rec
        assert abs(rec["ratio_to_baseline"] - rec["gbps"] / rec["baseline_gbps"]) < \
            1e-3 * rec["ratio_to_baseline"], rec
    r = run("optimizer", "--json", "--params", "100000", "--steps", "2", "--no-torch",
            "--device", "cuda")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)[0]
    assert rec["device"] == "cuda" and rec["kernel"] == "cuda" and rec["params_per_s"] > 0, rec
for bad in (("--mb", "0"), ("--devices", "x"), ("--bogus",)):
    r = run("gpureduce", *bad)
    assert r.returncode == 2 and bad[-1] in r.stderr, (bad, r.stderr)

# `bitpush-bench pushpull --json`: a whole cluster per compressor (scheduler, servers, workers
# as real processes on loopback; needs bitpush-scheduler and bitpush-server next to the bench).
PUSHPULL_REQUIRED = {
    "compressor", "workers", "servers", "goodput_gbps", "raw_tcp_gbps", "server_peak_rss_mb",
    "worker_peak_rss_mb", "ratio_to_raw_tcp", "mb", "partition_kb", "iters", "error_feedback",
    "compress_ms", "network_ms", "server_ms", "decompress_ms", "iter_ms", "server_owned_mb",
    "rss_target_mb", "ratio_to_none", "wire_compression_ratio", "raw_tcp_median_gbps",
    "raw_tcp_duplex_gbps", "raw_tcp_duplex_median_gbps", "ratio_to_raw_tcp_duplex", "link_gbit",
    "security", "security_ratio", "peer", "op_ms", "last_push_ms", "first_reply_ms", "server_cpu_ms",
    "transport", "transport_ratio", "ucx_tls", "ucx_tls_configured", "non_finite_check",
    "non_finite_check_ratio"}
records = pushpull_records("--mb", "1", "--partition-kb", "256", "--iters", "2", "--warmup", "1",
                           "--workers", "2", "--servers", "2", "--compressor", "none,onebit")
assert [x["compressor"] for x in records] == ["none", "onebit"], records
for rec in records:
    missing = PUSHPULL_REQUIRED - rec.keys()
    assert not missing, f"pushpull record {rec} lacks {missing}"
    assert rec["workers"] == 2 and rec["servers"] == 2 and rec["iters"] == 2, rec
    assert rec["mb"] == 1 and rec["partition_kb"] == 256, rec
    for key in ("goodput_gbps", "raw_tcp_gbps", "raw_tcp_duplex_gbps",
                "raw_tcp_duplex_median_gbps", "server_peak_rss_mb", "worker_peak_rss_mb",
                "iter_ms", "network_ms", "server_owned_mb"):
        assert rec[key] > 0, (key, rec)
    assert abs(rec["ratio_to_raw_tcp"] - rec["goodput_gbps"] / rec["raw_tcp_gbps"]) < 1e-3 * \
        rec["ratio_to_raw_tcp"], rec
    assert abs(rec["ratio_to_raw_tcp_duplex"] - rec["goodput_gbps"] / rec["raw_tcp_duplex_gbps"]) \
        < 1e-3 * rec["ratio_to_raw_tcp_duplex"], rec
    assert rec["raw_tcp_duplex_median_gbps"] <= rec["raw_tcp_duplex_gbps"], rec  # best >= median
    # The pipeline: an op's first reply comes after its start, its last push and its first reply
    # before it completes.
    assert 0 < rec["first_reply_ms"] <= rec["op_ms"] and 0 < rec["last_push_ms"] <= rec["op_ms"], rec
    assert rec["link_gbit"] == 0, rec  # loopback unless --link-gbit
    assert rec["security"] == "none" and rec["security_ratio"] == 1, rec  # --security: none
    assert abs(rec["rss_target_mb"] - (4 * rec["server_owned_mb"] + 64)) < 1e-6, rec
    assert rec["pushes_rejected"] == 0, rec
    assert rec["peer"] == "bitpush" and "ratio_to_pslite" not in rec, rec  # no --peer
    # --non-finite-check: on unless asked; no ratio without an "off" run.
    assert rec["non_finite_check"] == "on" and rec["non_finite_check_ratio"] is None, rec
assert records[0]["raw_tcp_gbps"] == records[1]["raw_tcp_gbps"], "one raw TCP reference per run"
assert records[0]["raw_tcp_duplex_gbps"] == records[1]["raw_tcp_duplex_gbps"], \
    "one duplex raw TCP reference per run"
assert records[0]["error_feedback"] == "none" and records[1]["error_feedback"] == "both", records
assert records[0]["ratio_to_none"] == 1, records[0]
assert records[1]["wire_compression_ratio"] > 10, records[1]  # 1 bit per value, plus headers
# --security none,curve: each compressor once per mode in one run; curve clusters get a key pair
# per node in a private temporary directory that is gone when the benchmark exits.
keys_before = set(glob.glob("/tmp/bp-bench-keys-*"))
records = pushpull_records("--mb", "1", "--partition-kb", "256", "--iters", "2", "--warmup", "1",
                           "--compressor", "none", "--security", "none,curve", "--security",
                           "curve")
assert [(x["compressor"], x["security"]) for x in records] == \
    [("none", "none"), ("none", "curve")], records
for rec in records:
    missing = PUSHPULL_REQUIRED - rec.keys()
    assert not missing, f"pushpull record {rec} lacks {missing}"
    assert rec["goodput_gbps"] > 0 and rec["pushes_rejected"] == 0, rec
    assert rec["ratio_to_none"] == 1, rec  # against none under the same security
assert records[0]["security_ratio"] == 1, records[0]
assert abs(records[1]["security_ratio"] - records[1]["goodput_gbps"] /
           records[0]["goodput_gbps"]) < 1e-3 * records[1]["security_ratio"], records
assert set(glob.glob("/tmp/bp-bench-keys-*")) <= keys_before, "the keys directory was left"
# --non-finite-check on,off: each run with and without the workers' own check, adjacent;
# non_finite_check_ratio = goodput with / without on the "on" record.
records = pushpull_records("--mb", "1", "--partition-kb", "256", "--iters", "1", "--warmup", "0",
                           "--security", "curve", "--non-finite-check", "on,off")
assert [(x["security"], x["non_finite_check"]) for x in records] == \
    [("curve", "on"), ("curve", "off")], records
assert all(x["security_ratio"] is None for x in records), records  # no run under none
assert abs(records[0]["non_finite_check_ratio"] - records[0]["goodput_gbps"] /
           records[1]["goodput_gbps"]) < 1e-3 * records[0]["non_finite_check_ratio"], records
assert records[1]["non_finite_check_ratio"] is None, records
# --transport zmq,ucx: each compressor once per transport in one run; the ucx records say what UCX
# chose (a probe connection of the same configuration) and compare with zmq (transport_ratio).
records = pushpull_records("--mb", "1", "--partition-kb", "256", "--iters", "2", "--warmup", "1",
                           "--compressor", "none,onebit", "--transport", "zmq,ucx", "--ucx-tls",
                           "tcp")
assert [(x["compressor"], x["transport"]) for x in records] == \
    [("none", "zmq"), ("none", "ucx"), ("onebit", "zmq"), ("onebit", "ucx")], records
for rec in records:
    missing = PUSHPULL_REQUIRED - rec.keys()
    assert not missing, f"pushpull record {rec} lacks {missing}"
    assert rec["goodput_gbps"] > 0 and rec["pushes_rejected"] == 0, rec
    if rec["transport"] == "zmq":
        assert rec["transport_ratio"] == 1 and rec["ucx_tls"] == "", rec
        assert rec["ucx_tls_configured"] == "", rec
    else:
        lanes = rec["ucx_tls"].split(",")  # TLS tcp: tcp lanes only, loopback's among them
        assert "tcp/lo" in lanes and all(x.startswith("tcp/") for x in lanes), rec
        assert rec["ucx_tls_configured"] == "tcp", rec
        zmq = [x for x in records if x["compressor"] == rec["compressor"] and
               x["transport"] == "zmq"][0]
        assert abs(rec["transport_ratio"] - rec["goodput_gbps"] / zmq["goodput_gbps"]) < \
            1e-3 * rec["transport_ratio"], (rec, zmq)
    assert rec["ratio_to_none"] == 1 or rec["compressor"] != "none", rec  # same transport
for bad in (("--transport", "rdma"), ("--transport", ""), ("--ucx-tls", "tcp"),
            ("--peer", "pslite", "--transport", "ucx")):
    r = run("pushpull", *bad)
    assert r.returncode == 2 and (bad[-2] in r.stderr or "--ucx-tls" in r.stderr), (bad, r.stderr)
# --peer pslite without --pslite-dir (ps-lite is never here): says how to get ps-lite, runs
# bitpush alone, exit 0 (bench/peers/README.md).
r = run("pushpull", "--json", "--peer", "pslite", "--mb", "1", "--partition-kb", "256", "--iters",
        "1", "--warmup", "0", "--raw-reps", "1", "--timeout-s", "60")
assert r.returncode == 0, r.stderr
assert "bench/peers/README.md" in r.stderr and "running bitpush alone" in r.stderr, r.stderr
records = json.loads(r.stdout)
assert [(x["peer"], x["compressor"]) for x in records] == [("bitpush", "none")], records
assert records[0]["ratio_to_pslite"] is None and records[0]["peer_reps"] == 1, records
assert records[0]["reps"] == 1, records
assert records[0]["goodput_min_gbps"] == records[0]["goodput_gbps"] == \
    records[0]["goodput_max_gbps"], records
# --dtype float16: the tensors are fp16 end to end (the record says so; 1 MiB of fp16).
# --reps 2: two clusters; the record is the lower-goodput one of the two (the lower middle),
# with the spread beside it.
records = pushpull_records("--dtype", "float16", "--mb", "1", "--partition-kb", "256", "--iters",
                           "1", "--warmup", "0", "--reps", "2")
assert [(x["dtype"], x["compressor"]) for x in records] == [("float16", "none")], records
assert records[0]["goodput_gbps"] > 0, records
assert records[0]["reps"] == 2, records
assert records[0]["goodput_min_gbps"] == records[0]["goodput_gbps"] <= \
    records[0]["goodput_max_gbps"], records
for bad in (("--dtype", "int8"), ("--peer", "pslite", "--dtype", "float16")):
    r = run("pushpull", *bad)
    assert r.returncode == 2 and "--dtype" in r.stderr, (bad, r.stderr)
for bad in (("--peer", "mxnet"), ("--pslite-dir", "/nonexistent"),
            ("--peer", "pslite", "--link-gbit", "1")):
    r = run("pushpull", *bad)
    assert r.returncode == 2 and bad[-2] in r.stderr, (bad, r.stderr)
for bad in ("tls", "none,plain", ""):
    r = run("pushpull", "--security", bad)
    assert r.returncode == 2 and "--security" in r.stderr, (bad, r.stderr)
r = run("pushpull", "--compressor", "randomk:ratio=0.01,unbiased=true", "--error-feedback",
        "both")
assert r.returncode == 2 and "unbiased random-k" in r.stderr, r.stderr
for bad in ("-1", "fast"):  # usage errors before anything starts (the link mode needs root)
    r = run("pushpull", "--link-gbit", bad)
    assert r.returncode == 2 and "--link-gbit" in r.stderr, r.stderr
r = run("pushpull", "--compressor", "twobit")
assert r.returncode == 2 and "twobit" in r.stderr, r.stderr
# Every wait is bounded: a run longer than --timeout-s is killed, naming what still ran.
r = run("pushpull", "--mb", "32", "--iters", "100000", "--timeout-s", "1", "--raw-reps", "1")
assert r.returncode == 1 and "timed out after 1 s" in r.stderr and "worker 0" in r.stderr, \
    r.stderr
# `bitpush-bench cluster --json`: the control plane at scale, tiny (8 nodes: 1 server, 7 workers,
# one threads-as-nodes cluster per transport, each in a child process; --idle-s 1 keeps it short).
CLUSTER_REQUIRED = {
    "bench", "transport", "nodes", "servers", "workers", "heartbeat_ms", "heartbeat_timeout_s",
    "register_s", "register_total_s", "barriers", "barrier_ms_median", "barrier_ms_p99",
    "barrier_ms_max", "barrier_first_release_ms_median", "barrier_fanout_ms_median", "idle_s",
    "scheduler_cpu_pct", "scheduler_io_cpu_pct", "process_cpu_pct", "rss_per_node_kib", "threads",
    "fds", "fds_per_endpoint", "fds_per_connection", "killed", "kill_named_s", "pushpull_floats",
    "pushpull_rounds", "pushpull_round_ms", "pushpull_round_ms_max", "pushpull_first_round_ms",
    "pushpull_skipped", "cpu", "cores"}
r = subprocess.run([bench, "cluster", "--nodes", "8", "--transport", "inproc,zmq", "--barriers",
                    "10", "--idle-s", "1", "--json"], capture_output=True, text=True, timeout=60)
assert r.returncode == 0, r.stderr
records = json.loads(r.stdout)
assert [(x["transport"], x["nodes"]) for x in records] == [("inproc", 8), ("zmq", 8)], records
for rec in records:
    missing = CLUSTER_REQUIRED - rec.keys()
    assert not missing, f"cluster record {rec} lacks {missing}"
    assert rec["bench"] == "cluster", rec
    assert rec["servers"] == max(1, rec["nodes"] // 8) == 1, rec
    assert rec["servers"] + rec["workers"] == rec["nodes"], rec
    assert rec["heartbeat_ms"] == 200 and rec["heartbeat_timeout_s"] == 1, rec  # 5 x interval
    assert rec["barriers"] == 10 and rec["killed"] == "worker 6", rec
    for key in ("register_s", "register_total_s", "barrier_ms_median", "barrier_ms_p99",
                "barrier_ms_max", "barrier_first_release_ms_median", "barrier_fanout_ms_median",
                "idle_s", "scheduler_cpu_pct", "scheduler_io_cpu_pct", "process_cpu_pct",
                "rss_per_node_kib", "fds_per_endpoint", "fds_per_connection", "kill_named_s",
                "pushpull_round_ms", "pushpull_round_ms_max", "pushpull_first_round_ms"):
        v = rec[key]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (key, rec)
    assert rec["register_s"] <= rec["register_total_s"], rec
    assert rec["barrier_ms_median"] <= rec["barrier_ms_p99"] <= rec["barrier_ms_max"], rec
    assert 0.9 <= rec["idle_s"] < 5, rec
    # The verdict comes from heartbeat silence, bounded (its speed is the benchmark's target).
    assert 0 < rec["kill_named_s"] < rec["heartbeat_timeout_s"] + 30, rec
    assert rec["threads"] > rec["nodes"] and rec["fds"] >= 0, rec
    assert rec["pushpull_skipped"] == "" and rec["pushpull_rounds"] == 5, rec
    assert rec["pushpull_floats"] == 1024, rec
    assert 0 < rec["pushpull_round_ms"] <= rec["pushpull_round_ms_max"], rec
    assert rec["cores"] >= 1, rec
assert records[0]["scheduler_io_cpu_pct"] == 0, records[0]  # inproc: no transport threads
assert records[1]["fds"] > records[0]["fds"], records  # zmq: sockets and contexts per node
for bad, flag in ((("--transport", "tcp"), "--transport"), (("--nodes", "1"), "--nodes"),
                  (("--nodes", "256", "--transport", "zmq", "--base-port", "32700"),
                   "--base-port"),
                  (("--heartbeat-ms", "200", "--heartbeat-timeout-ms", "300"), "heartbeat"),
                  (("--bogus",), "--bogus")):
    r = run("cluster", *bad)
    assert r.returncode == 2 and flag in r.stderr, (bad, r.stderr)
r = run("compressors", "--isa", "sse9")
assert r.returncode == 2 and "sse9" in r.stderr, r.stderr
# --only takes a list of substring filters (a spec's own parameters stay with it), and a filter
# that selects no compressor is refused, naming the compressors, instead of timing memcpy alone.
r = run("compressors", "--json", "--only", "loco,sdp4bit,dithering:levels=3,partition=natural",
        "--sizes-mib", "1", "--min-time", "0.005")
assert r.returncode == 0, r.stderr
assert {rec["spec"] for rec in json.loads(r.stdout)} == {
    "memcpy", "loco", "loco:scale=524288", "sdp4bit", "sdp4bit:hadamard=off",
    "dithering:levels=3,partition=natural,norm=max"}, r.stdout
for only in ("loco;sdp4bit", "loco,twobit", ","):
    r = run("compressors", "--json", "--only", only, "--sizes-mib", "1", "--min-time", "0.005")
    assert r.returncode == 2 and r.stdout == "" and "--only" in r.stderr, (only, r.stderr)
    if only != ",":
        assert "loco, sdp4bit" in r.stderr and (only.split(",")[-1] + "'") in r.stderr, r.stderr
r = run("compressors", "--bogus")
assert r.returncode == 2 and "--bogus" in r.stderr, r.stderr
r = run("nosuchbench")
assert r.returncode == 2 and "nosuchbench" in r.stderr, r.stderr
print(f"bench JSON contract ok for ISA levels: {', '.join(ok_isas)}; localreduce ok; "
      f"optimizer ok; gpureduce ok ({'GPU' if gpu else 'skipped: no usable GPU'}); pushpull ok; "
      "cluster ok")
