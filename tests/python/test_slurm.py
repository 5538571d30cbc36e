"""`bitpush launch --slurm` (python/bitpush/slurm.py, docs/launch.md "Slurm").

Unit tests: Slurm's host-list and count syntaxes, reading a job from a Slurm environment (and
the errors naming the variable), the placement rule as exact YAML, the overlay merge, the srun
command, and the launcher's usage errors.

Then a real one-node Slurm cluster on this machine: munged with a throwaway key, slurmctld and
slurmd from Debian's slurm-wlm with a throwaway slurm.conf (ports below the ephemeral range),
all under a temporary directory. `sbatch --wait` runs a batch script whose
`bitpush launch --slurm` runs srun itself, and the digits example trains one epoch with two
training processes (the job's two tasks); a second job checks that `srun -n2 bitpush launch
--slurm` (two launchers on one node) is refused naming SLURM_STEP_TASKS_PER_NODE. Skipped with
the reason when the Slurm or munge binaries are missing, when not root (slurmd runs jobs as
their user), or when a daemon exits during start-up (its log is shown). Every wait is bounded
and names what it waited for; the daemons are stopped and no process that saw the temporary
directory is left.
"""
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time

import pytest

from bitpush import _C, slurm
from bitpush.slurm import SlurmError
from bitpush.testing import ephemeral_port_range, free_ports

PY = "/usr/bin/python3"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- host lists and counts --------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("a.b-c_d,x[5]y", ["a.b-c_d", "x5y"]),
    (" node[1,3] ", ["node1", "node3"]),
])
def test_expand_hostlist(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, why", [
    ("", "SLURM_JOB_NODELIST is empty"),
    ("n[1-", "'[' without ']'"),
    ("n1-]", "']' without '['"),
    ("n[[1]]", "nested '['"),
    ("n[]", "empty '[]'"),
    ("n[3-1]", "range '3-1' runs backwards"),
    ("n[a-b]", "bad range 'a-b' in '[a-b]'"),
    ("n[1-]", "bad range '1-' in '[1-]'"),
    ("a,,b", "empty entry"),
    ("x y", "'x y' is not a host name"),
    ("n[1-2],n2", "host n2 is listed twice"),
    ("n[1-999999]", "more than 65536 hosts"),
])
def test_expand_hostlist_errors_name_the_variable(text, why):
    with pytest.raises(SlurmError) as e:
        slurm.expand_hostlist(text)
    assert "SLURM_JOB_NODELIST" in str(e.value) and why in str(e.value)


def test_expand_counts():
    assert slurm.expand_counts("2(x3),1", "V") == [2, 2, 2, 1]
    assert slurm.expand_counts("4", "V") == [4]
    for bad in ("", "0", "2(x0)", "x", "2(3)", "2,,1"):
        with pytest.raises(SlurmError, match="^V="):
            slurm.expand_counts(bad, "V")


# -- the job from the environment --------------------------------------------------------------

BATCH = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
# What the launcher's own srun step sees on node n2.
STEP = dict(BATCH, SLURM_STEP_ID="0", SLURM_STEP_NODELIST="n[1-2]", SLURM_NODEID="1",
            SLURM_TASKS_PER_NODE="1(x2)", SLURM_STEP_TASKS_PER_NODE="1(x2)",
            SLURMD_NODENAME="n2", BITPUSH_SLURM_TASKS_PER_NODE="2,2")


def test_read_job_outside_a_step():
    job = slurm.read_job(BATCH)
    assert (job.job_id, job.nodes, job.processes, job.gpus, job.node_id, job.tasks_per_node) \
        == (42, ["n1", "n2"], [2, 2], 0, None, [2, 2])
    assert not job.in_step


def test_read_job_in_the_launchers_step():
    job = slurm.read_job(STEP)
    assert (job.nodes, job.processes, job.gpus, job.node_id, job.this_node) \
        == (["n1", "n2"], [2, 2], 0, 1, "n2")
    assert job.sources["processes"] == "BITPUSH_SLURM_TASKS_PER_NODE"


def test_read_job_uneven_tasks():
    env = dict(STEP, SLURM_JOB_NODELIST="a,b,c", SLURM_STEP_NODELIST="a,b,c", SLURM_NODEID="0",
               SLURMD_NODENAME="a", BITPUSH_SLURM_TASKS_PER_NODE="3,3,1")
    assert slurm.read_job(env).processes == [3, 3, 1]


