"""`bitpush launch` and `bitpush check-config` (docs/launch.md).

    bitpush launch --config cluster.yaml [--host NAME] [-- COMMAND ...]
    bitpush launch --slurm [--config overlay.yaml] [-- COMMAND ...]
    bitpush check-config [--no-resolve] cluster.yaml

`launch` starts the roles of the cluster YAML that live on this host — the scheduler, the
servers, and for each worker node a bitpush-worker daemon (when it runs more than one training
process, or the nodes run different numbers) and one COMMAND per training process with the
bootstrap environment (docs/python.md) — prefixes every
output line with its process ("[server 0] "), and supervises them: the first process that
fails stops all the others (SIGTERM, then SIGKILL after --grace-s) and the launcher exits 1
naming it and its last line. SIGINT/SIGTERM to the launcher stop everything the same way.

With --max-restarts N (YAML launch.max_restarts) a death does not end the job: the launcher
kills the rest at once (SIGKILL: the job's state is in its checkpoint), logs one line naming who
died and how, and starts the cluster and the training command again, up to N times, with
BITPUSH_RESTART_COUNT in the training processes' environment; the script resumes from its
checkpoint (bitpush.torch.Checkpointer). A server that dies alone while the YAML sets
cluster.server_rejoin_timeout_s is started again in place instead (the others keep running and
roll back to their checkpoint, docs/training.md "A server restarted alone"); a server started
in place that exits with an error within its first 10 s restarts the whole job.

`launch --slurm` builds the cluster from a Slurm allocation instead of a host list (the YAML is
written by bitpush/slurm.py; then everything above applies unchanged).

`check-config` parses the YAML with the C++ parser (bitpush._C.load_cluster_config, the one
every daemon uses), resolves every host name of its addresses (unless --no-resolve) and prints
the effective config; exit 2 on a bad file or a name that does not resolve.

Children run in their own session (so a terminal's Ctrl-C reaches the launcher only, which
then stops them in order) with PR_SET_PDEATHSIG=SIGKILL (so nothing outlives a launcher that
was killed outright). Every child is started from the main thread (PDEATHSIG follows the
thread that forked); one reader thread per child copies its merged stdout/stderr.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from . import _env, _proc

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1  # a process failed (or the cluster did not end by itself when asked to)
EXIT_USAGE = 2  # bad command line or bad config
# Stopped by SIGINT / SIGTERM: 128 + the signal (130, 143), like a shell.

_POLL_S = 0.05
# A server started again in place that exits with an error within this long is not replaced in
# place again: the whole job restarts (e.g. the scheduler refused it because it had not yet seen
# the old process go). One killed by a signal is another death, replaced in place.
_IN_PLACE_GRACE_S = 10.0


# -- config ----------------------------------------------------------------------------------

def _load_config(path):
    """The C++ parser's view of `path` (dict, see config_bindings.cc); raises BitpushError."""
    from . import _C
    return _C.load_cluster_config(path)


def _host_of(url):
    """'tcp://host:port' -> 'host'; ipc:// and inproc:// -> None (this host)."""
    if not url.startswith("tcp://"):
        return None
    rest = url[len("tcp://"):]
    if rest.startswith("["):
        return rest[1:rest.index("]")]
    return rest.rsplit(":", 1)[0]


def _local_names():
    names = {"localhost", "::1"}
    for fn in (socket.gethostname, socket.getfqdn):
        try:
            names.add(fn())
        except OSError:
            pass
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


def _is_local(host, wanted, local_names):
    if wanted:
        return host in wanted or (host is None and "localhost" in wanted)
    return host is None or host.startswith("127.") or host in local_names


# -- processes -------------------------------------------------------------------------------

