"""Chaos (ctest label `chaos`, docs/launch.md "Restarts"): a job of 2 workers and 2 servers
trains under `bitpush launch --max-restarts` while a killer sends SIGKILL to a random process of
a random role five times — the scheduler, a server and a training process at least once each
(and a worker daemon, in daemon mode) —
and the job ends by itself with the parameters of an uninterrupted run of the same steps, bit
for bit, with no person involved.

Four jobs: CLAN with onebit and error feedback on both sides, with cluster.server_rejoin_timeout_s
set (a dead server is started again in place and the workers roll back to their checkpoint; any
other death restarts the whole job); AdamW on the workers with SDP4Bit (TLq-HS pushes, random
streams per (key, round): the checkpoint moves every tensor to its saved round); AdamW on
the servers with SDP4Bit (TLq-HS pushes, qWD pulls); and, in daemon mode (2 training processes
per node behind its bitpush-worker, which is killed too), CLAN with random-k and error feedback
on both sides: the servers' residuals and the rounds come back through the daemon. The training command is examples/train_digits.py with
--checkpoint-dir (bitpush.torch.Checkpointer); the uninterrupted run is the same command in the
same cluster YAML without kills or checkpoints.

BITPUSH_CHAOS_SOAK=S adds a soak: job after job, the kinds in turn, each killed after every
stretch of progress until it ends and each checked bit for bit, for S seconds (run by hand;
docs/launch.md reports one).
"""
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from bitpush.testing import free_ports, launched_processes

PY = "/usr/bin/python3"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DIGITS = os.path.join(ROOT, "examples", "train_digits.py")
EVERY = 20  # steps between checkpoints
EPOCHS = 40
TOTAL = EPOCHS * 21  # steps: 1347 training digits // (2 workers x 32)

JOBS = {
    "clan-onebit-both-rejoin": {
        "yaml": "compression:\n  spec: onebit\n  error_feedback: both\n",
        "rejoin": True,
        "args": ["--optimizer", "clan", "--compression", "onebit"],
    },
    "worker-adamw-sdp4bit": {
        "yaml": "compression:\n  spec: sdp4bit\n  error_feedback: none\n",
        "rejoin": False,
        "args": ["--optimizer", "adamw", "--compression", "sdp4bit"],
    },
    # Daemon mode (2 training processes per node behind a bitpush-worker): the servers'
    # residuals and the per-round random streams come back through the node's daemon.
    # (Without server_rejoin_timeout_s: with 2 processes per node, a server that dies while a
    # node is partway through gathering a round can stall the in-place recovery until the
    # gather timeout; docs/training.md, "A server restarted alone".)
    "daemon-clan-randomk-both": {
        "yaml": "compression:\n  spec: randomk:ratio=0.25\n  error_feedback: both\n",
        "worker_yaml": "  local_size: 2\n",
        "rejoin": False,
        "args": ["--optimizer", "clan", "--compression", "randomk:ratio=0.25"],
        "epochs": 2 * EPOCHS,  # half the steps per epoch: room for five kills
        "total": 2 * EPOCHS * 10,  # 1347 training digits // (4 processes x 32)
        "roles": ["scheduler", "server", "daemon", "train"],
    },
    "server-adamw-sdp4bit": {
        "yaml": "compression:\n  spec: sdp4bit\n  error_feedback: none\n"
                "optimizer:\n  placement: server\n  pull: sdp4bit:hadamard=off,group=2048\n",
        "rejoin": False,
        "args": ["--optimizer", "adamw", "--server-side", "--compression", "sdp4bit"],
    },
}


