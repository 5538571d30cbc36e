"""The timeline end to end (docs/observability.md): a 2 x 2 job under `bitpush launch
--timeline DIR`, over zmq and over ucx, then `bitpush trace merge`: every push a worker made has
its server's push_received, and its reply was sent before the worker received it, in causal order
after the clocks are aligned from the scheduler's heartbeats (bitpush.trace.causal_violations);
every span kind the job's processes do is there; and a daemon-mode node adds its local_reduce,
and its daemon records every training process's optimizer step with its local rank.
"""
import json
import os
import socket
import subprocess
import tempfile

import pytest

from bitpush import trace
from bitpush.testing import free_ports

PY = "/usr/bin/python3"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DIGITS = os.path.join(ROOT, "examples", "train_digits.py")
UCX_OFFSET = 1000


def _free(port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _ports(ucx):
    """5 ports (scheduler, 2 servers, 2 workers); under ucx each node's data port too."""
    for _ in range(20):
        ports = free_ports(5)
        if not ucx or all(_free(p + UCX_OFFSET) for p in ports[1:]):
            return ports
    pytest.fail("no 5 free ports with free data ports")


def _yaml(d, transport, processes=1):
    p = _ports(transport == "ucx")
    path = os.path.join(d, "cluster.yaml")
    with open(path, "w") as f:
        f.write("cluster:\n  scheduler: 127.0.0.1:%d\n" % p[0])
        f.write("  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (p[1], p[2]))
        f.write("  workers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (p[3], p[4]))
        f.write("  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 3000\n")
        if transport == "ucx":
            f.write("  transport: ucx\n  ucx:\n    port_offset: %d\n    tls: \"tcp\"\n"
                    "    net_devices: lo\n" % UCX_OFFSET)
        f.write("compression:\n  spec: onebit\n  error_feedback: both\n")
        f.write("server:\n  engine_threads: 1\n  numa: off\nworker:\n  compress_threads: 1\n")
        if processes > 1:
            # The daemons' sockets in this test's directory, not the user's default one, which
            # another job of the same user may hold.
            f.write("  local_size: %d\n  socket: %s/worker-{rank}.sock\n" % (processes, d))
    return path


def _run(d, cfg, local_size=None):
    timeline = os.path.join(d, "timeline")
    cmd = [PY, "-m", "bitpush.launch", "launch", "--config", cfg, "--timeline", timeline]
    if local_size:
        cmd += ["--local-size", str(local_size)]
    cmd += ["--", PY, DIGITS, "--no-progress", "--epochs", "3", "--optimizer", "clan",
            "--compression", "onebit"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=240)
    assert out.returncode == 0, out.stdout
    return timeline


def _merged(timeline):
    out = subprocess.run([PY, "-m", "bitpush.launch", "trace", "merge", timeline, "-o",
                          os.path.join(timeline, "trace.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=120)
    assert out.returncode == 0, out.stdout
    assert "warning" not in out.stdout.lower(), out.stdout  # every file complete, none dropped
    with open(os.path.join(timeline, "trace.json")) as f:
        return json.load(f)


def _spans(timeline):
    """(file's role, rank, span record) of every span of every file."""
    out = []
    for name in sorted(os.listdir(timeline)):
        if not name.endswith(".jsonl"):
            continue
        role = rank = None
        with open(os.path.join(timeline, name)) as f:
            for line in f:
                r = json.loads(line)
                if r["type"] == "process":
                    role, rank = r["role"], r["rank"]
                elif r["type"] == "span":
                    out.append((role, rank, r))
    return out


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="bp-timeline-")
    yield d
    subprocess.run(["pkill", "-9", "-f", d])
    subprocess.run(["rm", "-rf", d])


@pytest.mark.parametrize("transport", ["zmq", "ucx"])
def test_every_push_has_its_server_span_and_reply_in_causal_order(tmp, transport):
    timeline = _run(tmp, _yaml(tmp, transport))
    files = sorted(f for f in os.listdir(timeline) if f.endswith(".jsonl"))
    assert [f.split("-")[0] for f in files] == ["server", "server", "worker", "worker"], files

    merged = _merged(timeline)
    rows = {e["args"]["name"] for e in merged["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert rows == {"worker 0", "worker 1", "server 0", "server 1"}, rows
    assert merged["otherData"]["dropped"] == 0

    violations = trace.causal_violations(trace.load(timeline))
    assert violations == [], "\n".join(violations[:20])

    spans = _spans(timeline)
    names = {(role, s["name"]) for role, _, s in spans}
    for n in ("declare", "partition", "compress", "push", "network", "decompress", "optimizer"):
        assert ("worker", n) in names, n
    for n in ("push_received", "queued", "sum", "compress", "reply_sent"):
        assert ("server", n) in names, n
    # One push_received per push and one network per reply_sent, matched by (key, round,
    # worker): the causal check above compared their times.
    pushes = sorted((s["key"], s["round"], rank) for role, rank, s in spans
                    if role == "worker" and s["name"] == "push")
    received = sorted((s["key"], s["round"], s["worker"]) for role, _, s in spans
                      if role == "server" and s["name"] == "push_received")
    assert pushes == received
    replies = sorted((s["key"], s["round"], s["worker"]) for role, _, s in spans
                     if role == "server" and s["name"] == "reply_sent")
    networks = sorted((s["key"], s["round"], rank) for role, rank, s in spans
                      if role == "worker" and s["name"] == "network")
    assert replies == networks == pushes
    # Every step of the job was traced (trace.steps all): 3 epochs of 21 steps per tensor.
    rounds = {s["round"] for role, _, s in spans if role == "worker" and s["name"] == "network"}
    assert max(rounds) >= 62, sorted(rounds)[-5:]


def test_a_daemon_node_adds_its_local_reduce_and_its_processes_optimizer_steps(tmp):
    timeline = _run(tmp, _yaml(tmp, "zmq", processes=2), local_size=2)
    spans = _spans(timeline)
    reduces = [s for role, _, s in spans if s["name"] == "local_reduce"]
    assert reduces, "no local_reduce span"
    assert all(role == "worker" for role, _, s in spans if s["name"] == "local_reduce")
    loaded = trace.load(timeline)
    violations = trace.causal_violations(loaded)
    assert violations == [], "\n".join(violations[:20])

    # The training processes write no file: each node's daemon records their optimizer steps
    # (CLAN's step, through Client::TraceOptimizer and LocalOptimizerSpan), one per process
    # and step, with the process's local rank, on the daemon's own clock: a step of round r
    # starts after the node's last decompress of round r ended.
    workers = [f for f in loaded.files if f.role == "worker"]
    assert sorted((f.rank, f.process) for f in workers) == [(0, "daemon"), (1, "daemon")]
    for f in workers:
        steps = [s for s in f.spans if s.name == "optimizer"]
        assert steps, "no optimizer span of node %d" % f.rank
        assert {s.local_rank for s in steps} == {0, 1}, f.label
        done = {}
        for s in f.spans:
            if s.name == "decompress":
                done[s.round] = max(done.get(s.round, s.ts), s.ts + s.dur)
        for lr in (0, 1):
            rounds = sorted(s.round for s in steps if s.local_rank == lr)
            assert rounds == sorted(done), (f.label, lr, rounds, sorted(done))
        for s in steps:
            assert s.key == 0 and s.dur >= 0, s
            assert s.round in done and s.ts >= done[s.round], (f.label, s, done.get(s.round))
    merged = _merged(timeline)
    args = [e["args"] for e in merged["traceEvents"]
            if e.get("ph") == "X" and e.get("name") == "optimizer"]
    assert {a.get("local_rank") for a in args} == {0, 1}, args[:4]
