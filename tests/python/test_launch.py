"""`bitpush launch` and `bitpush check-config` (python/bitpush/launch.py, docs/launch.md) with
the real binaries: a 2-node run that averages a tensor, a failing rank, SIGTERM to the
launcher, and the config check.

Each test writes its own YAML with free loopback ports into a temporary directory whose path
is in every child's command line, so leftovers are found by scanning /proc for it.
"""
import json
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from bitpush.testing import free_ports

PY = "/usr/bin/python3"

PUSH_PULL = r"""
import os, torch
import bitpush.torch as bp
bp.init()
r = bp.rank()
avg = bp.push_pull(torch.full((16,), float(r + 1)), "t")
want = (bp.size() + 1) / 2.0
assert torch.allclose(avg, torch.full((16,), want)), (avg, want)
print("rank %d of %d ok avg=%.2f" % (r, bp.size(), avg[0].item()), flush=True)
bp.shutdown()
"""

FAIL_ON_RANK_1 = r"""
import os, sys, time
if os.environ["BITPUSH_WORKER_RANK"] == "1":
    print("preparing", flush=True)
    print("boom: rank 1 gives up", flush=True)
    sys.exit(3)
time.sleep(120)
"""

# Fails on rank 1 until the launcher has started the job `sys.argv[2]` times again.
FAIL_UNTIL_RESTART = r"""
import os, sys
count = int(os.environ["BITPUSH_RESTART_COUNT"])
print("run %d of rank %s" % (count, os.environ["BITPUSH_WORKER_RANK"]), flush=True)
if os.environ["BITPUSH_WORKER_RANK"] == "1" and count < int(sys.argv[2]):
    print("boom: rank 1 gives up in run %d" % count, flush=True)
    sys.exit(3)
import torch
import bitpush.torch as bp
bp.init()
bp.push_pull(torch.ones(16), "t")
bp.shutdown()
"""

# Rank 1 fails after joining the cluster, with the exception unhandled.
RAISE_AFTER_INIT = r"""
import os, torch
import bitpush.torch as bp
bp.init()
bp.push_pull(torch.ones(16), "t")
if bp.rank() == 1:
    raise RuntimeError("rank 1 fails after a step")
bp.barrier()
"""

HOLD = r"""
import os, time, torch
import bitpush.torch as bp
bp.init()
bp.push_pull(torch.ones(4096), "t")
print("ready", flush=True)
time.sleep(120)
"""


def _bin_dir():
    d = os.environ.get("BITPUSH_BIN_DIR")
    if d:
        return d
    from bitpush import _build_info
    return _build_info.BIN_DIR


def _launcher():
    wrapper = os.path.join(_bin_dir(), "bitpush")
    if os.access(wrapper, os.X_OK):
        return [wrapper]
    return [PY, "-m", "bitpush.launch"]


def _write_yaml(d, workers=2, servers=1, extra_worker=""):
    ports = free_ports(1 + servers + workers)
    path = os.path.join(d, "cluster.yaml")
    with open(path, "w") as f:
        f.write("cluster:\n  scheduler: 127.0.0.1:%d\n" % ports[0])
        f.write("  servers: [%s]\n" % ", ".join("127.0.0.1:%d" % p for p in ports[1:1 + servers]))
        f.write("  workers: [%s]\n" % ", ".join("127.0.0.1:%d" % p for p in ports[1 + servers:]))
        f.write("  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1000\n"
                "  startup_timeout_s: 30\n")
        f.write("compression:\n  spec: none\n")
        f.write("server:\n  engine_threads: 1\n  numa: off\n")
        f.write("worker:\n  compress_threads: 1\n  op_timeout_s: 30\n" + extra_worker)
    return path


def _write_host_yaml(d, scheduler, servers, workers):
    """A YAML in the host form with short timeouts, one engine/compression thread and a
    per-rank daemon socket in `d`; returns its path."""
    path = os.path.join(d, "cluster.yaml")
    with open(path, "w") as f:
        f.write("cluster:\n  scheduler: %s\n  servers: %s\n  workers: %s\n"
                % (scheduler, servers, workers))
        f.write("  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1000\n"
                "  startup_timeout_s: 30\n")
        f.write("server:\n  engine_threads: 1\n  numa: off\n")
        f.write("worker:\n  compress_threads: 1\n  op_timeout_s: 30\n  numa: off\n"
                "  socket: %s/w{rank}.sock\n" % d)
    return path