def test_read_job_in_a_users_srun_step_runs_one_process_per_node():
    env = {k: v for k, v in STEP.items() if k != "BITPUSH_SLURM_TASKS_PER_NODE"}
    job = slurm.read_job(env)
    assert job.processes == [1, 1] and job.sources["processes"] == "default"
    assert slurm.read_job(env, local_size=3).processes == [3, 3]


def test_read_job_gpus():
    for extra in ({"SLURM_GPUS_ON_NODE": "4"}, {"SLURM_JOB_GPUS": "0,1,2,3"},
                  {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, {"SLURM_GPUS_PER_NODE": "a100:4"}):
        job = slurm.read_job(dict(STEP, BITPUSH_SLURM_TASKS_PER_NODE="1,1", **extra))
        assert (job.processes, job.gpus) == ([4, 4], 4), extra
    # Tasks equal to the GPUs are fine; --local-size takes the first GPUs.
    job = slurm.read_job(dict(STEP, BITPUSH_SLURM_TASKS_PER_NODE="4,4", SLURM_GPUS_ON_NODE="4"))
    assert (job.processes, job.gpus) == ([4, 4], 4)
    job = slurm.read_job(dict(STEP, SLURM_GPUS_ON_NODE="4"), local_size=2)
    assert (job.processes, job.gpus) == ([2, 2], 2)
    # No GPU: CUDA_VISIBLE_DEVICES empty or Slurm's NoDevFiles.
    assert slurm.read_job(dict(STEP, CUDA_VISIBLE_DEVICES="")).gpus == 0
    assert slurm.read_job(dict(STEP, CUDA_VISIBLE_DEVICES="NoDevFiles")).gpus == 0


@pytest.mark.parametrize("env, local_size, message", [
    ({"SLURM_JOB_NODELIST": "n1"}, None, "SLURM_JOB_ID is not set"),
    ({"SLURM_JOB_ID": "x", "SLURM_JOB_NODELIST": "n1"}, None, "SLURM_JOB_ID='x' is not an integer"),
    ({"SLURM_JOB_ID": "7"}, None, "SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-"}, None, "SLURM_JOB_NODELIST='n[1-'"),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}, None, "SLURM_TASKS_PER_NODE is not set"),
    (dict(BATCH, SLURM_TASKS_PER_NODE="2(x3)"), None,
     "SLURM_TASKS_PER_NODE='2(x3)' gives 3 node(s) but SLURM_JOB_NODELIST='n[1-2]' has 2"),
    (dict(STEP, SLURM_STEP_TASKS_PER_NODE="2(x2)"), None,
     "SLURM_STEP_TASKS_PER_NODE='2(x2)': bitpush launch --slurm runs one launcher per node"),
    (dict(STEP, SLURM_NODEID="2"), None, "SLURM_NODEID=2 but SLURM_STEP_NODELIST='n[1-2]' has 2"),
    ({k: v for k, v in STEP.items() if k != "SLURM_NODEID"}, None, "SLURM_NODEID is not set"),
    (dict(STEP, SLURMD_NODENAME="n7"), None, "SLURMD_NODENAME=n7 but node 1 of"),
    (dict(STEP, SLURM_GPUS_ON_NODE="4"), None,
     "BITPUSH_SLURM_TASKS_PER_NODE='2,2' gives node n1 2 task(s) but SLURM_GPUS_ON_NODE says "
     "4 GPU(s)"),
    (dict(STEP, SLURM_GPUS_ON_NODE="2", SLURM_GPUS_PER_NODE="4"), None,
     "SLURM_GPUS_ON_NODE gives this node 2 GPU(s) but SLURM_GPUS_PER_NODE='4' says 4"),
    (dict(STEP, SLURM_GPUS_PER_NODE="four"), None, "SLURM_GPUS_PER_NODE='four'"),
    (dict(STEP, SLURM_JOB_GPUS="0,,1"), None, "SLURM_JOB_GPUS='0,,1'"),
    (dict(STEP, SLURM_GPUS_ON_NODE="2"), 4, "--local-size 4 is more than the 2 GPU(s) of "
     "SLURM_GPUS_ON_NODE"),
])
def test_read_job_errors_name_the_variable(env, local_size, message):
    with pytest.raises(SlurmError) as e:
        slurm.read_job(env, local_size)
    assert message in str(e.value)


