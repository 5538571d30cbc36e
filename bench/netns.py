"""The emulated network's machinery, shared by bench/emulated_network.py: the namespaces, veths,
bridge and tc qdiscs of one run (Network), leftovers of crashed runs (remove_stale), and the
processes started inside the namespaces with their CPU time (Procs). Topology and shaping:
docs/emulated-network.md. Needs root. Not a program of its own.
"""

import os
import re
import signal
import subprocess
import sys
import time

SUBNET = "10.77.0."

def log(msg):
    print("emulated_network: " + msg, file=sys.stderr, flush=True)


def sh(argv, check=True):
    """Runs a command (a list), returns its stdout; raises with its output when it fails."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    if check and p.returncode != 0:
        raise RuntimeError("'%s' failed (%d): %s" % (" ".join(argv), p.returncode,
                                                    p.stdout.strip()))
    return p.stdout


# ---- the emulated network --------------------------------------------------------------------

class Network:
    """The namespaces, veths, bridge and qdiscs of one run. remove() is idempotent."""

    def __init__(self, prefix, servers, workers, gbit, delay_ms, loss_pct):
        self.prefix = prefix
        self.hub = prefix + "-hub"
        self.nodes = [("sched", SUBNET + "1")]
        self.nodes += [("s%d" % i, SUBNET + str(10 + i)) for i in range(servers)]
        self.nodes += [("w%d" % i, SUBNET + str(100 + i)) for i in range(workers)]
        self.gbit, self.delay_ms, self.loss_pct = gbit, delay_ms, loss_pct
        self.created = []

    def ns(self, node):
        return "%s-%s" % (self.prefix, node)

    def ip(self, node):
        return dict(self.nodes)[node]

    def tbf(self):
        bytes_per_s = self.gbit * 1e9 / 8
        # A bucket of 1 ms at the rate, at least 256 KiB (64 KiB GSO packets pass whole);
        # up to 10 ms of queue before drops (as bitpush-bench pushpull --link-gbit).
        burst = max(256 << 10, int(bytes_per_s / 1000))
        return ["tbf", "rate", "%gmbit" % (self.gbit * 1000), "burst", str(burst),
                "latency", "10ms"]

    def create(self):
        sh(["ip", "netns", "add", self.hub])
        self.created.append(self.hub)
        sh(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        sh(["ip", "-n", self.hub, "link", "set", "br0", "up"])
        sh(["ip", "-n", self.hub, "link", "set", "lo", "up"])
        for i, (node, addr) in enumerate(self.nodes):
            ns, hub_end = self.ns(node), "p%d" % i
            sh(["ip", "netns", "add", ns])
            self.created.append(ns)
            sh(["ip", "-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name",
                "eth0", "netns", ns])
            sh(["ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up"])
            sh(["ip", "-n", ns, "addr", "add", addr + "/24", "dev", "eth0"])
            sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            # Towards the node: the hub end's egress. From the node: its eth0's egress.
            sh(["tc", "-n", self.hub, "qdisc", "add", "dev", hub_end, "root"] + self.tbf())
            if self.delay_ms > 0 or self.loss_pct > 0:
                netem = ["netem"]
                if self.delay_ms > 0:
                    netem += ["delay", "%gms" % self.delay_ms]
                if self.loss_pct > 0:
                    netem += ["loss", "%g%%" % self.loss_pct]
                # Enough queue for a bandwidth-delay product at the rate.
                limit = max(1000, int(self.gbit * 1e9 / 8 * (self.delay_ms + 10) / 1e3 / 1500))
                try:
                    sh(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:"]
                       + netem + ["limit", str(limit)])
                except RuntimeError as e:
                    if "qdisc kind is unknown" in str(e):
                        raise RuntimeError("this kernel has no netem qdisc (module sch_netem), "
                                           "so --delay-ms / --loss-pct cannot be emulated "
                                           "here: %s" % e) from e
                    raise
                sh(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "parent", "1:", "handle",
                    "2:"] + self.tbf())
            else:
                sh(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root"] + self.tbf())
        # Every node reaches every other through the bridge.
        for node, _ in self.nodes[1:]:
            sh(["ip", "netns", "exec", self.ns(node), "ping", "-c", "1", "-W", "2",
                self.ip("sched")], check=False)

    def remove(self):
        # Deleting a namespace deletes its veth ends (and so their peers) and the bridge.
        for ns in reversed(self.created):
            sh(["ip", "netns", "del", ns], check=False)
        self.created = []

    def link_settings(self):
        return {"gbit_per_direction_per_node": self.gbit, "delay_ms_per_node_link": self.delay_ms,
                "loss_pct_per_node_link": self.loss_pct, "qdisc": " ".join(self.tbf()),
                "subnet": SUBNET + "0/24", "hub_namespace": self.hub,
                "nodes": {self.ns(n): a for n, a in self.nodes}}


def list_netns():
    return [line.split()[0] for line in sh(["ip", "netns", "list"], check=False).splitlines()
            if line.strip()]


def remove_stale(prefix):
    """Namespaces of an earlier run with this prefix, or of a bpnet-<pid> run whose pid died."""
    for ns in list_netns():
        stale = ns.startswith(prefix + "-")
        m = re.match(r"bpnet-(\d+)-", ns)
        if m and not os.path.exists("/proc/" + m.group(1)):
            stale = True
        if stale:
            log("removing the leftover namespace " + ns)
            for pid in sh(["ip", "netns", "pids", ns], check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            sh(["ip", "netns", "del", ns], check=False)


# ---- processes -------------------------------------------------------------------------------

class Procs:
    """Children started in namespaces; kill_all() is idempotent."""

    def __init__(self):
        self.procs = []

    def start(self, label, ns, argv, log_path, env=None, capture=False):
        out = open(log_path, "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns] + argv, stdout=out,
                             stderr=subprocess.PIPE if capture else subprocess.STDOUT,
                             env=env, universal_newlines=True, start_new_session=True)
        p.label, p.log_path, p.log_file = label, log_path, out
        self.procs.append(p)
        return p

    def wait_all(self, timeout_s, grace_s=8):
        """Until all exited; the first failure gives the others grace_s, then kills them.
        Raises naming the failing process and its last output lines. Meanwhile samples each
        child's CPU time (p.cpu_s, the last value seen before it exited) and the machine's
        (self.machine_busy_s: all CPUs' non-idle time over the wait)."""
        deadline = time.time() + timeout_s
        failed = None
        busy0 = machine_busy_s()
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is None:
                    p.cpu_s = max(getattr(p, "cpu_s", 0.0), process_cpu_s(p.pid))
            running = [p for p in self.procs if p.poll() is None]
            bad = [p for p in self.procs if p.poll() not in (None, 0)]
            if bad and failed is None:
                failed = bad[0]
                deadline = min(deadline, time.time() + grace_s)
            if not running:
                break
            time.sleep(0.05)
        self.machine_busy_s = machine_busy_s() - busy0
        self.cpu = {p.label: round(getattr(p, "cpu_s", 0.0), 3) for p in self.procs}
        late = [p.label for p in self.procs if p.poll() is None]
        self.kill_all()
        if failed is not None:
            raise RuntimeError("%s exited with %s; last lines of %s:\n%s"
                               % (failed.label, failed.returncode, failed.log_path,
                                  tail(failed.log_path)))
        if late:
            raise RuntimeError("timed out after %d s; killed: %s" % (timeout_s, ", ".join(late)))

    def cpu_seconds(self):
        """{label: CPU seconds} of the children (as last sampled by wait_all), and 'kernel and
        other': the machine's busy time not in them (softirq for the shaped veths, ...)."""
        out = dict(getattr(self, "cpu", {}))
        if hasattr(self, "machine_busy_s"):
            out["kernel and other"] = round(max(0.0, self.machine_busy_s - sum(out.values())), 3)
        return out

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except OSError:
                    pass
        end = time.time() + 3
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
            p.log_file.close()
        self.procs = []


def process_cpu_s(pid):
    """User + system CPU seconds of a live process (0 when it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_s():
    """Non-idle CPU seconds of all CPUs since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tail(path, n=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""