def _procs_mentioning(text):
    """pids of live processes whose command line contains `text` (zombies excluded)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().decode("utf-8", "replace")
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append((int(pid), cmd.replace("\0", " ")))
    return found


def _started_pids(out):
    started = [l for l in out.splitlines() if l.startswith("bitpush launch: started ")]
    assert len(started) == 1, out
    return [int(p) for p in re.findall(r"\(pid (\d+)\)", started[0])]


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="bp-launch-")
    yield d
    for pid, _ in _procs_mentioning(d):  # never leave anything behind, even on failure
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["rm", "-rf", d])


def _run(args, timeout=90):
    return subprocess.run(_launcher() + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, universal_newlines=True)


def test_launch_two_nodes_average_and_prefixes(tmp):
    cfg = _write_yaml(tmp, workers=2)
    # --log-level info: the roles' start-up lines show every prefix.
    r = _run(["launch", "--config", cfg, "--log-level", "info", "--", PY, "-c", PUSH_PULL, tmp])
    assert r.returncode == 0, r.stdout
    assert "[train 0.0] rank 0 of 2 ok avg=1.50" in r.stdout, r.stdout
    assert "[train 1.0] rank 1 of 2 ok avg=1.50" in r.stdout, r.stdout
    assert re.search(r"^\[scheduler\] ", r.stdout, re.M), r.stdout
    assert re.search(r"^\[server 0\] ", r.stdout, re.M), r.stdout
    for line in r.stdout.splitlines():
        assert re.match(r"\[(scheduler|server \d+|worker \d+|train \d+\.\d+)\] |bitpush launch: ",
                        line), line
    assert re.search(r"^bitpush launch: 4 processes, all exited 0 in [\d.]+ s$", r.stdout,
                     re.M), r.stdout
    assert not _procs_mentioning(tmp)


UNEQUAL = r"""
import os, warnings, torch
import bitpush.torch as bp
warnings.simplefilter("ignore")
bp.init()
r = bp.rank()
avg = bp.push_pull(torch.full((16,), float(r + 1)), "t")
total = bp.push_pull(torch.full((4,), float(r + 1)), "s", average=False)
assert os.environ["BITPUSH_RANK"] == str(r) and os.environ["BITPUSH_SIZE"] == str(bp.size())
assert os.environ["BITPUSH_ROLE"] == "worker"
assert os.environ["BITPUSH_SCHEDULER"].startswith("tcp://127.0.0.1:")
print("rank %d of %d node %d.%d avg=%.3f sum=%.1f gpu=%s mode=%s socket=%s" % (
    r, bp.size(), bp.node_rank(), bp.local_rank(), avg[0].item(), total[0].item(),
    os.environ.get("BITPUSH_GPU"), bp.mode(),
    os.path.basename(os.environ.get("BITPUSH_DAEMON_SOCKET", "-"))), flush=True)
bp.shutdown()
"""


def test_host_form_unequal_processes_average_over_every_process(tmp):
    """Node 0 runs 2 processes (GPUs 1 and 0 listed), node 1 runs 1: ranks 0..2, the average
    is over the 3 processes (2.0, not the node-weighted 2.25), every node gets a daemon, and
    the launcher hands each process its GPU and its daemon's socket."""
    ports = free_ports(4)
    cfg = _write_host_yaml(tmp, "127.0.0.1:%d" % ports[0],
                           "[{host: 127.0.0.1, port: %d}]" % ports[1],
                           "\n    - {host: 127.0.0.1, port: %d, gpus: [1, 0]}"
                           "\n    - {host: 127.0.0.1, port: %d, processes: 1}" % (ports[2], ports[3]))
    r = _run(["launch", "--config", cfg, "--", PY, "-c", UNEQUAL, tmp])
    assert r.returncode == 0, r.stdout
    for line in ("[train 0.0] rank 0 of 3 node 0.0 avg=2.000 sum=6.0 gpu=1 mode=daemon "
                 "socket=w0.sock",
                 "[train 0.1] rank 1 of 3 node 0.1 avg=2.000 sum=6.0 gpu=0 mode=daemon "
                 "socket=w0.sock",
                 "[train 1.0] rank 2 of 3 node 1.0 avg=2.000 sum=6.0 gpu=None mode=daemon "
                 "socket=w1.sock"):
        assert line in r.stdout, r.stdout
    assert re.search(r"^\[worker 0\] ", r.stdout, re.M), r.stdout
    assert re.search(r"^\[worker 1\] ", r.stdout, re.M), r.stdout
    assert re.search(r"^bitpush launch: 7 processes, all exited 0 in", r.stdout, re.M), r.stdout