class _Child:
    """One started process: its label, Popen, reader thread and last output line."""

    def __init__(self, label, kind, argv, env, out, out_lock):
        self.label = label
        self.kind = kind  # "role" or "train"
        self.argv = argv
        self.last_line = ""
        self.returncode = None  # set once reaped
        self.signalled = False  # the launcher sent it a signal
        self.started = time.monotonic()
        self.in_place = False  # a server started again in place (restart_servers_in_place)
        self._out, self._lock = out, out_lock
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=_proc.die_with_parent)
        self.pid = self.popen.pid
        self.reader = threading.Thread(target=self._read, name="out-" + label, daemon=True)
        self.reader.start()

    def _read(self):
        prefix = ("[%s] " % self.label).encode()
        for line in iter(self.popen.stdout.readline, b""):
            text = line.rstrip(b"\r\n")
            if text.strip():
                self.last_line = text.decode("utf-8", "replace").strip()
            with self._lock:
                self._out.write(prefix + text + b"\n")
                self._out.flush()
        self.popen.stdout.close()

    def poll(self):
        if self.returncode is None:
            rc = self.popen.poll()
            if rc is not None:
                self.returncode = rc
                self.reader.join(2.0)  # a grandchild may hold the pipe: bounded
        return self.returncode

    def kill_group(self, sig):
        if self.poll() is not None:
            return
        self.signalled = True
        try:
            os.killpg(self.pid, sig)  # the child and whatever it started
        except (ProcessLookupError, PermissionError):
            pass

    def describe_exit(self):
        rc = self.returncode
        if rc is None:
            return "still running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = "signal %d" % -rc
            return "killed by %s" % name
        return "exited with %d" % rc


