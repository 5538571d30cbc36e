"""LocalCluster: a real bitpush cluster on loopback for tests and examples (no launcher).

    from bitpush.testing import LocalCluster

    def train(steps):                      # runs in each worker process
        import bitpush.torch as bp
        bp.init()                          # from the BITPUSH_* variables LocalCluster sets
        ...
        bp.shutdown()
        return result                      # pickled back to the parent

    with LocalCluster(workers=2, compression="onebit", error_feedback="both") as c:
        results = c.run_workers(train, args=(10,), timeout=60)
        assert all(r.returncode == 0 for r in results), c.describe(results)

LocalCluster writes a cluster YAML with free loopback ports into a temporary directory, starts
bitpush-scheduler and the servers (and, with local_size > 1, one bitpush-worker daemon per node)
from this build's bin dir (BITPUSH_BIN_DIR overrides), and on exit stops everything — SIGTERM,
then SIGKILL after a bounded wait — and removes the directory. Every child also gets
PR_SET_PDEATHSIG=SIGKILL, so nothing outlives a crashed parent. A cluster serves one training
run: it ends when every worker called shutdown().

Thread-safety: a LocalCluster belongs to the thread that created it.
"""
import inspect
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import _env, _proc

__all__ = ["LocalCluster", "WorkerResult", "free_ports", "ephemeral_port_range"]


# free_ports draws from [_FIRST_PORT, the start of the kernel's ephemeral range): a port the
# kernel hands out itself (bind to 0) lies inside that range, where once released it can be
# taken at any moment as the local port of some outgoing connection before the daemon that was
# meant to listen on it starts.
_FIRST_PORT = 20000
_next_port = [None]


def ephemeral_port_range():
    """(low, high) of Linux's ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _port_dir():
    return os.environ.get("BITPUSH_PORT_DIR") or "/tmp/bitpush-ports-%d" % os.getuid()


def _reserve_port(port):
    """Reserves port for this process among every process of this user that takes ports here or
    through the C++ tests' FreeTcpPort (tests/harness/child_process.h keeps the same files):
    under an flock of <dir>/lock, <dir>/<port> names the holder's pid, and a port whose holder
    no longer lives is taken over. Concurrent test processes then never hand out one port twice
    while the first one's cluster may still be starting. True when reserved, or when the
    directory cannot be used (then the bind probe is all there is)."""
    import fcntl

    d = _port_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        lock = os.open(os.path.join(d, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(d, str(port))
        try:
            with open(path) as f:
                holder = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            holder = 0
        if holder > 0 and holder != os.getpid():
            try:
                os.kill(holder, 0)
                return False  # a live process holds it
            except PermissionError:
                return False
            except OSError:
                pass  # its holder is gone: take it over
        with open(path, "w") as f:
            f.write("%d\n" % os.getpid())
        return True
    except OSError:
        return True
    finally:
        os.close(lock)  # closing releases the flock


def free_ports(n):
    """n distinct TCP ports free on 127.0.0.1 right now, below the ephemeral range (held open
    together, then released), each reserved for this process (_reserve_port). Raises
    RuntimeError when fewer than n are free there."""
    low, _ = ephemeral_port_range()
    first = _FIRST_PORT if low > _FIRST_PORT + n else 1024
    count = low - first
    if _next_port[0] is None:
        _next_port[0] = (os.getpid() * 7919) % count
    socks = []
    try:
        for _ in range(count):
            if len(socks) == n:
                break
            port = first + _next_port[0] % count
            _next_port[0] += 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            if not _reserve_port(port):
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise RuntimeError("free_ports: only %d of %d ports free in %d..%d"
                               % (len(socks), n, first, low - 1))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launched_processes(launcher_pid):
    """[(pid, role)] of the live (not zombie) children of a `bitpush launch` process, role one
    of "scheduler", "server", "daemon" (a node's bitpush-worker) and "train" (what it started
    with the training command): for tests and benchmarks that kill them (test_chaos.py,
    bench/restart_bench.py). Reads /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if int(fields[1]) != launcher_pid or fields[0] == "Z":
            continue
        role = ("scheduler" if "bitpush-scheduler" in cmd else "server"
                if "bitpush-server" in cmd else "daemon" if "bitpush-worker" in cmd else "train")
        out.append((int(d), role))
    return out


def _default_bin_dir():
    d = _env.bin_dir()
    if d:
        return d
    try:
        from . import _build_info
        return _build_info.BIN_DIR
    except ImportError:
        return None