# -- placement ---------------------------------------------------------------------------------

def test_port_base_is_below_the_ephemeral_range():
    assert slurm.port_base(42) == 20420
    assert slurm.port_base(1200) == 20000
    assert slurm.port_base(1199) == 31990
    assert max(slurm.port_base(j) + slurm.PORT_BLOCK - 1 for j in range(2400)) == 31999
    assert slurm.port_base(1199) + slurm.PORT_BLOCK <= 32768


ADDRS = ["10.0.0.1", "10.0.0.2"]


def test_resolve_nodes():
    table = {"n1": "10.0.0.1", "n2": "10.0.0.2", "lo": "127.0.1.1"}

    def resolve(name):
        if name not in table:
            raise socket.gaierror(-2, "Name or service not known")
        return table[name]

    assert slurm.resolve_nodes(["n1", "n2"], resolve) == ADDRS
    assert slurm.resolve_nodes(["lo"], resolve) == ["127.0.1.1"]  # one node: loopback is fine
    with pytest.raises(SlurmError, match=r"node lo of SLURM_JOB_NODELIST resolves to 127.0.1.1 "
                                         r"\(loopback\) here; the other nodes"):
        slurm.resolve_nodes(["n1", "lo"], resolve)
    with pytest.raises(SlurmError, match="node n3 of SLURM_JOB_NODELIST does not resolve"):
        slurm.resolve_nodes(["n1", "n3"], resolve)


def test_cluster_section_is_the_documented_rule():
    assert slurm.cluster_section(slurm.read_job(STEP), ADDRS) == [
        "scheduler: 10.0.0.1:20420  # n1",
        "servers: {hosts: [10.0.0.1, 10.0.0.2], count: 1, port: 20422}",
        "workers:",
        "  - {host: 10.0.0.1, port: 20421, processes: 2}  # n1",
        "  - {host: 10.0.0.2, port: 20421, processes: 2}  # n2"]
    gpu = slurm.read_job(dict(STEP, BITPUSH_SLURM_TASKS_PER_NODE="1,1", SLURM_GPUS_ON_NODE="8"))
    assert slurm.cluster_section(gpu, ADDRS, servers_per_node=2)[1:] == [
        "servers: {hosts: [10.0.0.1, 10.0.0.2], count: 2, port: 20422}",
        "workers:",
        "  - {host: 10.0.0.1, port: 20421, gpus: 8}  # n1",
        "  - {host: 10.0.0.2, port: 20421, gpus: 8}  # n2"]
    for bad in (0, slurm.MAX_SERVERS_PER_NODE + 1):
        with pytest.raises(SlurmError, match="--servers-per-node must be 1..8"):
            slurm.cluster_section(gpu, ADDRS, bad)


OVERLAY = """\
# my knobs
cluster:
    # faster failure detection
    heartbeat_interval_ms: 200
    heartbeat_timeout_ms: 1000

# compression, agreed by all
compression:
  spec: onebit
"""


def test_merge_overlay_adds_the_placement_to_the_cluster_section():
    keys = slurm.cluster_section(slurm.read_job(STEP), ADDRS)
    assert slurm.merge_overlay(OVERLAY, keys) == """\
# my knobs
cluster:
    # faster failure detection
    heartbeat_interval_ms: 200
    heartbeat_timeout_ms: 1000
    scheduler: 10.0.0.1:20420  # n1
    servers: {hosts: [10.0.0.1, 10.0.0.2], count: 1, port: 20422}
    workers:
      - {host: 10.0.0.1, port: 20421, processes: 2}  # n1
      - {host: 10.0.0.2, port: 20421, processes: 2}  # n2

# compression, agreed by all
compression:
  spec: onebit
"""
    assert slurm.merge_overlay("", ["scheduler: a:1"]) == "cluster:\n  scheduler: a:1\n"


def test_merge_overlay_refuses_hosts_and_flow_style():
    with pytest.raises(SlurmError, match="o.yaml: cluster.servers: leave it out under --slurm"):
        slurm.merge_overlay("cluster:\n  servers: [a:1]\n", ["scheduler: a:1"], "o.yaml")
    with pytest.raises(SlurmError, match="block style"):
        slurm.merge_overlay("cluster: {startup_timeout_s: 5}\n", ["scheduler: a:1"])