class _Launch:
    def __init__(self, args, config, config_path):
        self.args = args
        self.config = config
        self.config_path = config_path
        self.children = []  # this run's processes (the current start of the job)
        self.gone = []  # processes of earlier runs and replaced servers, all reaped
        self.restarts = 0
        self.max_restarts = (args.max_restarts if args.max_restarts is not None
                             else int(config["knobs"].get("launch.max_restarts", "0")))
        rejoin = config["knobs"].get("cluster.server_rejoin_timeout_s", "off")
        self.server_rejoins = rejoin not in ("off", "0", "")
        self.out = sys.stdout.buffer
        self.out_lock = threading.Lock()
        self.stop_signal = None
        self.t0 = time.monotonic()

    def say(self, text):
        with self.out_lock:
            self.out.write(("bitpush launch: %s\n" % text).encode())
            self.out.flush()

    def bin(self, name):
        return os.path.join(self.args.bin_dir, name)

    def log_args(self):
        return ["--log-level", self.args.log_level]

    def start(self, label, kind, argv, env=None):
        c = _Child(label, kind, argv, env, self.out, self.out_lock)
        self.children.append(c)
        return c

    def _local(self):
        wanted = set(self.args.host or [])
        names = _local_names()
        return lambda url: _is_local(_host_of(url), wanted, names)

    def runs_every_node(self):
        """Whether the scheduler, every server and every worker node run on this host."""
        cfg, local = self.config, self._local()
        return all(local(u) for u in [cfg["scheduler"]] + cfg["servers"] + cfg["workers"])

    def plan(self):
        """[(label, kind, argv, env)] in start order, for the roles on this host."""
        cfg, a = self.config, self.args
        local = self._local()
        differ = cfg["processes_differ"]
        counts = [a.local_size or p or 1 for p in cfg["worker_processes"]]
        plan = []
        if local(cfg["scheduler"]):
            plan.append(("scheduler", "role",
                         [self.bin("bitpush-scheduler"), "--config", self.config_path]
                         + self.log_args(), None))
        for i, url in enumerate(cfg["servers"]):
            if local(url):
                plan.append(("server %d" % i, "role",
                             [self.bin("bitpush-server"), "--config", self.config_path,
                              "--rank", str(i)] + self.log_args(), None))
        for n, url in enumerate(cfg["workers"]):
            if not local(url):
                continue
            local_size = counts[n]
            gpus = cfg["worker_gpus"][n]
            # A daemon sums the node's processes; with different counts per node every node
            # needs one (it weighs the processes equally; docs/config.md).
            daemon = local_size > 1 or differ
            socket_path = cfg["worker_sockets"][n]
            if daemon:
                plan.append(("worker %d" % n, "role",
                             [self.bin("bitpush-worker"), "--config", self.config_path,
                              "--rank", str(n), "--local-size", str(local_size),
                              "--socket", socket_path] + self.log_args(), None))
            if not a.command:
                continue
            for r in range(local_size):
                env = dict(os.environ)
                env.setdefault("PYTHONUNBUFFERED", "1")  # lines arrive as they are printed
                env.update({_env.CONFIG: self.config_path, _env.WORKER_RANK: str(n),
                            _env.LOCAL_RANK: str(r), _env.LOCAL_SIZE: str(local_size),
                            _env.MODE: "daemon" if daemon else "embedded",
                            _env.BIN_DIR: a.bin_dir, _env.LOG_LEVEL: a.log_level,
                            # Informational (init() does not need them): for scripts that
                            # want their identity before init, e.g. to log from rank 0 only.
                            _env.ROLE: "worker", _env.SCHEDULER: cfg["scheduler"],
                            _env.RANK: str(sum(counts[:n]) + r), _env.SIZE: str(sum(counts)),
                            _env.RESTART_COUNT: str(self.restarts)})
                if daemon:
                    env[_env.DAEMON_SOCKET] = socket_path
                if gpus:
                    env[_env.GPU] = str(gpus[r])
                plan.append(("train %d.%d" % (n, r), "train", list(a.command), env))
        return plan

    def stop_all(self, reason):
        """Stops every running child in tiers — training processes, then the node daemons
        (which free the shared memory of their dead clients), then servers and the scheduler:
        SIGTERM, SIGKILL to what still runs after --grace-s; all reaped."""
        running = [c for c in self.children if c.poll() is None]
        if not running:
            return
        self.say("stopping %d process(es): %s" % (len(running), reason))
        tiers = [[c for c in running if c.kind == "train"],
                 [c for c in running if c.label.startswith("worker ")],
                 [c for c in reversed(running) if c.kind == "role"
                  and not c.label.startswith("worker ")]]
        for i, tier in enumerate(tiers):
            if not tier:
                continue
            if i == 1 and tiers[0]:
                time.sleep(0.3)  # let the daemons see their clients go
            for c in tier:
                c.kill_group(signal.SIGTERM)
            deadline = time.monotonic() + self.args.grace_s
            while time.monotonic() < deadline and any(c.poll() is None for c in tier):
                time.sleep(_POLL_S)
            for c in tier:
                if c.poll() is None:
                    self.say("%s (pid %d) ignored SIGTERM for %.1f s: SIGKILL"
                             % (c.label, c.pid, self.args.grace_s))
                    c.kill_group(signal.SIGKILL)
                    c.popen.wait()
                    c.poll()

    def sweep_shm(self):
        """Unlinks the shared-memory segments of children that are gone (a training process
        ended by a signal cannot unlink its own; names are bitpush-<uid>-<pid>-<n>,
        worker/ipc/shm_segment.h). Every child is reaped here, so the pids are still ours."""
        uid = os.getuid()
        mine = tuple("bitpush-%d-%d-" % (uid, c.pid) for c in self.gone + self.children
                     if c.returncode is not None)
        try:
            names = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
        except OSError:
            return
        for n in names:
            try:
                os.unlink(os.path.join("/dev/shm", n))
            except OSError:
                pass
        if names:
            self.say("removed %d shared-memory segment(s) left by stopped processes"
                     % len(names))

    def summary(self, failed):
        n = len(self.gone) + len(self.children)
        took = time.monotonic() - self.t0
        again = " after %d restart(s)" % self.restarts if self.restarts else ""
        if failed is None and self.stop_signal is None:
            self.say("%d processes, all exited 0 in %.1f s%s" % (n, took, again))
            return
        others = ", ".join("%s %s" % (c.label, c.describe_exit()) for c in self.children
                           if c is not failed and c.returncode not in (0, None)
                           and not c.signalled)
        if failed is not None:
            self.say("FAILED: %s (pid %d) %s; last line: %s%s; %d processes in %.1f s%s"
                     % (failed.label, failed.pid, failed.describe_exit(),
                        failed.last_line or "(no output)",
                        "; then " + others if others else "", n, took, again))
        else:
            self.say("stopped by %s; %d processes in %.1f s%s"
                     % (signal.Signals(self.stop_signal).name, n, took,
                        " (" + others + ")" if others else ""))

    def run(self):
        if not self.plan():
            self.say("no role of %s runs on this host (%s); use --host NAME"
                     % (self.config_path, socket.gethostname()))
            return EXIT_USAGE
        failed = None
        try:
            while True:
                if not self.start_all():
                    return EXIT_FAILED
                failed = self.supervise()
                if not self.restartable(failed):
                    break
                self.restart_job(failed)
        finally:
            if failed is not None:
                self.stop_all("%s %s" % (failed.label, failed.describe_exit()))
            elif self.stop_signal is not None:
                self.stop_all("received %s" % signal.Signals(self.stop_signal).name)
            self.stop_all("launcher exiting")
        self.sweep_shm()
        self.summary(failed)
        if failed is not None:
            return EXIT_FAILED
        if self.stop_signal is not None:
            return 128 + self.stop_signal
        return EXIT_OK

    def start_all(self):
        """Starts this host's plan (a new run of the job); False when a process did not
        start (the others are stopped)."""
        plan = self.plan()
        self.say("starting %s%s" % (", ".join(p[0] for p in plan),
                                    " (restart %d of %d)" % (self.restarts, self.max_restarts)
                                    if self.restarts else ""))
        for label, kind, argv, env in plan:
            if self.stop_signal is not None:
                break
            try:
                self.start(label, kind, argv, env)
            except OSError as e:
                self.say("cannot start %s (%s): %s" % (label, argv[0], e))
                self.stop_all("%s did not start" % label)
                return False
        self.say("started %s" % ", ".join("%s (pid %d)" % (c.label, c.pid)
                                           for c in self.children))
        return True

    def restartable(self, failed):
        """Whether the death of `failed` starts the job again: restarts are left, nobody
        asked the launcher to stop, and the training is not already done (every training
        process exited 0: a role failing at shutdown ends the job as before)."""
        if failed is None or self.stop_signal is not None:
            return False
        if self.restarts >= self.max_restarts:
            if self.max_restarts:
                self.say("%s %s, and the job was started again %d time(s) already "
                         "(--max-restarts %d): giving up"
                         % (failed.label, failed.describe_exit(), self.restarts,
                            self.max_restarts))
            return False
        trains = [c for c in self.children if c.kind == "train"]
        return not (trains and all(c.poll() == 0 for c in trains))

    def restart_job(self, failed):
        """Kills what still runs of this run at once, reaps it, and counts a restart; the
        next start_all starts the job again."""
        self.restarts += 1
        self.say("restart %d of %d: %s (pid %d) %s; last line: %s; killing the other %d "
                 "process(es) and starting the job again"
                 % (self.restarts, self.max_restarts, failed.label, failed.pid,
                    failed.describe_exit(), failed.last_line or "(no output)",
                    sum(1 for c in self.children if c.poll() is None)))
        for c in self.children:
            c.kill_group(signal.SIGKILL)
        for c in self.children:
            c.popen.wait()
            c.poll()
        self.gone.extend(self.children)
        self.children = []
        self.sweep_shm()

    def restart_servers_in_place(self, dead):
        """cluster.server_rejoin_timeout_s is set: starts a new process of each dead server
        (same command line); the others keep running and the workers roll back to their
        checkpoint (docs/training.md, "A server restarted alone")."""
        for c in dead:
            self.restarts += 1
            self.say("restart %d of %d: %s (pid %d) %s; last line: %s; starting it again in "
                     "place (cluster.server_rejoin_timeout_s)"
                     % (self.restarts, self.max_restarts, c.label, c.pid, c.describe_exit(),
                        c.last_line or "(no output)"))
            self.children.remove(c)
            self.gone.append(c)
            self.start(c.label, c.kind, c.argv, None).in_place = True

    def supervise(self):
        """Waits for the end; returns the first child that failed, or None."""
        trains = [c for c in self.children if c.kind == "train"]
        roles_deadline = None
        while self.stop_signal is None:
            failed = [c for c in self.children
                      if c.poll() not in (0, None) and not c.signalled]
            if failed and self.server_rejoins and \
                    all(c.label.startswith("server ") and not (
                        c.in_place and c.returncode > 0 and
                        time.monotonic() - c.started < _IN_PLACE_GRACE_S)
                        for c in failed) and \
                    self.restarts + len(failed) <= self.max_restarts and \
                    not all(c.poll() == 0 for c in trains):
                self.restart_servers_in_place(failed)
                continue
            if failed:
                # Seen in the same poll: one killed by a signal is the likelier cause (the
                # others exit with a status once they notice it: a daemon's sibling training
                # processes within milliseconds), then a training process (a role fails
                # after it, once it notices the worker is gone).
                return min(failed, key=lambda c: (c.returncode >= 0, c.kind != "train"))
            if trains and all(c.poll() == 0 for c in trains) and roles_deadline is None:
                roles_deadline = time.monotonic() + self.args.shutdown_timeout_s
            if all(c.poll() is not None for c in self.children):
                return None
            if roles_deadline is not None and time.monotonic() > roles_deadline:
                left = [c.label for c in self.children if c.poll() is None]
                self.say("training done but %s still running after %.0f s"
                         % (", ".join(left), self.args.shutdown_timeout_s))
                self.stop_all("cluster shutdown timed out")
                return None
            time.sleep(_POLL_S)
        return None


