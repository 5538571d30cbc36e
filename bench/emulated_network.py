#!/usr/bin/python3
"""push_pull (and optionally training) over an emulated network: one network namespace per
node (scheduler, each server, each worker), each behind its own rate-limited veth link to a
bridge in a hub namespace. Runs the real binaries inside the namespaces. Needs root.

    sudo /usr/bin/python3 bench/emulated_network.py --workers 2 --servers 2 --mb 100 \
        --gbit 1 [--delay-ms D] [--loss-pct P] [--train] [--out bench-out/emulated-network]

--security none,curve runs every compressor once per security mode (security_ratio: the
round time under none / under this mode); curve clusters use a key pair per node written by
`bitpush-bench pushpull-keygen` into a private temporary directory (0700), named as keys_dir
in their YAML and removed on exit.

--train also trains examples/train_digits.py and examples/train_charlm.py across the same
network, each with LANS uncompressed and CLAN + onebit (error feedback both), and plots their
loss against wall-clock time.

Topology (docs/emulated-network.md): namespaces PREFIX-hub (bridge br0), PREFIX-sched,
PREFIX-s<i>, PREFIX-w<i>; a veth pair per node, created inside the hub namespace (the host's
interfaces are never touched), the node end renamed eth0 and moved into the node's
namespace; 10.77.0.1 scheduler, 10.77.0.(10+i) server i, 10.77.0.(100+i) worker i, /24.
Each veth end's egress is shaped by tc tbf to --gbit, so every node has --gbit each way;
--delay-ms / --loss-pct add netem on the node's own end only (one-way delay D per node
link, so a worker->server->worker round trip crosses 4 links: 4 D).

Everything it created (processes, namespaces and with them the veths and the bridge) is
removed on exit, on failure, on Ctrl-C / SIGTERM / SIGHUP; at start it removes namespaces
left by a crashed run (PREFIX-*, and bpnet-<pid>-* whose pid is gone).
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COMPRESSORS = "none,fp16,onebit,topk:ratio=0.001,dithering:levels=15"
# Ratio of the none round time to the compressor's that the benchmark targets (2 workers x 2
# servers, 100 MB, 1 Gbit/s); checked by prefix of the spec.
TARGETS = {"onebit": 15.0, "topk:ratio=0.001": 30.0, "fp16": 1.8}
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


def error_feedback_for(spec):
    """The compression.error_feedback a method's rounds run with: both for the biased ones and
    binsgdm (paper 004 Algorithm 1 keeps worker and server errors), worker for separate (its
    moving-average error; servers only sum projections), none for the unbiased ones."""
    name = spec.split(":")[0]
    if name in ("onebit", "topk", "binsgdm"):
        return "both"
    return "worker" if name == "separate" else "none"


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
                sh(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:"]
                   + netem + ["limit", str(limit)])
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
        Raises naming the failing process and its last output lines."""
        deadline = time.time() + timeout_s
        failed = None
        while time.time() < deadline:
            running = [p for p in self.procs if p.poll() is None]
            bad = [p for p in self.procs if p.poll() not in (None, 0)]
            if bad and failed is None:
                failed = bad[0]
                deadline = min(deadline, time.time() + grace_s)
            if not running:
                break
            time.sleep(0.05)
        late = [p.label for p in self.procs if p.poll() is None]
        self.kill_all()
        if failed is not None:
            raise RuntimeError("%s exited with %s; last lines of %s:\n%s"
                               % (failed.label, failed.returncode, failed.log_path,
                                  tail(failed.log_path)))
        if late:
            raise RuntimeError("timed out after %d s; killed: %s" % (timeout_s, ", ".join(late)))

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


