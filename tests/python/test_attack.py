"""The attack suite (docs/security.md): each attack a network attacker can try, as a separate
real process (bitpush-test-attacker, tests/tools/attacker.cc) against a real cluster on
loopback (bitpush-scheduler, a bitpush-server, two training processes with in-process workers),
in the middle of training.

Under security.mode curve every attack is refused and counted, the job completes with
bit-exact results, the attacked process's memory and log stay bounded. Under security.mode
none the suite shows which attacks still work (expected: nobody proves who they are) and which
bounds hold anyway. The local-socket attack (a listener planted at the daemon's path) is
local_ipc_attack_test / daemon_attack_test. ctest runs each attack as its own entry
(attack_<name>).
"""
import os
import re
import subprocess
import time
import urllib.request

import pytest
import torch

import bitpush.torch as bp
from bitpush.testing import LocalCluster, free_ports

STEPS = 300
N = 4096
ATTACKER = os.environ.get("BITPUSH_ATTACKER") or os.path.join(
    os.environ.get("BITPUSH_BIN_DIR", ""), "bitpush-test-attacker")


def train_worker(steps, sleep_s, stop_file):
    """Runs exact push_pulls (integers summed in fp32) and reports the wrong ones: at least
    `steps`, then on until `stop_file` exists (the test has read its counters, so the job
    outlasts the attack however slowly the attacker ran), at most 20 x `steps`. Every worker
    stops at the same step: each step also sums whether anyone has seen the file."""
    bp.init()
    r, size = bp.rank(), bp.size()
    wrong = []
    for s in range(20 * steps):
        x = torch.full((N,), float(r + 1 + s))
        y = bp.push_pull(x, "grad", average=False)
        expected = float(sum(w + 1 + s for w in range(size)))
        if not torch.equal(y, torch.full((N,), expected)):
            wrong.append(s)
        seen = bp.push_pull(torch.tensor([1.0 if os.path.exists(stop_file) else 0.0]), "stop",
                            average=False)
        if s + 1 >= steps and float(seen[0]) > 0:
            break
        time.sleep(sleep_s)
    return {"wrong": wrong}