def _yaml(d, job):
    ports = free_ports(5)
    path = os.path.join(d, "cluster.yaml")
    with open(path, "w") as f:
        f.write("cluster:\n  scheduler: 127.0.0.1:%d\n" % ports[0])
        f.write("  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (ports[1], ports[2]))
        f.write("  workers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (ports[3], ports[4]))
        f.write("  heartbeat_interval_ms: 200\n  heartbeat_timeout_ms: 1000\n"
                "  startup_timeout_s: 30\n")
        if job["rejoin"]:
            f.write("  server_rejoin_timeout_s: 20\n")
        f.write(job["yaml"])
        f.write("server:\n  engine_threads: 1\n  numa: off\n")
        f.write("worker:\n  compress_threads: 1\n  op_timeout_s: 60\n")
        f.write(job.get("worker_yaml", ""))
    return path


def _newest_checkpoint(ckpt):
    try:
        names = os.listdir(ckpt)
    except OSError:
        return -1
    steps = [int(n[5:]) for n in names if n.startswith("step-")
             and os.path.exists(os.path.join(ckpt, n, "COMPLETE"))]
    return max(steps, default=-1)


class _Killer(threading.Thread):
    """SIGKILLs a random child of the launcher of a random role after each stretch of
    progress: a checkpoint begun after the last kill, then 0.05-0.5 s more. A fast
    machine runs the whole job in 3 s (250 steps a second): five kills must fit before its end,
    and each restart goes back to the last checkpoint."""

    def __init__(self, launcher_pid, ckpt, total, kills, seed, roles=("scheduler", "server",
                                                                     "train")):
        super().__init__(daemon=True)
        self.pid, self.ckpt, self.total = launcher_pid, ckpt, total
        self.rng = random.Random(seed)
        roles = list(roles)
        roles += [self.rng.choice(roles) for _ in range(kills - len(roles))]
        self.rng.shuffle(roles)
        self.roles = roles
        self.done = []  # (role, pid, time of the kill)
        self.stop = threading.Event()

    def run(self):
        last = -1
        while not self.stop.is_set():
            if len(self.done) == len(self.roles):
                return
            newest = _newest_checkpoint(self.ckpt)
            if newest <= last or newest > self.total - 3 * EVERY:
                time.sleep(0.02)
                continue
            if self.stop.wait(self.rng.uniform(0.05, 0.5)):
                return
            # A fast machine may have run to the end meanwhile: a process that has exited (a
            # zombie the launcher has not reaped yet) takes a SIGKILL without dying of it.
            if _newest_checkpoint(self.ckpt) > self.total - 2 * EVERY:
                last = _newest_checkpoint(self.ckpt)
                continue
            role = self.roles[len(self.done)]
            victims = [p for p, r in launched_processes(self.pid) if r == role and _alive(p)]
            if not victims:
                continue
            victim = self.rng.choice(victims)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.done.append((role, victim, time.monotonic()))
            # The next kill waits for a checkpoint begun after this one: the checkpoint in
            # flight now may still complete, and a kill right after it would strike before the
            # job recovered (an in-place server rejoin would then never be seen to heal).
            last = _newest_checkpoint(self.ckpt) + EVERY


def _alive(pid):
    """Running, not a zombie (/proc/PID/stat's state)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _launch(cfg, out_json, args, max_restarts=None, ckpt=None):
    cmd = [PY, "-m", "bitpush.launch", "launch", "--config", cfg]
    if max_restarts is not None:
        cmd += ["--max-restarts", str(max_restarts)]
    cmd += ["--", PY, DIGITS, "--no-progress", "--json", out_json] + args
    if ckpt is not None:
        cmd += ["--checkpoint-dir", ckpt, "--checkpoint-every", str(EVERY)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="bp-chaos-")
    yield d
    subprocess.run(["pkill", "-9", "-f", d])
    subprocess.run(["rm", "-rf", d])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_five_kills_end_bit_identical_to_the_uninterrupted_run(tmp, name):
    job = JOBS[name]
    args = job["args"] + ["--epochs", str(job.get("epochs", EPOCHS))]
    cfg = _yaml(tmp, job)
    want, ref_wall = _reference(tmp, cfg, args)
    got, kills, out, wall = _chaos_run(tmp, job, cfg, args, kills=5, seed=sum(map(ord, name)))
    assert len(kills) == 5, (kills, out)
    _check(job, want, got, kills, out)
    print("%s: %d kills (%s), %.1f s against %.1f s uninterrupted; resumed at steps %s"
          % (name, len(kills), ", ".join(r for r, _, _ in kills), wall, ref_wall,
             re.findall(r"resumed from \S+ \(step (\d+)", out)
             + re.findall(r"back to step (\d+)", out)))


@pytest.mark.skipif(not os.environ.get("BITPUSH_CHAOS_SOAK"),
                    reason="the soak runs with BITPUSH_CHAOS_SOAK=seconds")
def test_soak(tmp):
    """Job after job, the three kinds in turn (each killed until it ends, a kill after each
    stretch of progress), each checked bit for bit, for BITPUSH_CHAOS_SOAK seconds."""
    kinds = {}
    for name in sorted(JOBS):
        job = JOBS[name]
        args = job["args"] + ["--epochs", str(job.get("epochs", EPOCHS))]
        os.makedirs(os.path.join(tmp, name))
        cfg = _yaml(os.path.join(tmp, name), job)
        want, ref_wall = _reference(os.path.join(tmp, name), cfg, args)
        kinds[name] = dict(job=job, args=args, cfg=cfg, want=want, ref_wall=ref_wall, jobs=0,
                           walls=[], kills=[])
    deadline = time.monotonic() + float(os.environ["BITPUSH_CHAOS_SOAK"])
    jobs = 0
    while time.monotonic() < deadline:
        name = sorted(kinds)[jobs % len(kinds)]
        k = kinds[name]
        got, kills, out, wall = _chaos_run(os.path.join(tmp, name), k["job"], k["cfg"], k["args"],
                                           kills=500, seed=jobs)
        _check(k["job"], k["want"], got, kills, out)
        jobs += 1
        k["jobs"] += 1
        k["kills"] += kills
        k["walls"].append(wall)
        print("soak job %d (%s): %d kills, %.1f s, bit-identical" % (jobs, name, len(kills), wall),
              flush=True)
    for name, k in sorted(kinds.items()):
        roles = {r: sum(1 for x in k["kills"] if x[0] == r)
                 for r in k["job"].get("roles", ("scheduler", "server", "train"))}
        print("soak %s: %d jobs, %d kills (%s), every job bit-identical; %.1f s a job on average "
              "against %.1f s uninterrupted" % (name, k["jobs"], len(k["kills"]), roles,
                                                sum(k["walls"]) / max(1, len(k["walls"])),
                                                k["ref_wall"]))


def _reference(tmp, cfg, args):
    t0 = time.monotonic()
    ref = _launch(cfg, os.path.join(tmp, "ref.json"), args)
    ref_out, _ = ref.communicate(timeout=300)
    assert ref.returncode == 0, ref_out
    with open(os.path.join(tmp, "ref.json")) as f:
        return json.load(f), time.monotonic() - t0


def _chaos_run(tmp, job, cfg, args, kills, seed):
    ckpt = os.path.join(tmp, "ckpt")
    subprocess.run(["rm", "-rf", ckpt, os.path.join(tmp, "chaos.json")])
    t0 = time.monotonic()
    run = _launch(cfg, os.path.join(tmp, "chaos.json"), args, max_restarts=kills + 10, ckpt=ckpt)
    killer = _Killer(run.pid, ckpt, job.get("total", TOTAL), kills=kills, seed=seed,
                     roles=job.get("roles", ("scheduler", "server", "train")))
    killer.start()
    try:
        out, _ = run.communicate(timeout=600)
    finally:
        killer.stop.set()
        killer.join(5)
    wall = time.monotonic() - t0
    assert run.returncode == 0, out
    with open(os.path.join(tmp, "chaos.json")) as f:
        return json.load(f), killer.done, out, wall


def _check(job, want, got, kills, out):

    # One log line per death, naming the process and how it died. A loaded machine may add
    # restarts of its own (a node that missed its heartbeats); they are named as well.
    restarts = [l for l in out.splitlines() if l.startswith("bitpush launch: restart ")]
    for role, pid, _ in kills:
        mine = [l for l in restarts if "(pid %d) killed by SIGKILL; " % pid in l]
        assert len(mine) == 1, (role, pid, restarts)
        label = {"daemon": "worker"}.get(role, role)  # the launcher's name of a node daemon
        assert re.match(r"bitpush launch: restart \d+ of \d+: %s[ .\d]* \(pid %d\) "
                        % (label, pid), mine[0]), mine[0]
        in_place = mine[0].endswith(
            "starting it again in place (cluster.server_rejoin_timeout_s)")
        assert in_place == (role == "server" and job["rejoin"]), mine[0]
    if job["rejoin"]:
        # Each server healed in place: the training processes waited for it and went back to
        # their checkpoint (Checkpointer.recover) instead of failing into a whole-job restart.
        healed = out.count("bitpush: a server restarted; back to step")
        assert healed >= sum(1 for r, _, _ in kills if r == "server"), (healed, kills, out)
    extra = [l for l in restarts if not any("(pid %d)" % pid in l for _, pid, _ in kills)]
    if extra:
        print("restarts no kill caused:\n" + "\n".join(extra))
        if os.environ.get("BITPUSH_CHAOS_LOG"):
            with open("%s.extra.%d" % (os.environ["BITPUSH_CHAOS_LOG"], os.getpid()), "a") as f:
                f.write(out + "\n\n")
    assert got["steps"] == want["steps"] == job.get("total", TOTAL)
    assert got["params_sha256"] == want["params_sha256"], (want, got, out)