def test_effective_yaml_parses_to_the_placement(tmp_path):
    job = slurm.read_job(STEP)
    text = slurm.add_worker_socket(slurm.cluster_yaml(job, ADDRS, OVERLAY), job.job_id)
    assert text.startswith("# bitpush launch --slurm: job 42, 2 node(s); placement by the "
                           "launcher (docs/launch.md)\n# my knobs\ncluster:\n")
    assert text.endswith("compression:\n  spec: onebit\nworker:\n  socket: "
                         "/tmp/bitpush-%d-slurm42-worker-{rank}.sock\n" % os.getuid())
    path = tmp_path / "c.yaml"
    path.write_text(text)
    cfg = _C.load_cluster_config(str(path))
    assert cfg["scheduler"] == "tcp://10.0.0.1:20420"
    assert cfg["servers"] == ["tcp://10.0.0.1:20422", "tcp://10.0.0.2:20422"]
    assert cfg["workers"] == ["tcp://10.0.0.1:20421", "tcp://10.0.0.2:20421"]
    assert cfg["worker_processes"] == [2, 2]
    assert cfg["worker_sockets"] == ["/tmp/bitpush-%d-slurm42-worker-%d.sock" % (os.getuid(), n)
                                     for n in (0, 1)]
    assert cfg["knobs"]["compression.spec"] == "onebit:scaled=true"
    assert cfg["knobs"]["cluster.heartbeat_interval_ms"] == "200"


def test_srun_argv():
    argv, variables = slurm.srun_argv(slurm.read_job(dict(BATCH, SLURM_TASKS_PER_NODE="3,1")),
                                      ["py", "-m", "bitpush.launch", "launch", "--slurm"],
                                      "/usr/bin/srun")
    assert argv == ["/usr/bin/srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                    "--whole", "--kill-on-bad-exit=1", "--export=ALL",
                    "py", "-m", "bitpush.launch", "launch", "--slurm"]
    assert variables == {"BITPUSH_SLURM_TASKS_PER_NODE": "3,1"}


# -- the launcher's command line -----------------------------------------------------------------

# A one-node step on this machine (node names resolve).
LOCAL_STEP = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_ID": "0",
              "SLURM_STEP_NODELIST": "localhost", "SLURM_NODEID": "0",
              "SLURM_STEP_TASKS_PER_NODE": "1", "BITPUSH_SLURM_TASKS_PER_NODE": "2"}


def _launcher_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(extra)
    return env


def _run_launcher(args, env, timeout=30):
    return subprocess.run([PY, "-m", "bitpush.launch", "launch"] + args, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, env, message", [
    (["--slurm", "--", "true"], {}, "SLURM_JOB_ID is not set"),
    (["--slurm", "--host", "n1"], LOCAL_STEP, "--host does not go with --slurm"),
    (["--slurm", "--config", "/nonexistent.yaml"], LOCAL_STEP,
     "--config /nonexistent.yaml: No such"),
    (["--", "true"], {}, "--config is required (or --slurm inside a Slurm allocation)"),
    (["--config", "x.yaml", "--servers-per-node", "2"], {}, "--servers-per-node goes with "
     "--slurm"),
])
def test_launcher_usage_errors(args, env, message):
    r = _run_launcher(args, _launcher_env(**env))
    assert r.returncode == 2, r.stdout
    assert message in r.stdout


def test_launcher_bad_overlay_names_the_key(tmp_path):
    overlay = tmp_path / "o.yaml"
    overlay.write_text("compression:\n  spec: twobit\n")
    r = _run_launcher(["--slurm", "--config", str(overlay)],
                      _launcher_env(TMPDIR=str(tmp_path), **LOCAL_STEP))
    assert r.returncode == 2, r.stdout
    assert "compression.spec: unknown compressor 'twobit'" in r.stdout
    assert "with the launcher's cluster keys added" in r.stdout


# -- a real Slurm cluster on this machine ----------------------------------------------------------

_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "srun", "sinfo", "scontrol", "scancel")