def test_host_form_unequal_processes_refuses_embedded_and_override(tmp):
    ports = free_ports(4)
    cfg = os.path.join(tmp, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write("cluster:\n  scheduler: 127.0.0.1:%d\n  servers: [127.0.0.1:%d]\n"
                % (ports[0], ports[1]))
        f.write("  workers: [{host: 127.0.0.1, port: %d, processes: 2}, "
                "{host: 127.0.0.1, port: %d}]\n" % (ports[2], ports[3]))
    # Node 1 has no count (worker.local_size unset): counts unknown, nothing to weigh.
    from bitpush import _C
    c = _C.load_cluster_config(cfg)
    assert c["worker_processes"] == [2, 0] and not c["processes_differ"], c
    with open(cfg, "a") as f:
        f.write("worker:\n  local_size: 1\n")
    c = _C.load_cluster_config(cfg)
    assert c["worker_processes"] == [2, 1] and c["processes_differ"], c
    r = _run(["launch", "--config", cfg, "--local-size", "2", "--", PY, "-c", "pass"])
    assert r.returncode == 2, r.stdout
    assert "--local-size 2 would override" in r.stdout and "(2, 1)" in r.stdout, r.stdout
    assert "[scheduler]" not in r.stdout, r.stdout  # nothing started
    # A daemon started by hand with another count is refused before it joins the cluster.
    d = subprocess.run([os.path.join(_bin_dir(), "bitpush-worker"), "--config", cfg, "--rank",
                        "0", "--local-size", "3"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=30)
    assert d.returncode != 0, d.stdout
    assert ("--local-size 3 differs from the 2 training processes cluster.workers[0] has in %s"
            % cfg) in d.stdout, d.stdout
    # A process that would run embedded in such a cluster is refused, naming why.
    import bitpush.torch as bp
    with pytest.raises(bp.BitpushError, match="different numbers of training processes"):
        bp.init(cfg, rank=1, mode="embedded")


def test_two_launchers_split_by_host(tmp):
    """A multi-host YAML on loopback aliases: one launcher per "machine" (--host) starts only
    that machine's roles — the first the scheduler and servers, the second the worker nodes and
    their training processes — and both end cleanly when training is done."""
    ports = free_ports(5)
    cfg = _write_host_yaml(tmp, "127.0.0.2:%d" % ports[0],
                           "{hosts: [127.0.0.2], count: 2, port: %d}" % ports[1],
                           "\n    - {host: 127.0.0.3, port: %d, processes: 2}"
                           "\n    - {host: 127.0.0.4, port: %d, processes: 2}" % (ports[3], ports[4]))
    ps = subprocess.Popen(_launcher() + ["launch", "--config", cfg, "--host", "127.0.0.2"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True)
    try:
        gpu = _run(["launch", "--config", cfg, "--host", "127.0.0.3", "--host", "127.0.0.4",
                    "--", PY, "-c", PUSH_PULL, tmp])
        ps_out, _ = ps.communicate(timeout=60)
    finally:
        if ps.poll() is None:
            ps.kill()
            ps.communicate()
    assert gpu.returncode == 0, gpu.stdout
    assert ps.returncode == 0, ps_out
    assert "bitpush launch: starting scheduler, server 0, server 1\n" in ps_out, ps_out
    assert ("bitpush launch: starting worker 0, train 0.0, train 0.1, worker 1, train 1.0, "
            "train 1.1\n") in gpu.stdout, gpu.stdout
    for r in range(4):
        assert "rank %d of 4 ok avg=2.50" % r in gpu.stdout, gpu.stdout
    assert re.search(r"^bitpush launch: 3 processes, all exited 0 in", ps_out, re.M), ps_out
    assert re.search(r"^bitpush launch: 6 processes, all exited 0 in", gpu.stdout, re.M), \
        gpu.stdout


def test_failing_rank_stops_everything_and_is_named(tmp):
    cfg = _write_yaml(tmp, workers=2)
    t0 = time.monotonic()
    r = _run(["launch", "--config", cfg, "--grace-s", "3", "--", PY, "-c", FAIL_ON_RANK_1, tmp])
    assert r.returncode == 1, r.stdout
    assert time.monotonic() - t0 < 30, r.stdout  # not the 120 s sleep of rank 0
    summary = [l for l in r.stdout.splitlines() if l.startswith("bitpush launch: FAILED")]
    assert summary, r.stdout
    assert "train 1.0" in summary[0] and "exited with 3" in summary[0], summary[0]
    assert "boom: rank 1 gives up" in summary[0], summary[0]
    pids = _started_pids(r.stdout)
    assert len(pids) == 4, r.stdout
    for pid in pids:
        assert not os.path.exists("/proc/%d" % pid) or \
            open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "Z", pid
    assert not _procs_mentioning(tmp)


def test_max_restarts_starts_the_job_again_and_names_each_death(tmp):
    cfg = _write_yaml(tmp, workers=2)
    r = _run(["launch", "--config", cfg, "--max-restarts", "3", "--", PY, "-c",
              FAIL_UNTIL_RESTART, tmp, "2"])
    assert r.returncode == 0, r.stdout
    restarts = [l for l in r.stdout.splitlines() if l.startswith("bitpush launch: restart ")]
    assert len(restarts) == 2, r.stdout
    for i, line in enumerate(restarts):
        assert re.match(r"bitpush launch: restart %d of 3: train 1\.0 \(pid \d+\) exited with 3; "
                        r"last line: boom: rank 1 gives up in run %d; killing the other \d "
                        r"process\(es\) and starting the job again$" % (i + 1, i), line), line
    # Each run saw its count in the environment; the third ran through.
    for run in range(3):
        assert "[train 0.0] run %d of rank 0" % run in r.stdout, r.stdout
    assert re.search(r"bitpush launch: 12 processes, all exited 0 in [\d.]+ s after 2 "
                     r"restart\(s\)$", r.stdout.strip()), r.stdout
    assert not _procs_mentioning(tmp)


def test_max_restarts_gives_up_after_n_and_the_yaml_sets_it(tmp):
    cfg = _write_yaml(tmp, workers=2)
    with open(cfg, "a") as f:
        f.write("launch:\n  max_restarts: 1\n")
    r = _run(["launch", "--config", cfg, "--", PY, "-c", FAIL_UNTIL_RESTART, tmp, "5"])
    assert r.returncode == 1, r.stdout
    lines = r.stdout.splitlines()
    assert sum(l.startswith("bitpush launch: restart ") for l in lines) == 1, r.stdout
    assert "bitpush launch: train 1.0 exited with 3, and the job was started again 1 time(s) " \
        "already (--max-restarts 1): giving up" in lines, r.stdout
    failed = [l for l in lines if l.startswith("bitpush launch: FAILED: train 1.0")]
    assert failed and "boom: rank 1 gives up in run 1" in failed[0] and \
        failed[0].endswith("after 1 restart(s)"), r.stdout
    # The flag overrides the YAML; a bad count is a usage error.
    r = _run(["launch", "--config", cfg, "--max-restarts", "0", "--", PY, "-c",
              FAIL_UNTIL_RESTART, tmp, "5"])
    assert r.returncode == 1 and "bitpush launch: restart " not in r.stdout, r.stdout
    r = _run(["launch", "--config", cfg, "--max-restarts", "-1", "--", PY, "-c", "pass"])
    assert r.returncode == 2 and "--max-restarts must be 0..1000, got -1" in r.stdout, r.stdout
    assert not _procs_mentioning(tmp)


def test_an_unhandled_exception_leaves_the_cluster_at_once(tmp):
    # The interpreter's exit closes the client without waiting for a clean shutdown that the
    # failed job never reaches (bitpush.torch.shutdown's default bound is 30 s).
    cfg = _write_yaml(tmp, workers=2)
    t0 = time.monotonic()
    r = _run(["launch", "--config", cfg, "--grace-s", "2", "--", PY, "-c", RAISE_AFTER_INIT,
              tmp])
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout
    failed = [l for l in r.stdout.splitlines() if l.startswith("bitpush launch: FAILED")]
    assert failed and "train 1.0" in failed[0] and \
        "RuntimeError: rank 1 fails after a step" in failed[0], r.stdout
    assert took < 20, (took, r.stdout)
    assert "shutdown at exit failed" not in r.stdout, r.stdout


def test_sigterm_stops_cluster_daemon_and_trainers(tmp):
    # One node with two training processes: the launcher starts a bitpush-worker daemon.
    cfg = _write_yaml(tmp, workers=1, extra_worker="  local_size: 2\n  socket: %s\n"
                      % os.path.join(tmp, "node.sock"))
    p = subprocess.Popen(_launcher() + ["launch", "--config", cfg, "--grace-s", "3", "--",
                                        PY, "-c", HOLD, tmp],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")))
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            if sum(1 for l in list(lines) if l.rstrip().endswith("] ready")) == 2:
                break
            time.sleep(0.1)
        out = "".join(lines)
        assert sum(1 for l in out.splitlines() if l.rstrip().endswith("] ready")) == 2, out
        assert "[worker 0] " in out, out
        pids = _started_pids(out)
        assert len(pids) == 5, out  # scheduler, server 0, worker 0, train 0.0, train 0.1
        p.send_signal(signal.SIGTERM)
        rc = p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join(10)
    out = "".join(lines)
    assert rc == 128 + signal.SIGTERM, out
    assert "bitpush launch: stopped by SIGTERM" in out, out
    assert not _procs_mentioning(tmp), out
    uid = os.getuid()
    leftovers = [n for n in os.listdir("/dev/shm")
                 if any("-%d-%d-" % (uid, pid) in n for pid in pids)]
    assert not leftovers, (leftovers, out)
    assert not os.path.exists(os.path.join(tmp, "node.sock")), out


def test_check_config_good_and_bad(tmp):
    cfg = _write_yaml(tmp, workers=2)
    r = _run(["check-config", cfg], timeout=30)
    assert r.returncode == 0, r.stdout
    assert "is valid" in r.stdout and "2 worker node(s)" in r.stdout, r.stdout
    bad = os.path.join(tmp, "bad.yaml")
    with open(cfg) as f:
        text = f.read()
    with open(bad, "w") as f:
        f.write(text.replace("heartbeat_interval_ms", "heartbeat_intervall_ms"))
    r = _run(["check-config", bad], timeout=30)
    assert r.returncode == 2, r.stdout
    assert re.search(r"bad\.yaml:\d+: cluster\.heartbeat_intervall_ms: unknown key", r.stdout), \
        r.stdout
    r = _run(["launch", "--config", bad, "--", PY, "-c", "pass"], timeout=30)
    assert r.returncode == 2 and "heartbeat_intervall_ms" in r.stdout, r.stdout


def test_check_config_names_a_host_that_does_not_resolve(tmp):
    # RFC 2606: .invalid never resolves.
    bad = "no-such-host.invalid"
    cases = [
        ("127.0.0.1:9000", "[127.0.0.1:9101]", "[127.0.0.1:9201, %s:9202]" % bad,
         "cluster.workers: worker node 1's host '%s' does not resolve" % bad),
        ("%s:9000" % bad, "[127.0.0.1:9101]", "[127.0.0.1:9201]",
         "cluster.scheduler: the scheduler's host '%s' does not resolve" % bad),
        # The host form: the name of a `hosts` list, named for the node it expands to.
        ("127.0.0.1:9000", "{hosts: [127.0.0.1, %s], count: 1, port: 9101}" % bad,
         "[127.0.0.1:9201]", "cluster.servers: server 1's host '%s' does not resolve" % bad),
    ]
    for scheduler, servers, workers, expected in cases:
        cfg = _write_host_yaml(tmp, scheduler, servers, workers)
        r = _run(["check-config", cfg], timeout=60)
        assert r.returncode == 2, r.stdout
        assert expected in r.stdout, r.stdout
        assert "is valid" not in r.stdout, r.stdout
        # Checking syntax and values only is still possible.
        r = _run(["check-config", "--no-resolve", cfg], timeout=30)
        assert r.returncode == 0 and "is valid" in r.stdout, r.stdout
    # Names that resolve pass.
    cfg = _write_host_yaml(tmp, "localhost:9000", "[localhost:9101]", "[127.0.0.1:9201]")
    r = _run(["check-config", cfg], timeout=60)
    assert r.returncode == 0 and "is valid" in r.stdout, r.stdout


def test_shipped_examples_are_valid():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # multi-host.yaml names example machines (example.net): syntax and values only.
    for name, extra in (("local.yaml", []), ("multi-host.yaml", ["--no-resolve"])):
        r = _run(["check-config"] + extra + [os.path.join(root, "deploy", "examples", name)],
                 timeout=30)
        assert r.returncode == 0, (name, r.stdout)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = [PY, os.path.join(ROOT, "examples", "train_digits.py"), "--epochs", "1", "--no-progress"]


def _local_yaml(d, socket_dir=None):
    """deploy/examples/local.yaml with free ports (its servers and workers as explicit lists)
    and, for daemon runs, the daemons' sockets in `d`; every other setting is the example's."""
    with open(os.path.join(ROOT, "deploy", "examples", "local.yaml")) as f:
        text = f.read()
    ports = free_ports(5)
    text = re.sub(r"(?m)^  scheduler: .*$", "  scheduler: 127.0.0.1:%d" % ports[0], text)
    text = re.sub(r"(?m)^  servers: .*$", "  servers: [127.0.0.1:%d, 127.0.0.1:%d]"
                  % tuple(ports[1:3]), text)
    text = re.sub(r"(?m)^  workers: .*$", "  workers: [127.0.0.1:%d, 127.0.0.1:%d]"
                  % tuple(ports[3:5]), text)
    text = re.sub(r"(?m)^worker:\n", "worker:\n  socket: %s/w{rank}.sock\n" % d, text)
    path = os.path.join(d, "local.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_the_example_runs_with_curve_on_keys_made_for_the_run(tmp):
    # deploy/examples/local.yaml asks for security.mode curve and names no keys: the launcher
    # makes them (every node is on this host), hands them to every process, removes them after.
    before = set(glob.glob("/tmp/bitpush-keys-*"))
    r = _run(["launch", "--log-level", "info", "--config", _local_yaml(tmp), "--"] + DIGITS)
    assert r.returncode == 0, r.stdout
    assert "security.mode curve: every connection is authenticated and encrypted" in r.stdout
    assert set(glob.glob("/tmp/bitpush-keys-*")) == before


def test_the_example_run_prints_at_most_20_lines_with_the_compression_line(tmp):
    r = _run(["launch", "--config", _local_yaml(tmp), "--"] + DIGITS)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stdout
    assert len(lines) <= 20, "%d lines:\n%s" % (len(lines), r.stdout)
    # The digits MLP at the default threshold: its 3 weight matrices 1-bit, its 3 biases raw.
    compression = [l for l in lines if l.startswith("[train 0.0] compression: ")]
    assert compression == [
        "[train 0.0] compression: onebit:scaled=true on 3 of 6 tensors (101.0 KiB of 102.0 KiB, "
        "99.0%); raw: 3 tensors (1.0 KiB) below compression.min_compress_bytes=4096; "
        "error_feedback: both"], r.stdout
    # A clean shutdown is not a warning.
    assert "disconnected" not in r.stdout and "[warning]" not in r.stdout, r.stdout


def test_log_level_reaches_every_process_including_the_in_process_worker(tmp):
    r = _run(["launch", "--config", _local_yaml(tmp), "--log-level", "info", "--"] + DIGITS)
    assert r.returncode == 0, r.stdout
    assert len(r.stdout.splitlines()) > 20, r.stdout
    for role in ("[scheduler]", "[server 0]", "[train 0.0]", "[train 1.0]"):
        assert re.search(r"(?m)^%s .*\[info\]" % re.escape(role), r.stdout), (role, r.stdout)
    assert re.search(r"(?m)^\[train 1\.0\] .*worker 1: registered with the scheduler", r.stdout)
    assert "[train 0.0] compression: onebit" in r.stdout
    r = _run(["launch", "--config", _local_yaml(tmp), "--log-level", "error", "--"] + DIGITS)
    assert r.returncode == 0, r.stdout
    assert "compression:" not in r.stdout and "[info]" not in r.stdout, r.stdout
    r = _run(["launch", "--config", _local_yaml(tmp), "--log-level", "loud", "--"] + DIGITS)
    assert r.returncode == 2 and "--log-level='loud'" in r.stdout, r.stdout


def test_daemon_mode_counts_bytes_pushed_and_ranks_every_process(tmp):
    # --local-size 2 over the example's `processes: 1`: 2 nodes x 2 processes, one daemon per
    # node. Every process must get its own rank (4 shards), and the node's bytes are reported
    # to its processes: the same bytes as the embedded run of the same model and steps.
    summaries = {}
    for mode, extra in (("embedded", []), ("daemon", ["--local-size", "2"])):
        out = os.path.join(tmp, mode + ".json")
        r = _run(["launch", "--config", _local_yaml(tmp)] + extra + ["--"] + DIGITS +
                 ["--steps", "5", "--json", out])
        assert r.returncode == 0, r.stdout
        with open(out) as f:
            summaries[mode] = json.load(f)
    assert summaries["embedded"]["workers"] == 2, summaries
    assert summaries["daemon"]["workers"] == 4, summaries
    assert summaries["embedded"]["steps"] == summaries["daemon"]["steps"] == 5, summaries
    assert summaries["embedded"]["bytes_pushed"] > 0, summaries
    assert summaries["daemon"]["bytes_pushed"] == summaries["embedded"]["bytes_pushed"], summaries


def test_keygen_writes_private_keys_and_the_public_list_and_keeps_them_unless_forced(tmp):
    cfg = _write_yaml(tmp, workers=1)
    with open(cfg, "a") as f:
        f.write("security:\n  mode: curve\n  keys_dir: keys\n")
    r = _run(["keygen", "--config", cfg])
    assert r.returncode == 0, r.stdout
    keys = os.path.join(tmp, "keys")
    names = sorted(os.listdir(keys))
    assert names == ["public_keys", "scheduler.key", "server-0.key", "worker-0.key"]
    for n in names:
        mode = os.stat(os.path.join(keys, n)).st_mode & 0o777
        assert mode == (0o644 if n == "public_keys" else 0o600), (n, oct(mode))
    with open(os.path.join(keys, "public_keys")) as f:
        listed = [l.split()[0] for l in f if l.strip() and not l.startswith("#")]
    assert listed == ["scheduler", "server:0", "worker:0"]
    before = open(os.path.join(keys, "worker-0.key")).read()
    assert _run(["keygen", "--config", cfg]).returncode == 0
    assert open(os.path.join(keys, "worker-0.key")).read() == before  # kept
    assert _run(["keygen", "--config", cfg, "--force"]).returncode == 0
    assert open(os.path.join(keys, "worker-0.key")).read() != before  # replaced


def test_a_daemon_with_a_key_others_may_read_stops_with_a_config_error_naming_it(tmp):
    cfg = _write_yaml(tmp, workers=1)
    with open(cfg, "a") as f:
        f.write("security:\n  mode: curve\n  keys_dir: keys\n")
    assert _run(["keygen", "--config", cfg]).returncode == 0
    key = os.path.join(tmp, "keys", "server-0.key")
    os.chmod(key, 0o640)
    r = subprocess.run([os.path.join(_bin_dir(), "bitpush-server"), "--config", cfg, "--rank",
                        "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                       universal_newlines=True)
    assert r.returncode == 2, r.stdout
    assert "config error" in r.stdout and key in r.stdout and "chmod 600" in r.stdout, r.stdout
    os.remove(os.path.join(tmp, "keys", "scheduler.key"))
    r = subprocess.run([os.path.join(_bin_dir(), "bitpush-scheduler"), "--config", cfg],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                       universal_newlines=True)
    assert r.returncode == 2 and "scheduler.key" in r.stdout, r.stdout