# -- command line ----------------------------------------------------------------------------

def _default_bin_dir():
    d = _env.bin_dir()
    if d:
        return d
    try:
        from . import _build_info
        return _build_info.BIN_DIR
    except ImportError:
        return None


# How long check-config waits for the resolver (all names at once): getaddrinfo has no
# timeout of its own, and a dead DNS server can stall it for minutes.
_RESOLVE_TIMEOUT_S = 15.0


def _cluster_hosts(cfg):
    """(key, node, host) of every tcp:// address of the config, scheduler first, in rank order."""
    out = [("cluster.scheduler", "the scheduler", _host_of(cfg["scheduler"]))]
    out += [("cluster.servers", "server %d" % r, _host_of(a)) for r, a in enumerate(cfg["servers"])]
    out += [("cluster.workers", "worker node %d" % r, _host_of(a))
            for r, a in enumerate(cfg["workers"])]
    return [(key, node, host) for key, node, host in out if host is not None]


def _unresolved_hosts(cfg, timeout_s=_RESOLVE_TIMEOUT_S):
    """One line per host of the config that does not resolve (getaddrinfo), naming the key and
    the node where it appears; [] when every one does. Each distinct name is looked up once, all
    at once on daemon threads, so a hung resolver costs at most `timeout_s` in all."""
    entries = _cluster_hosts(cfg)
    results = {}
    lock = threading.Lock()

    def resolve(host):
        try:
            socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
            why = None
        except (OSError, UnicodeError) as e:
            why = str(e)
        with lock:
            results[host] = why

    threads = {}
    for _, _, host in entries:
        if host not in threads:
            threads[host] = threading.Thread(target=resolve, args=(host,), daemon=True,
                                             name="resolve-" + host)
            threads[host].start()
    deadline = time.monotonic() + timeout_s
    for t in threads.values():
        t.join(max(0.0, deadline - time.monotonic()))
    lines, named = [], set()
    for key, node, host in entries:
        with lock:
            done, why = host in results, results.get(host)
        if done and why is None:
            continue
        if not done:
            why = "no answer from the resolver within %g s" % timeout_s
        first = host not in named
        named.add(host)
        lines.append("%s: %s's host '%s' does not resolve: %s%s"
                     % (key, node, host, why, "" if first else " (as above)"))
    return lines