def _wait(what, predicate, timeout_s, procs=()):
    """Polls predicate() until true; TimeoutError naming `what`. A daemon in `procs` that
    exits meanwhile ends the wait with RuntimeError naming it."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        for name, p in procs:
            if p.poll() is not None:
                raise RuntimeError("%s exited with %s while waiting for %s"
                                   % (name, p.returncode, what))
        if time.monotonic() > deadline:
            raise TimeoutError("timed out after %.0f s waiting for %s" % (timeout_s, what))
        time.sleep(0.1)


def _pick_job_id():
    """A first job id whose port block (slurm.port_base) is free on loopback now."""
    rng = random.Random()
    for _ in range(200):
        job_id = rng.randrange(1000, 900000)
        base = slurm.port_base(job_id)
        socks = []
        try:
            for port in range(base, base + slurm.PORT_BLOCK):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return job_id
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of %d ports in %d..%d" % (slurm.PORT_BLOCK,
                                                               slurm.PORT_FIRST, 31999))


class _SlurmCluster:
    """munged + slurmctld + slurmd under `root`, node `localhost`, partition `debug`."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        # TMPDIR: the launcher's effective YAML goes there.
        self.env = dict(os.environ, SLURM_CONF=os.path.join(root, "slurm.conf"), TMPDIR=root)
        for k in list(self.env):
            if k.startswith("SLURM") and k != "SLURM_CONF":
                del self.env[k]

    def log(self, name):
        """The last lines of a daemon's output and log file."""
        text = []
        for suffix in (".out", ".log"):
            try:
                with open(os.path.join(self.root, name + suffix), errors="replace") as f:
                    text.append("".join(f.readlines()[-15:]))
            except OSError:
                pass
        return "".join(text) or "(no output)"

    def logs(self):
        return "\n".join("--- %s:\n%s" % (n, self.log(n)) for n in _DAEMONS)

    def _start(self, name, argv):
        out = open(os.path.join(self.root, name + ".out"), "w")
        from bitpush import _proc
        p = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=_proc.die_with_parent)
        out.close()
        self.procs.append((name, p))
        return p

    def start(self):
        r = self.root
        os.chmod(r, 0o755)  # munged wants its socket's directory searchable by all
        key = os.path.join(r, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = os.path.join(r, "munge.socket")
        self._start("munged", [shutil.which("munged"), "-F", "--key-file=" + key,
                               "--socket=" + self.munge_socket,
                               "--pid-file=" + os.path.join(r, "munged.pid"),
                               "--log-file=" + os.path.join(r, "munged.log"),
                               "--seed-file=" + os.path.join(r, "munged.seed")])
        _wait("munged's socket %s" % self.munge_socket,
              lambda: os.path.exists(self.munge_socket), 10, self.procs)
        low, _ = ephemeral_port_range()
        ctld_port, slurmd_port = free_ports(2)
        assert max(ctld_port, slurmd_port) < low
        for d in ("state", "spool"):
            os.mkdir(os.path.join(r, d))
        self.first_job_id = _pick_job_id()
        conf = textwrap.dedent("""\
            ClusterName=bitpushtest
            SlurmctldHost=localhost
            SlurmctldPort={ctld_port}
            SlurmdPort={slurmd_port}
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={munge}
            StateSaveLocation={r}/state
            SlurmdSpoolDir={r}/spool
            SlurmctldPidFile={r}/slurmctld.pid
            SlurmdPidFile={r}/slurmd.pid
            SlurmctldLogFile={r}/slurmctld.log
            SlurmdLogFile={r}/slurmd.log
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/none
            MpiDefault=none
            MailProg=/bin/true
            SchedulerType=sched/builtin
            ReturnToService=2
            FirstJobId={first_job_id}
            SlurmdParameters=config_overrides
            NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
            PartitionName=debug Nodes=localhost Default=YES MaxTime=10 State=UP
            """).format(ctld_port=ctld_port, slurmd_port=slurmd_port, munge=self.munge_socket,
                        r=r, first_job_id=self.first_job_id)
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(conf)
        self._start("slurmctld", [shutil.which("slurmctld"), "-D", "-i",
                                  "-f", self.env["SLURM_CONF"]])
        self._start("slurmd", [shutil.which("slurmd"), "-D", "-N", "localhost",
                               "-f", self.env["SLURM_CONF"]])
        _wait("node localhost to be idle (sinfo)", self._idle, 30, self.procs)

    def _idle(self):
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           timeout=10)
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def stop(self):
        """Lets the jobs' slurmstepd processes finish (they report to slurmctld, authenticated
        by munged), then stops slurmd, slurmctld and munged in that order. Returns what was
        still running after that (killed)."""
        daemons = {p.pid for _, p in self.procs}
        stray = lambda: [line for line in self.leftovers()  # noqa: E731
                         if int(line.split()[0]) not in daemons
                         and int(line.split()[1]) not in daemons]
        try:
            _wait("the jobs' slurmstepd processes to exit", lambda: not stray(), 20)
        except TimeoutError:
            pass  # reported below, with what is left
        for name, p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        left = self.leftovers()
        for line in left:  # ours: they have our directory in their environment
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except OSError:
                pass
        return left

    def leftovers(self):
        """'pid ppid command' of every process whose command line or environment mentions our
        directory (the daemons, slurmstepd, anything a job started)."""
        found = []
        me = os.getpid()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = f.read()
                with open("/proc/%s/stat" % pid, "rb") as f:
                    ppid = f.read().rsplit(b")", 1)[1].split()[1].decode()
            except (OSError, IndexError):
                continue
            if self.root.encode() in cmd or self.root.encode() in env:
                found.append("%s %s %s" % (pid, ppid,
                                           cmd.replace(b"\0", b" ").decode(errors="replace")))
        return found