def _metric(port, name, labels):
    """The value of metric `name{labels}` at 127.0.0.1:port (0 when absent)."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if m and m.group(1) == name and ",".join(sorted(m.group(2).split(","))) == want:
            return float(m.group(3))
    return 0.0


def _peak_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


# attack -> (the process attacked, the attacker's arguments)
ATTACKS = {
    "forged_done": ("scheduler", ["forged-done", "--as", "worker:0,worker:1"]),
    "forged_shutdown": ("server", ["forged-shutdown", "--as", "scheduler"]),
    "takeover": ("server", ["takeover", "--as", "worker:0", "--hold-ms", "2000"]),
    "future_push": ("server", ["future-push", "--as", "worker:0", "--key", "0"]),
    "big_frame": ("server", ["big-frame", "--bytes", str(256 << 20)]),
    "malformed_loop": ("server", ["malformed-loop", "--as", "worker:0", "--count", "2000"]),
}


def _run(mode, attack, op_timeout_s=20):
    """Starts the cluster and the training, attacks once training runs, and returns what
    happened: the workers' results, the attacked process's refusal counters, its peak memory
    growth and its log."""
    target_kind, args = ATTACKS[attack]
    # Metrics of the scheduler, the server and the two worker nodes: four consecutive ports
    # taken before the cluster's own (free_ports hands them out in order).
    while True:
        block = free_ports(4)
        if block == list(range(block[0], block[0] + 4)):
            break
    metrics_port = block[0]
    with LocalCluster(workers=2, servers=1, security=mode, op_timeout_s=op_timeout_s,
                      heartbeat_interval_ms=100, heartbeat_timeout_ms=1000,
                      extra={"metrics": {"port": metrics_port}}) as c:
        stop_file = os.path.join(c.dir, "attack-done")
        procs = [c.start_worker(train_worker, (STEPS, 0.02, stop_file), w) for w in range(2)]
        # Registered (the scheduler sent the assignments) and training: however long the
        # processes take to start on a loaded machine.
        deadline = time.monotonic() + 60
        while "sending assignments" not in c.scheduler.output():
            assert time.monotonic() < deadline, "the nodes did not register within 60 s"
            time.sleep(0.05)
        time.sleep(1.0)
        if target_kind == "scheduler":
            proc, address, port = c.scheduler, c.scheduler_address, metrics_port
        else:
            proc, address, port = c.server_procs[0], c.server_addresses[0], metrics_port + 1
        rss_before = _peak_rss_kb(proc.pid)
        attacker = subprocess.run([ATTACKER] + args + ["--target", "tcp://" + address],
                                  capture_output=True, text=True, timeout=60)
        assert attacker.returncode == 0, attacker.stderr
        time.sleep(0.5)
        counters = {}
        if proc.poll() is None:
            rss_growth_kb = _peak_rss_kb(proc.pid) - rss_before
            for reason in ("authentication", "limit"):
                counters[reason] = _metric(port, "bitpush_transport_connections_refused_total",
                                           {"reason": reason})
            for reason in ("sender_role", "malformed_header", "transport"):
                counters[reason] = _metric(port, "bitpush_endpoint_messages_refused_total",
                                           {"reason": reason})
        else:
            rss_growth_kb = None  # the attacked process is gone
        with open(stop_file, "w"):
            pass
        results = c.wait_workers(procs, timeout=90)
        log = proc.output()
        return results, counters, rss_growth_kb, log, c.describe(results)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_is_refused_under_curve(attack):
    results, counters, rss_growth_kb, log, description = _run("curve", attack)
    # The job completes, bit-exact, untouched.
    assert all(r.ok for r in results), description
    assert all(r.value["wrong"] == [] for r in results), description
    # The attacker never got past the CURVE handshake, and was counted.
    assert counters["authentication"] >= 1, (counters, description)
    assert counters["sender_role"] == 0 and counters["malformed_header"] == 0, counters
    # Memory: the 256 MiB frame (or anything else) was not buffered.
    assert rss_growth_kb is not None and rss_growth_kb < 32 * 1024, rss_growth_kb
    # Log: at most a few lines about the attacker, however often it tried.
    refusals = [l for l in log.splitlines() if "refused" in l]
    assert len(refusals) <= 3, refusals


# What an unauthenticated attacker achieves when nobody proves who they are.
def test_under_none_a_forged_done_ends_the_job_and_the_workers_fail_at_once_naming_it():
    results, _, _, _, description = _run("none", "forged_done")
    failed = [r for r in results if not r.ok]
    assert failed, "the forged Done did not end the job under security.mode none: " + description
    assert all("shut the cluster down" in r.output for r in failed), description


def test_under_none_a_forged_shutdown_kills_the_server_and_the_job_fails():
    results, _, _, _, description = _run("none", "forged_shutdown")
    assert not all(r.ok for r in results), description


def test_under_none_a_takeover_of_a_workers_name_stalls_the_job():
    # The impostor's connection takes "worker:0" at the server (ZeroMQ's handover): the real
    # worker's pushes are lost and every worker times out.
    results, _, _, _, description = _run("none", "takeover", op_timeout_s=5)
    assert not all(r.ok for r in results), description
    assert any("timed out" in r.output for r in results), description


def test_under_none_a_forged_push_for_a_future_round_stalls_the_job():
    results, _, _, _, description = _run("none", "future_push", op_timeout_s=5)
    assert not all(r.ok for r in results), description


def test_under_none_the_size_bound_still_refuses_a_256_mib_frame():
    results, _, rss_growth_kb, _, description = _run("none", "big_frame")
    assert all(r.ok for r in results), description
    assert all(r.value["wrong"] == [] for r in results), description
    assert rss_growth_kb is not None and rss_growth_kb < 96 * 1024, rss_growth_kb


def test_under_none_malformed_messages_in_a_loop_leave_a_bounded_log():
    results, counters, _, log, description = _run("none", "malformed_loop")
    refusals = [l for l in log.splitlines() if "malformed" in l or "refused" in l]
    assert counters["malformed_header"] >= 1000, counters
    assert len(refusals) <= 3, refusals