def _yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    if isinstance(v, dict):  # flow style: {pattern: '*.bias', placement: worker}
        return "{" + ", ".join("%s: %s" % (k, _yaml_scalar(x)) for k, x in v.items()) + "}"
    if isinstance(v, str) and any(c in v for c in "*?[]{},:#"):
        return "'%s'" % v.replace("'", "''")
    return str(v)


class WorkerResult:
    """What one worker process of run_workers did."""

    def __init__(self, worker_rank, local_rank, returncode, output, value, error):
        self.worker_rank = worker_rank
        self.local_rank = local_rank
        self.returncode = returncode  # None: killed at the timeout
        self.output = output  # stdout + stderr
        self.value = value  # the callable's return value (unpickled), else None
        self.error = error  # the exception's traceback text when the callable raised

    @property
    def ok(self):
        return self.returncode == 0

    def __repr__(self):
        return "<WorkerResult %d.%d rc=%s>" % (self.worker_rank, self.local_rank,
                                               self.returncode)


class _Proc:
    def __init__(self, label, argv, log_path, env=None):
        self.label = label
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          preexec_fn=_proc.die_with_parent)

    @property
    def pid(self):
        return self.popen.pid

    def poll(self):
        return self.popen.poll()

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig):
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, term_wait_s):
        """SIGTERM, then SIGKILL after term_wait_s; always reaped."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            if self.wait(term_wait_s) is None:
                self.signal(signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode

    def output(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


class LocalCluster:
    """A scheduler, `servers` servers and room for `workers` worker nodes on loopback.

    Args:
        workers: worker nodes (the YAML's workers). servers: server processes.
        compression, error_feedback, min_compress_bytes, partition_bytes: the YAML's
            compression section (None = the default of docs/config.md; min_compress_bytes
            defaults to 0 here, so small test tensors are compressed too).
        heartbeat_interval_ms, heartbeat_timeout_ms, startup_timeout_s: the cluster section
            (short defaults: a dead server is noticed within a second).
        op_timeout_s: worker.op_timeout_s.
        local_size: training processes per node; > 1 starts one bitpush-worker daemon per node
            (the processes use daemon mode).
        security: security.mode, "none" or "curve"; with "curve" a key per node is generated
            into <dir>/keys (docs/security.md).
        extra: more YAML, as {section: {key: value}} merged over the generated keys.
        bin_dir: where the binaries are (default BITPUSH_BIN_DIR, else this build's bin dir).
        keep_dir: keep the temporary directory (config, logs) after exit.
    """

    def __init__(self, workers=2, servers=2, compression="none", error_feedback="none",
                 min_compress_bytes=0, partition_bytes=None, heartbeat_interval_ms=100,
                 heartbeat_timeout_ms=1000, startup_timeout_s=30, op_timeout_s=30,
                 local_size=1, extra=None, bin_dir=None, keep_dir=False, log_level=None,
                 security="none"):
        if workers < 1 or servers < 1 or local_size < 1:
            raise ValueError("LocalCluster needs at least one worker, server and local process")
        self.workers = workers
        self.servers = servers
        self.local_size = local_size
        self.keep_dir = keep_dir
        self.log_level = log_level
        self.bin_dir = bin_dir or _default_bin_dir()
        if not self.bin_dir:
            raise RuntimeError("LocalCluster: no bin dir; set BITPUSH_BIN_DIR to the directory "
                               "of bitpush-scheduler, bitpush-server and bitpush-worker")
        for b in self._binaries():
            if not os.access(os.path.join(self.bin_dir, b), os.X_OK):
                raise RuntimeError("LocalCluster: %s not found in %s (build the tree, or set "
                                   "BITPUSH_BIN_DIR)" % (b, self.bin_dir))
        self.dir = tempfile.mkdtemp(prefix="bp-py-")
        self.config_path = os.path.join(self.dir, "cluster.yaml")
        ports = free_ports(1 + servers + workers)
        self.scheduler_address = "127.0.0.1:%d" % ports[0]
        self.server_addresses = ["127.0.0.1:%d" % p for p in ports[1:1 + servers]]
        self.worker_addresses = ["127.0.0.1:%d" % p for p in ports[1 + servers:]]
        sections = {
            "cluster": {
                "scheduler": self.scheduler_address,
                "servers": self.server_addresses,
                "workers": self.worker_addresses,
                "heartbeat_interval_ms": heartbeat_interval_ms,
                "heartbeat_timeout_ms": heartbeat_timeout_ms,
                "startup_timeout_s": startup_timeout_s,
            },
            "compression": {"spec": compression, "error_feedback": error_feedback},
            "server": {"engine_threads": 1, "numa": "off"},
            "worker": {"compress_threads": 1, "op_timeout_s": op_timeout_s},
        }
        if min_compress_bytes is not None:
            sections["compression"]["min_compress_bytes"] = min_compress_bytes
        if partition_bytes is not None:
            sections["compression"]["partition_bytes"] = partition_bytes
        if local_size > 1:
            sections["worker"]["local_size"] = local_size
        if security != "none":
            sections["security"] = {"mode": security,
                                    "keys_dir": os.path.join(self.dir, "keys")}
        for section, keys in (extra or {}).items():
            sections.setdefault(section, {}).update(keys)
        with open(self.config_path, "w") as f:
            for section, keys in sections.items():
                f.write("%s:\n" % section)
                for k, v in keys.items():
                    f.write("  %s: %s\n" % (k, _yaml_scalar(v)))
        if security != "none":
            from . import _C
            _C.write_cluster_keys(self.config_path, os.path.join(self.dir, "keys"), False)
        self.scheduler = None
        self.server_procs = []
        self.daemon_procs = []
        self._worker_procs = []
        self._started = False

    def _binaries(self):
        b = ["bitpush-scheduler", "bitpush-server"]
        return b + ["bitpush-worker"] if self.local_size > 1 else b

    def _bin(self, name):
        return os.path.join(self.bin_dir, name)

    def _log_args(self):
        return ["--log-level", self.log_level] if self.log_level else []

    def daemon_socket(self, worker_rank):
        """The Unix socket of node `worker_rank`'s daemon (local_size > 1)."""
        return os.path.join(self.dir, "node%d.sock" % worker_rank)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self):
        """Starts the scheduler, the servers and (local_size > 1) the node daemons."""
        if self._started:
            return self
        self._started = True
        self.scheduler = _Proc("scheduler",
                               [self._bin("bitpush-scheduler"), "--config", self.config_path]
                               + self._log_args(), os.path.join(self.dir, "scheduler.log"))
        for i in range(self.servers):
            self.server_procs.append(self._server_proc(i))
        if self.local_size > 1:
            for n in range(self.workers):
                self.daemon_procs.append(_Proc(
                    "daemon %d" % n,
                    [self._bin("bitpush-worker"), "--config", self.config_path, "--rank", str(n),
                     "--socket", self.daemon_socket(n), "--local-size", str(self.local_size),
                     "--no-sweep"] + self._log_args(),
                    os.path.join(self.dir, "daemon%d.log" % n)))
        return self

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                sys.stderr.write(self.logs_text())
        finally:
            self.stop()
        return False

    def processes(self):
        """Every process this cluster started (workers included), as _Proc objects."""
        procs = [self.scheduler] if self.scheduler else []
        return procs + self.server_procs + self.daemon_procs + self._worker_procs

    def wait_exit(self, timeout=10.0):
        """Waits (bounded) for the scheduler, servers and daemons to exit by themselves (as
        they do once every worker shut down); returns {label: returncode or None}."""
        deadline = time.monotonic() + timeout
        result = {}
        for p in [self.scheduler] + self.server_procs + self.daemon_procs:
            if p is None:
                continue
            result[p.label] = p.wait(deadline - time.monotonic())
        return result

    def stop(self, grace_s=2.0, term_wait_s=3.0):
        """Stops every process: a short grace period to exit by themselves, then SIGTERM, then
        SIGKILL; all reaped. Removes the directory unless keep_dir. Idempotent."""
        procs = self.processes()
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.wait(deadline - time.monotonic())
        for p in reversed(procs):  # workers first, the scheduler last
            p.stop(term_wait_s)
        if not self.keep_dir and os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)

    def kill_server(self, i, sig=signal.SIGKILL):
        """Kills server i (SIGKILL by default) and reaps it."""
        p = self.server_procs[i]
        p.signal(sig)
        p.wait(10.0)

    def restart_server(self, i):
        """Starts a new process for server i (after kill_server): with
        cluster.server_rejoin_timeout_s set, it registers again and rejoins the job. Its log
        goes to server<i>.restart<k>.log."""
        self._restarts = getattr(self, "_restarts", 0) + 1
        self.server_procs[i] = self._server_proc(i, ".restart%d" % self._restarts)
        return self.server_procs[i]

    def _server_proc(self, i, suffix=""):
        return _Proc("server %d" % i,
                     [self._bin("bitpush-server"), "--config", self.config_path, "--rank", str(i)]
                     + self._log_args(), os.path.join(self.dir, "server%d%s.log" % (i, suffix)))

    # -- workers --------------------------------------------------------------------------

    def env(self, worker_rank, local_rank=0, local_size=None):
        """The BITPUSH_* variables of training process (worker_rank, local_rank)."""
        local_size = self.local_size if local_size is None else local_size
        n = _env.names()
        e = {n["config"]: self.config_path, n["worker_rank"]: str(worker_rank),
             n["local_rank"]: str(local_rank), n["local_size"]: str(local_size),
             n["mode"]: "daemon" if local_size > 1 else "embedded", n["bin_dir"]: self.bin_dir}
        if local_size > 1:
            e[n["daemon_socket"]] = self.daemon_socket(worker_rank)
        return e

    def start_worker(self, target, args=(), worker_rank=0, local_rank=0, env=None):
        """Starts one training process (see run_workers); returns its _Proc. Its result file
        is <dir>/result-<rank>-<local>.pkl."""
        if not self._started:
            self.start()
        tag = "%d-%d" % (worker_rank, local_rank)
        child_env = dict(os.environ)
        child_env.update(self.env(worker_rank, local_rank))
        child_env.update(env or {})
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        child_env["PYTHONPATH"] = os.pathsep.join(
            [here] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        python = sys.executable or "/usr/bin/python3"
        if callable(target):
            spec_path = os.path.join(self.dir, "job-%s.pkl" % tag)
            with open(spec_path, "wb") as f:
                pickle.dump({"file": os.path.abspath(inspect.getfile(target)),
                             "module": target.__module__, "qualname": target.__qualname__,
                             "args": tuple(args),
                             "result": os.path.join(self.dir, "result-%s.pkl" % tag)}, f)
            argv = [python, "-m", "bitpush._worker_main", spec_path]
        else:
            argv = [python, str(target)] + [str(a) for a in args]
        p = _Proc("worker %s" % tag, argv, os.path.join(self.dir, "worker-%s.log" % tag),
                  env=child_env)
        p.tag = tag
        p.worker_rank, p.local_rank = worker_rank, local_rank
        self._worker_procs.append(p)
        return p

    def run_workers(self, target, args=(), timeout=60.0, env=None, per_worker_args=None):
        """Runs one training process per (node, local rank) and waits for all of them.

        target: a module-level function (run in a fresh /usr/bin/python3 with `*args`; its
            return value is pickled back) or the path of a script (run with `args` as argv).
        per_worker_args: optional function (worker_rank, local_rank) -> args overriding args.
        env: extra environment for every process. timeout: seconds for all of them; processes
            still running then are killed (returncode None).
        Returns a WorkerResult per process, ordered by (worker_rank, local_rank).
        """
        procs = []
        for w in range(self.workers):
            for local in range(self.local_size):
                a = per_worker_args(w, local) if per_worker_args else args
                procs.append(self.start_worker(target, a, w, local, env))
        return self.wait_workers(procs, timeout)

    def wait_workers(self, procs, timeout=60.0):
        deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(deadline - time.monotonic())
        results = []
        for p in procs:
            timed_out = p.poll() is None
            p.stop(1.0)
            value = error = None
            result_path = os.path.join(self.dir, "result-%s.pkl" % p.tag)
            if os.path.exists(result_path):
                with open(result_path, "rb") as f:
                    outcome = pickle.load(f)
                value, error = outcome.get("value"), outcome.get("error")
            results.append(WorkerResult(p.worker_rank, p.local_rank,
                                        None if timed_out else p.popen.returncode,
                                        p.output(), value, error))
        return results

    # -- diagnostics ----------------------------------------------------------------------

    def logs(self):
        """{label: output} of every process started so far."""
        return {p.label: p.output() for p in self.processes()}

    def logs_text(self, tail_lines=40):
        out = []
        for label, text in self.logs().items():
            lines = text.splitlines()[-tail_lines:]
            out.append("---- %s ----\n%s\n" % (label, "\n".join(lines)))
        return "".join(out)

    def describe(self, results=None, tail_lines=40):
        """Text for an assertion message: the workers' results and every process's log tail."""
        parts = []
        for r in results or []:
            parts.append("worker %d.%d rc=%s%s\n%s" % (
                r.worker_rank, r.local_rank, r.returncode,
                "" if not r.error else "\n" + r.error,
                "\n".join(r.output.splitlines()[-tail_lines:])))
        parts.append(self.logs_text(tail_lines))
        return "\n".join(parts)