@pytest.fixture(scope="module")
def slurm_cluster():
    missing = [b for b in _DAEMONS + _CLIENTS if shutil.which(b) is None]
    if missing:
        pytest.skip("Slurm/munge not installed (%s missing; deploy/install-deps.sh installs "
                    "slurm-wlm and munge)" % ", ".join(missing))
    if os.geteuid() != 0:
        pytest.skip("slurmd needs root to run jobs as their user")
    # Not under pytest's 0700 base: munged wants every directory above its socket searchable.
    root = tempfile.mkdtemp(prefix="bitpush-slurm-test-", dir="/tmp")
    cluster = _SlurmCluster(root)
    try:
        try:
            cluster.start()
        except RuntimeError as e:  # a daemon exited: this machine cannot run it
            pytest.skip("Slurm cannot run here: %s\n%s" % (e, cluster.logs()))
        except TimeoutError as e:
            pytest.fail("%s\n%s" % (e, cluster.logs()))
        yield cluster
    finally:
        left = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, "processes left running by the Slurm test (killed): %s" % left


def _bitpush():
    d = os.environ.get("BITPUSH_BIN_DIR")
    if not d:
        from bitpush import _build_info
        d = _build_info.BIN_DIR
    return os.path.join(d, "bitpush")


def _sbatch(cluster, name, script, timeout_s):
    """Runs `script` as a batch job and waits for it (scontrol, every 0.2 s: sbatch --wait
    polls every few seconds); (job id, exit status, output)."""
    path = os.path.join(cluster.root, name + ".sh")
    out = os.path.join(cluster.root, name + ".out")
    with open(path, "w") as f:
        f.write(script)
    r = subprocess.run(["sbatch", "--parsable", "--chdir", REPO, "--output", out,
                        "--job-name", name, path], env=cluster.env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    assert r.returncode == 0, r.stdout
    job_id = int(r.stdout.strip().split(";")[0])
    fields = {}

    def done():
        q = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], env=cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=10)
        fields.update(kv.split("=", 1) for kv in q.stdout.split() if "=" in kv)
        return fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                          "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")

    try:
        _wait("batch job %d (%s) to end" % (job_id, name), done, timeout_s)
    except TimeoutError as e:
        subprocess.run(["scancel", str(job_id)], env=cluster.env, timeout=10)
        raise TimeoutError("%s; its output so far:\n%s" % (e, _read(out))) from None
    status = int(fields.get("ExitCode", "-1:0").split(":")[0])
    return job_id, status, "%s (%s)\n%s" % (fields.get("JobState"), fields.get("ExitCode"),
                                            _read(out))


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return "(no output)"