def _check_config(path, resolve=True):
    from . import BitpushError
    try:
        cfg = _load_config(path)
    except BitpushError as e:
        print("bitpush check-config: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    if resolve:
        unresolved = _unresolved_hosts(cfg)
        if unresolved:
            for line in unresolved:
                print("bitpush check-config: %s: %s" % (path, line), file=sys.stderr)
            print("bitpush check-config: %s: fix the name or the resolver (DNS, /etc/hosts), "
                  "or pass --no-resolve to check a file for machines whose names resolve "
                  "elsewhere" % path, file=sys.stderr)
            return EXIT_USAGE
    sys.stdout.write(cfg["description"].rstrip("\n") + "\n")
    print("bitpush check-config: %s is valid: scheduler %s, %d server(s), %d worker node(s)"
          % (path, cfg["scheduler"], len(cfg["servers"]), len(cfg["workers"])))
    return EXIT_OK


def _keygen(args):
    from . import BitpushError, _C
    try:
        written = _C.write_cluster_keys(os.path.abspath(args.config), args.out or "",
                                        args.force)
    except BitpushError as e:
        print("bitpush keygen: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    for path in written:
        print("bitpush keygen: wrote %s" % path)
    if len(written) == 1:
        print("bitpush keygen: every node's key file existed and was kept (--force replaces "
              "them); public_keys lists them")
    print("bitpush keygen: give each node its own <node>.key (mode 0600) and public_keys "
          "(docs/security.md)")
    return EXIT_OK


def _needs_ephemeral_keys(config, all_local):
    """True when the YAML asks for CURVE but names no keys at all, and every node of it runs
    under this launcher: then keys made for this run are as good as any (no other host needs
    them). A multi-host cluster without keys is left to the daemons, whose error names the
    missing files."""
    knobs = config["knobs"]
    if knobs.get("security.mode") != "curve" or not all_local:
        return False
    if os.environ.get(_env.KEYS_DIR) or os.environ.get(_env.KEY_FILE):
        return False
    return not any(knobs.get(k) for k in ("security.keys_dir", "security.key_file",
                                          "security.public_keys"))


# Subcommands with a module of their own: name -> (module, one line of help). Each module's
# main(argv) takes the arguments after the name and returns the exit status.
_TOOLS = {
    "trace": ("bitpush.trace", "merge the span files of a --timeline run into one Chrome "
              "trace, or draw a step of one (docs/observability.md)"),
    "metrics-config": ("bitpush.metrics_config", "print a Prometheus scrape configuration for "
                       "a cluster YAML's metrics endpoints (docs/observability.md)"),
    "top": ("bitpush.top", "a terminal view of a running cluster's metrics, refreshed each "
            "second (docs/observability.md)"),
}


def _parser():
    p = argparse.ArgumentParser(prog="bitpush", description="bitpush cluster launcher "
                                "(docs/launch.md)")
    sub = p.add_subparsers(dest="cmd", metavar="{launch,check-config,keygen,%s}"
                           % ",".join(_TOOLS))
    sub.required = True
    lp = sub.add_parser("launch", help="start this host's roles of a cluster YAML "
                        "[and a training command per worker process]",
                        usage="bitpush launch {--config FILE [--host NAME] | --slurm "
                        "[--config OVERLAY]} [options] [-- COMMAND ...]")
    lp.add_argument("--config", help="the cluster YAML (docs/config.md); with --slurm an "
                    "optional overlay: the YAML without the cluster's hosts")
    lp.add_argument("--slurm", action="store_true",
                    help="inside a Slurm allocation: build the cluster from the Slurm "
                    "environment (docs/launch.md, 'Slurm')")
    lp.add_argument("--servers-per-node", type=int, default=None, metavar="K",
                    help="with --slurm: servers on every node (default 1)")
    lp.add_argument("--host", action="append", metavar="NAME",
                    help="start the roles whose address has this host (repeatable); default: "
                    "loopback addresses and this machine's names")
    lp.add_argument("--local-size", type=int, default=None, metavar="P",
                    help="training processes per worker node (default: the node's processes: "
                    "in the YAML, then worker.local_size, else 1); > 1 starts a bitpush-worker "
                    "daemon per node")
    lp.add_argument("--max-restarts", type=int, default=None, metavar="N",
                    help="when a process of the job dies, kill the others and start the job "
                    "again, up to N times (default: the YAML's launch.max_restarts, else 0); "
                    "the training script resumes from its checkpoint (docs/launch.md, "
                    "'Restarts')")
    lp.add_argument("--timeline", default=None, metavar="DIR",
                    help="trace every process of the job: each writes its spans into DIR "
                    "(trace.dir); `bitpush trace merge DIR` makes one Chrome trace of them "
                    "(docs/observability.md)")
    lp.add_argument("--grace-s", type=float, default=5.0,
                    help="SIGTERM to SIGKILL when stopping processes (default 5)")
    lp.add_argument("--shutdown-timeout-s", type=float, default=30.0,
                    help="after every training process exited 0, how long the cluster roles "
                    "may take to end by themselves (default 30)")
    lp.add_argument("--log-level", default=_env.DEFAULT_LOG_LEVEL,
                    help="of every process it starts: the scheduler, servers and daemons "
                    "(--log-level) and the training processes' in-process workers (%s): %s "
                    "(default %s: warnings, errors and the one 'compression:' line; info "
                    "adds each process's start-up and shutdown)"
                    % (_env.LOG_LEVEL, ", ".join(_env.LOG_LEVELS), _env.DEFAULT_LOG_LEVEL))
    lp.add_argument("--bin-dir", default=None,
                    help="where bitpush-scheduler/-server/-worker are (default "
                    "BITPUSH_BIN_DIR, else this build's bin dir)")
    cp = sub.add_parser("check-config", help="validate a cluster YAML and print the "
                        "effective config")
    cp.add_argument("config")
    cp.add_argument("--no-resolve", action="store_true",
                    help="do not resolve the host names of the addresses (a file written for "
                    "machines whose names resolve only there)")
    kp = sub.add_parser("keygen", help="write a CURVE key pair per node of a cluster YAML and "
                        "the cluster's public_keys (docs/security.md)")
    kp.add_argument("--config", required=True, help="the cluster YAML")
    kp.add_argument("--out", default=None, metavar="DIR",
                    help="where to write them (default: the YAML's security.keys_dir)")
    kp.add_argument("--force", action="store_true",
                    help="replace existing key files (every node then needs the new "
                    "public_keys)")
    for name, (_, text) in _TOOLS.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _TOOLS:
        import importlib
        return importlib.import_module(_TOOLS[argv[0]][0]).main(argv[1:])
    launcher_argv = [sys.executable, "-m", "bitpush.launch"] + argv  # for --slurm's srun
    command = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    args = _parser().parse_args(argv)  # exits 2 on a usage error
    if args.cmd == "check-config":
        if command:
            print("bitpush check-config: takes no COMMAND", file=sys.stderr)
            return EXIT_USAGE
        return _check_config(args.config, resolve=not args.no_resolve)
    if args.cmd == "keygen":
        if command:
            print("bitpush keygen: takes no COMMAND", file=sys.stderr)
            return EXIT_USAGE
        return _keygen(args)

    args.command = command
    try:
        args.log_level = _env.normalize_log_level(args.log_level, "--log-level")
    except ValueError as e:
        print("bitpush launch: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    if args.max_restarts is not None and not 0 <= args.max_restarts <= 1000:
        print("bitpush launch: --max-restarts must be 0..1000, got %d" % args.max_restarts,
              file=sys.stderr)
        return EXIT_USAGE
    if args.local_size is not None and args.local_size < 1:
        print("bitpush launch: --local-size must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    args.bin_dir = os.path.abspath(args.bin_dir or _default_bin_dir() or ".")
    from . import BitpushError
    if args.slurm:
        from . import slurm
        try:
            args.config = slurm.setup(args, launcher_argv, _load_config,
                                      lambda text: print("bitpush launch: " + text,
                                                         flush=True))
        except (ValueError, BitpushError) as e:
            print("bitpush launch: %s" % e, file=sys.stderr)
            return EXIT_USAGE
    elif args.config is None or args.servers_per_node is not None:
        print("bitpush launch: %s" % ("--servers-per-node goes with --slurm" if args.config
                                      else "--config is required (or --slurm inside a Slurm "
                                      "allocation)"), file=sys.stderr)
        return EXIT_USAGE
    config_path = os.path.abspath(args.config)
    try:
        config = _load_config(config_path)
    except BitpushError as e:
        print("bitpush launch: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    if args.local_size is not None and config["processes_differ"]:
        print("bitpush launch: --local-size %d would override %s's training processes per "
              "node (%s), which differ between nodes; drop --local-size or edit the YAML"
              % (args.local_size, config_path,
                 ", ".join(str(p) for p in config["worker_processes"])), file=sys.stderr)
        return EXIT_USAGE
    launch = _Launch(args, config, config_path)

    def on_signal(signum, frame):
        if launch.stop_signal is None:
            launch.stop_signal = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    keys_dir = None
    if _needs_ephemeral_keys(config, launch.runs_every_node()):
        from . import _C
        keys_dir = tempfile.mkdtemp(prefix="bitpush-keys-")  # 0700
        try:
            _C.write_cluster_keys(config_path, keys_dir, False)
        except BitpushError as e:
            shutil.rmtree(keys_dir, ignore_errors=True)
            print("bitpush launch: %s" % e, file=sys.stderr)
            return EXIT_USAGE
        os.environ[_env.KEYS_DIR] = keys_dir  # every child inherits it
    if args.timeline is not None:
        timeline = os.path.abspath(args.timeline)
        try:
            os.makedirs(timeline, exist_ok=True)
        except OSError as e:
            print("bitpush launch: --timeline %s: %s" % (args.timeline, e), file=sys.stderr)
            return EXIT_USAGE
        os.environ[_env.TRACE_DIR] = timeline  # every child inherits it
    try:
        return launch.run()
    finally:
        if keys_dir is not None:
            shutil.rmtree(keys_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