def tail(path, n=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def write_yaml(path, net, servers, workers, spec, ef, min_compress_bytes, timeout_s, tuning,
               keys_dir=None):
    y = ["cluster:",
         "  scheduler: %s:9000" % net.ip("sched"),
         "  servers: [%s]" % ", ".join("%s:9100" % net.ip("s%d" % i) for i in range(servers)),
         "  workers: [%s]" % ", ".join("%s:9200" % net.ip("w%d" % i) for i in range(workers)),
         "  heartbeat_interval_ms: 500",
         "  heartbeat_timeout_ms: 5000",
         "  startup_timeout_s: 30",
         "compression:",
         '  spec: "%s"' % spec,
         "  error_feedback: %s" % ef,
         "  min_compress_bytes: %d" % min_compress_bytes,
         "  partition_bytes: 4096000",
         "server:",
         "  engine_threads: %s" % (tuning.engine_threads or "auto"),
         "  numa: %s" % tuning.server_numa,
         "worker:",
         "  op_timeout_s: %d" % timeout_s,
         "  compress_threads: %s" % (tuning.compress_threads or "auto")]
    if keys_dir:
        y += ["security:", "  mode: curve", '  keys_dir: "%s"' % keys_dir]
    with open(path, "w") as f:
        f.write("\n".join(y) + "\n")


def start_control(procs, args, net, yaml, tag):
    procs.start("scheduler", net.ns("sched"),
                [args.bin_dir + "/bitpush-scheduler", "--config", yaml, "--log-level", "warn"],
                os.path.join(args.work, tag + "-scheduler.log"))
    for s in range(args.servers):
        procs.start("server %d" % s, net.ns("s%d" % s),
                    [args.bin_dir + "/bitpush-server", "--config", yaml, "--rank", str(s),
                     "--log-level", "warn"],
                    os.path.join(args.work, "%s-server%d.log" % (tag, s)))


# ---- (a) push_pull rounds --------------------------------------------------------------------

def run_pushpull(args, net, spec, security="none", keys_dir=None):
    ef = error_feedback_for(spec)
    tag = re.sub(r"[^A-Za-z0-9]+", "_", spec) + ("" if security == "none" else "-" + security)
    yaml = os.path.join(args.work, tag + ".yaml")
    write_yaml(yaml, net, args.servers, args.workers, spec, ef, 1 << 20, args.timeout_s, args,
               keys_dir if security == "curve" else None)
    procs = Procs()
    t0 = time.time()
    try:
        start_control(procs, args, net, yaml, tag)
        results = []
        for w in range(args.workers):
            res = os.path.join(args.work, "%s-worker%d.json" % (tag, w))
            results.append(res)
            procs.start("worker %d" % w, net.ns("w%d" % w),
                        [args.bin_dir + "/bitpush-bench", "pushpull-worker", "--config", yaml,
                         "--rank", str(w), "--tensor-mb", "%.17g" % args.mb, "--tensors", "1",
                         "--iters", str(args.iters), "--warmup", str(args.warmup),
                         "--results", res],
                        os.path.join(args.work, "%s-worker%d.log" % (tag, w)))
        procs.wait_all(args.timeout_s)
    finally:
        procs.kill_all()
    recs = []
    for path in results:
        with open(path) as f:
            r = json.load(f)
        if r.get("status") != "OK":
            raise RuntimeError("%s: %s" % (path, r.get("status")))
        recs.append(r)
    iters = max(1, recs[0]["iters"])
    # A round ends when the slowest worker's push_pull completes.
    median = max(r["median_iter_seconds"] for r in recs)
    best = max(r["best_iter_seconds"] for r in recs)
    pushed = statistics.mean(r["bytes_pushed"] / iters for r in recs)
    pulled = statistics.mean(r["bytes_pulled"] / iters for r in recs)
    return {"compressor": spec, "error_feedback": ef, "security": security,
            "median_round_ms": median * 1e3, "best_round_ms": best * 1e3,
            "mean_round_ms": max(r["loop_seconds"] for r in recs) / iters * 1e3,
            "per_worker_median_round_ms": [r["median_iter_seconds"] * 1e3 for r in recs],
            "tensor_bytes": recs[0]["tensor_bytes"],
            "push_bytes_per_round_per_worker": pushed,
            "pull_bytes_per_round_per_worker": pulled,
            "wire_bytes_per_round_all_workers": (pushed + pulled) * len(recs),
            "wire_compression_ratio": recs[0]["tensor_bytes"] / max(pushed, 1),
            "compress_ms_per_round": statistics.mean(r["compress_ns"] for r in recs) / iters / 1e6,
            "network_ms_per_round": statistics.mean(r["network_ns"] for r in recs) / iters / 1e6,
            "decompress_ms_per_round":
                statistics.mean(r["decompress_ns"] for r in recs) / iters / 1e6,
            "wall_seconds": time.time() - t0}


# ---- (b) training ----------------------------------------------------------------------------

LOSS_RE = re.compile(r"loss=([0-9.]+)")


# The examples --train runs: script, and its length arguments (docs/emulated-network.md).
EXAMPLES = {
    "digits": ("train_digits.py", lambda args: ["--epochs", str(args.train_epochs)]),
    "charlm": ("train_charlm.py", lambda args: ["--steps", str(args.charlm_steps)]),
}
TRAIN_RUNS = (("lans", "none"), ("clan", "onebit"))


def run_training(args, net, example, optimizer, compression):
    ef = "both" if optimizer == "clan" and compression != "none" else "none"
    tag = "train-%s-%s-%s" % (example, optimizer, compression)
    script, length_args = EXAMPLES[example]
    yaml = os.path.join(args.work, tag + ".yaml")
    write_yaml(yaml, net, args.servers, args.workers, compression, ef, 4096, args.timeout_s, args)
    procs = Procs()
    curve = []
    summary_path = os.path.join(args.work, tag + ".json")
    try:
        start_control(procs, args, net, yaml, tag)
        readers = []
        t0 = time.time()
        for w in range(args.workers):
            env = dict(os.environ)
            env.update({"BITPUSH_CONFIG": yaml, "BITPUSH_WORKER_RANK": str(w),
                        "BITPUSH_LOCAL_RANK": "0", "BITPUSH_LOCAL_SIZE": "1",
                        "BITPUSH_MODE": "embedded", "BITPUSH_BIN_DIR": args.bin_dir,
                        "PYTHONPATH": args.python_dir, "OMP_NUM_THREADS": "1"})
            argv = ["/usr/bin/python3", os.path.join(REPO, "examples", script),
                    "--optimizer", optimizer, "--compression", compression,
                    "--json", summary_path] + length_args(args)
            p = procs.start("trainer %d" % w, net.ns("w%d" % w), argv,
                            os.path.join(args.work, "%s-worker%d.log" % (tag, w)), env=env,
                            capture=True)
            # tqdm's progress lines (rank 0, one a second when not a terminal) carry the
            # running loss; each is timestamped as it arrives.
            def read(p=p, rank=w):
                for line in p.stderr:
                    p.log_file.write(line)
                    m = LOSS_RE.search(line)
                    if rank == 0 and m:
                        curve.append((time.time() - t0, float(m.group(1))))
            th = threading.Thread(target=read, daemon=True)
            th.start()
            readers.append(th)
        procs.wait_all(args.timeout_s)
        for th in readers:
            th.join(5)
    finally:
        procs.kill_all()
    with open(summary_path) as f:
        s = json.load(f)
    s["example"] = example
    s["step_ms"] = s["wall_time_s"] / max(1, s["steps"]) * 1e3
    s["loss_curve"] = [{"t_s": round(t, 3), "loss": l} for t, l in curve]
    if s.get("final_train_loss") is not None and s["loss_curve"]:
        s["loss_curve"].append({"t_s": round(s["loss_curve"][-1]["t_s"], 3),
                                "loss": s["final_train_loss"]})
    return s


# ---- output ----------------------------------------------------------------------------------

def plot(out_dir, rows, training, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [r["compressor"] + ("" if r["security"] == "none" else " (%s)" % r["security"])
             for r in rows]
    ms = [r["median_round_ms"] for r in rows]
    bars = ax.bar(range(len(rows)), ms, color="tab:blue")
    for b, r in zip(bars, rows):
        label = "%.0f ms" % r["median_round_ms"]
        if r.get("speedup_vs_none"):
            label += "\n%.1fx" % r["speedup_vs_none"]
        ax.annotate(label, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=15, fontsize=8)
    ax.set_ylabel("time per push_pull round (ms, median)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "round_time.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if training:
        examples = [e for e in EXAMPLES if any(t["example"] == e for t in training)]
        fig, axes = plt.subplots(1, len(examples), figsize=(6.5 * len(examples), 4.5),
                                 squeeze=False)
        names = {"digits": "digits MLP", "charlm": "char-LM transformer"}
        for ax, example in zip(axes[0], examples):
            for t in training:
                if t["example"] != example:
                    continue
                c = t["loss_curve"]
                ax.plot([p["t_s"] for p in c], [p["loss"] for p in c], marker=".",
                        label="%s + %s (%s)" % (t["optimizer"], t["compression"],
                                                quality(t)))
            ax.set_xlabel("wall-clock time since the trainers started (s)")
            ax.set_ylabel("training loss (running mean, rank 0)")
            ax.set_title("%s, %s" % (names[example], title), fontsize=9)
            ax.legend()
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "train_loss.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def quality(t):
    """The example's end-of-training metric, as text."""
    if t.get("test_accuracy") is not None:
        return "test acc %.2f%%" % t["test_accuracy"]
    return "val loss %.3f nats/byte" % t["val_loss"]


def table(rows, full_size):
    lines = ["| compressor | error feedback | security | round (ms, median) | "
             "push B/round/worker | speedup vs none | x security none | target | met |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        target = r.get("target_speedup")
        met = "" if target is None else ("yes" if r["target_met"] else "**no**")
        if target is not None and not full_size:
            met += " (not the target's setup)"
        lines.append("| %s | %s | %s | %.1f | %.0f | %s | %s | %s | %s |" % (
            r["compressor"], r["error_feedback"], r["security"], r["median_round_ms"],
            r["push_bytes_per_round_per_worker"],
            "%.2fx" % r["speedup_vs_none"] if r.get("speedup_vs_none") else "-",
            "%.2fx" % r["security_ratio"] if r.get("security_ratio") else "-",
            "%gx" % target if target else "-", met))
    return "\n".join(lines)


# ---- driver ----------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--mb", type=float, default=100, help="model size, MiB of fp32")
    p.add_argument("--iters", type=int, default=50, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed rounds first: the first rounds of fresh processes pay page "
                        "faults (VM memory is faulted in lazily), ~1 s, 160 ms, 85 ms for topk, "
                        "and settle over about ten rounds")
    p.add_argument("--compressors", default=DEFAULT_COMPRESSORS,
                   help="comma-separated specs (default %(default)s)")
    p.add_argument("--security", action="append", default=None,
                   help="security modes, comma-separated (none, curve; the flag may repeat): "
                        "every compressor runs once per mode (default none)")
    p.add_argument("--gbit", type=float, default=1.0, help="per node, each direction")
    p.add_argument("--delay-ms", type=float, default=0.0, help="netem delay per node link")
    p.add_argument("--loss-pct", type=float, default=0.0, help="netem loss per node link")
    p.add_argument("--train", action="store_true",
                   help="also train the examples: LANS uncompressed vs CLAN + onebit")
    p.add_argument("--train-examples", default="digits,charlm",
                   help="which examples --train runs (comma-separated: digits, charlm)")
    p.add_argument("--train-epochs", type=int, default=60,
                   help="digits epochs per run (tqdm reports the loss once a second)")
    p.add_argument("--charlm-steps", type=int, default=300,
                   help="char-LM steps per run (about 0.2 s a step on 2 shared cores)")
    p.add_argument("--out", default="bench-out/emulated-network")
    p.add_argument("--prefix", default="bpnet-%d" % os.getpid(),
                   help="namespace name prefix (default bpnet-<pid>)")
    p.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    p.add_argument("--python-dir", default=os.path.join(REPO, "build", "python"))
    p.add_argument("--timeout-s", type=int, default=300, help="per cluster run")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--compress-threads", type=int, default=0,
                   help="worker.compress_threads of every worker (0 = auto)")
    p.add_argument("--engine-threads", type=int, default=0,
                   help="server.engine_threads of every server (0 = auto)")
    p.add_argument("--server-numa", default="auto", choices=("auto", "on", "off"),
                   help="server.numa (auto/on pin each engine thread to a core)")
    args = p.parse_args(argv)
    if not 1 <= args.servers <= 80 or not 1 <= args.workers <= 150:
        p.error("--servers 1..80, --workers 1..150 (addresses in %s0/24)" % SUBNET)
    if not re.match(r"^[A-Za-z0-9_.-]{1,40}$", args.prefix):
        p.error("--prefix: letters, digits, _ . - only, at most 40")
    modes = []
    for item in args.security or ["none"]:
        for m in item.split(","):
            if m not in ("none", "curve"):
                p.error("--security: '%s' is not a mode (none, curve)" % m)
            if m not in modes:
                modes.append(m)
    args.security = modes
    args.train_examples = [e for e in args.train_examples.split(",") if e]
    for e in args.train_examples:
        if e not in EXAMPLES:
            p.error("--train-examples: unknown example '%s' (digits, charlm)" % e)
    args.bin_dir = os.path.abspath(args.bin_dir)
    args.python_dir = os.path.abspath(args.python_dir)
    return args


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted("signal %d" % signum)


def main(argv=None):
    args = parse_args(argv)
    if os.geteuid() != 0:
        log("needs root (network namespaces, veth, tc)")
        return 77
    for b in ("bitpush-scheduler", "bitpush-server", "bitpush-bench"):
        if not os.access(os.path.join(args.bin_dir, b), os.X_OK):
            log("no %s in %s (--bin-dir)" % (b, args.bin_dir))
            return 2
    os.makedirs(args.out, exist_ok=True)
    args.work = os.path.abspath(os.path.join(args.out, "work"))
    os.makedirs(args.work, exist_ok=True)
    specs = [s for s in args.compressors.split(",") if s]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    net = Network(args.prefix, args.servers, args.workers, args.gbit, args.delay_ms,
                  args.loss_pct)
    rows, training = [], []
    keys_dir = None
    try:
        remove_stale(args.prefix)
        if "curve" in args.security:
            # A key pair per node (the names depend only on the counts), private to this run.
            keys_dir = tempfile.mkdtemp(prefix="bp-emnet-keys-")
            shape = os.path.join(args.work, "keygen.yaml")
            write_yaml(shape, net, args.servers, args.workers, "none", "none", 1 << 20,
                       args.timeout_s, args)
            sh([os.path.join(args.bin_dir, "bitpush-bench"), "pushpull-keygen", shape,
                keys_dir])
        net.create()
        log("network up: %d namespaces under %s-*, %g Gbit/s per node each way"
            % (len(net.created), args.prefix, args.gbit))
        for spec in specs:
            for security in args.security:
                log("push_pull %s (security %s): %d workers x %d servers, %g MiB, %d+%d rounds"
                    % (spec, security, args.workers, args.servers, args.mb, args.warmup,
                       args.iters))
                rows.append(run_pushpull(args, net, spec, security, keys_dir))
                log("  median round %.1f ms" % rows[-1]["median_round_ms"])
        if args.train:
            for example in args.train_examples:
                for opt, comp in TRAIN_RUNS:
                    log("training %s: %s + %s" % (example, opt, comp))
                    training.append(run_training(args, net, example, opt, comp))
                    log("  %.1f ms/step, %s" % (training[-1]["step_ms"],
                                                quality(training[-1])))
    except Interrupted as e:
        log("interrupted (%s); cleaning up" % e)
        return 130
    except Exception as e:  # noqa: BLE001 - report, clean up, exit 1
        log("error: %s" % e)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        net.remove()
        remove_stale(args.prefix)
        if keys_dir:
            shutil.rmtree(keys_dir, ignore_errors=True)

    def find(spec, security):
        return next((r for r in rows if r["compressor"] == spec and r["security"] == security),
                    None)

    full_size = (args.workers, args.servers, args.mb, args.gbit) == (2, 2, 100, 1) \
        and args.delay_ms == 0 and args.loss_pct == 0
    for r in rows:
        none = find("none", r["security"])
        r["speedup_vs_none"] = none["median_round_ms"] / r["median_round_ms"] if none else None
        plain = find(r["compressor"], "none")
        r["security_ratio"] = (plain["median_round_ms"] / r["median_round_ms"]
                               if plain else None)
        target = TARGETS.get(r["compressor"])
        if target is not None and r["speedup_vs_none"]:
            r["target_speedup"] = target
            r["target_met"] = r["speedup_vs_none"] >= target
    title = "%d workers x %d servers, %g MiB, %g Gbit/s per node%s" % (
        args.workers, args.servers, args.mb, args.gbit,
        (", %g ms, %g%% loss" % (args.delay_ms, args.loss_pct))
        if args.delay_ms or args.loss_pct else "")
    result = {"setup": {"workers": args.workers, "servers": args.servers, "mb": args.mb,
                        "iters": args.iters, "warmup": args.warmup, "cpus": os.cpu_count(),
                        "security": args.security,
                        "targets_apply": full_size},
              "link": net.link_settings(), "pushpull": rows}
    if training:
        result["training"] = training
    plots = [] if args.no_plots else plot(args.out, rows, training, title)
    result["plots"] = plots
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print("### push_pull, " + title + "\n")
    print(table(rows, full_size))
    if training:
        print("\n| training | steps | step (ms) | wall (s) | result | pushed MB |\n"
              "|---|---:|---:|---:|---|---:|")
        for t in training:
            print("| %s: %s + %s | %d | %.1f | %.1f | %s | %.2f |" % (
                t["example"], t["optimizer"], t["compression"], t["steps"], t["step_ms"],
                t["wall_time_s"], quality(t), t["bytes_pushed"] / 1e6))
    print("\nresults: %s; plots: %s" % (os.path.join(args.out, "results.json"),
                                        ", ".join(plots) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