def test_sbatch_trains_digits(slurm_cluster):
    overlay = os.path.join(slurm_cluster.root, "overlay.yaml")
    with open(os.path.join(REPO, "deploy", "examples", "local.yaml")) as f:
        local = f.read()
    # local.yaml's knobs without its hosts: the overlay a user would write.
    with open(overlay, "w") as f:
        f.write("\n".join(line for line in local.splitlines()
                          if not line.strip().startswith(("scheduler:", "servers:",
                                                          "workers:"))) + "\n")
    script = textwrap.dedent("""\
        #!/bin/sh
        #SBATCH --nodes=1
        #SBATCH --ntasks-per-node=2
        #SBATCH --time=2
        exec {bitpush} launch --slurm --config {overlay} -- \\
            {py} examples/train_digits.py --epochs 1 --no-progress
        """).format(bitpush=_bitpush(), overlay=overlay, py=PY)
    t0 = time.monotonic()
    job_id, rc, out = _sbatch(slurm_cluster, "digits", script, 120)
    took = time.monotonic() - t0
    assert rc == 0, out
    base = slurm.port_base(job_id)
    assert ("bitpush launch: slurm job %d: one launcher on each of 1 node(s) (localhost)"
            % job_id) in out, out
    assert ("slurm job %d: 1 node(s) (localhost); scheduler on localhost; 1 server(s) per "
            "node; 2 training process(es) per node (BITPUSH_SLURM_TASKS_PER_NODE); ports %d-%d"
            % (job_id, base, base + 9)) in out, out
    assert "starting scheduler, server 0, worker 0, train 0.0, train 0.1" in out, out
    assert "[train 0.0] summary: digits" in out and "test accuracy" in out, out
    assert "bitpush launch: 5 processes, all exited 0" in out, out
    # The effective YAML is removed when the launcher exits.
    assert not os.path.exists(os.path.join(slurm_cluster.root, "bitpush-slurm-%d.yaml" % job_id))
    print("sbatch digits job: %.1f s\n%s" % (took, out))


def test_sbatch_max_restarts_starts_the_job_again_inside_the_allocation(slurm_cluster):
    # A training process that fails in the first run: the node's launcher (inside the srun
    # step) starts the whole job again, daemon included, within the same allocation.
    trainer = os.path.join(slurm_cluster.root, "fail_once.py")
    with open(trainer, "w") as f:
        f.write(textwrap.dedent("""\
            import os, sys
            import torch
            import bitpush.torch as bp
            run = int(os.environ["BITPUSH_RESTART_COUNT"])
            if run == 0 and os.environ["BITPUSH_LOCAL_RANK"] == "1":
                print("boom in run 0", flush=True)
                sys.exit(3)
            bp.init()
            avg = bp.push_pull(torch.full((8,), float(bp.rank())), "t")
            print("run %d rank %d avg %.1f" % (run, bp.rank(), avg[0].item()), flush=True)
            bp.shutdown()
            """))
    script = textwrap.dedent("""\
        #!/bin/sh
        #SBATCH --nodes=1
        #SBATCH --ntasks-per-node=2
        #SBATCH --time=2
        exec {bitpush} launch --slurm --max-restarts 2 -- {py} {trainer}
        """).format(bitpush=_bitpush(), py=PY, trainer=trainer)
    job_id, rc, out = _sbatch(slurm_cluster, "restart", script, 120)
    assert rc == 0, out
    assert re.search(r"bitpush launch: restart 1 of 2: train 0\.1 \(pid \d+\) exited with 3; last "
                     r"line: boom in run 0; killing the other \d process\(es\) and starting the "
                     r"job again", out), out
    assert "starting scheduler, server 0, worker 0, train 0.0, train 0.1 (restart 1 of 2)" in out
    assert "[train 0.0] run 1 rank 0 avg 0.5" in out and "[train 0.1] run 1 rank 1 avg 0.5" in out
    assert re.search(r"bitpush launch: 10 processes, all exited 0 in [\d.]+ s after 1 "
                     r"restart\(s\)", out), out


def test_srun_two_launchers_per_node_are_refused(slurm_cluster):
    try:
        r = subprocess.run(["srun", "--ntasks=2", "--chdir", REPO, _bitpush(), "launch",
                            "--slurm", "--", "true"], env=slurm_cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        raise TimeoutError("timed out after 60 s waiting for srun --ntasks=2 bitpush launch")
    assert r.returncode == 2, r.stdout
    assert "SLURM_STEP_TASKS_PER_NODE='2': bitpush launch --slurm runs one launcher per node" \
        in r.stdout, r.stdout
