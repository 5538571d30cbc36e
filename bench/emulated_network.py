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

--peer ddp runs PyTorch DDP's gradient exchange (torch.distributed over gloo, one rank per
worker namespace, bench/peers/ddp_driver.py under --peer-python) on the same tensor over the
same links, alternating with bitpush (--repeats R alternations, the order reversed on odd
ones); --peer-variant allreduce,fp16,ddp,powersgd picks torch's machinery (allreduce: the
all_reduce DDP's reducer launches per bucket; fp16 / powersgd: DDP with torch's own hooks).
Every record gets line_rate_bound_ms (the bytes the busiest link direction must carry at
--gbit: bitpush max(push, W x push / S) up or the same for pulls, ring all-reduce
2 (W - 1) / W of the all-reduced bytes) and ratio_to_bound = bound / round (1 = at line rate);
bitpush records also ratio_to_ddp (DDP's round / bitpush's: > 1, bitpush is faster) against
the allreduce variant, and ratio_to_ddp_<variant> against each variant that ran.

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

from netns import SUBNET, Network, Procs, log, remove_stale, sh  # bench/netns.py
from emulated_cluster import (bitpush_worker_env, ddp_rank_env,  # bench/emulated_cluster.py
                              error_feedback_for, pushpull_bound_ms, ring_allreduce_bound_ms,
                              start_control, start_worker_ranks, write_yaml)
from emulated_train_layout import (TRAIN_DDP_VARIANTS,  # bench/emulated_train_layout.py
                                   report_train_layout, run_train_bitpush, run_train_ddp)
from train_driver import layout_file  # bench/train_driver.py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COMPRESSORS = "none,fp16,onebit,topk:ratio=0.001,dithering:levels=15"
# Ratio of the none round time to the compressor's that the benchmark targets (2 workers x 2
# servers, 100 MB, 1 Gbit/s); checked by prefix of the spec.
TARGETS = {"onebit": 15.0, "topk:ratio=0.001": 30.0, "fp16": 1.8}
DDP_DRIVER = os.path.join(REPO, "bench", "peers", "ddp_driver.py")
DDP_VARIANTS = ("allreduce", "ddp", "fp16", "powersgd")


# ---- (a) push_pull rounds --------------------------------------------------------------------

def run_pushpull(args, net, spec, security="none", keys_dir=None, transport="zmq"):
    ef = error_feedback_for(spec)
    tag = re.sub(r"[^A-Za-z0-9]+", "_", spec) + ("" if security == "none" else "-" + security)
    tag += "" if transport == "zmq" else "-" + transport
    yaml = os.path.join(args.work, tag + ".yaml")
    write_yaml(yaml, net, args.servers, args.workers, spec, ef, 1 << 20, args.timeout_s, args,
               keys_dir if security == "curve" else None, transport)
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
        cpu = procs.cpu_seconds()
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
    bound = pushpull_bound_ms(pushed, pulled, args.workers, args.servers, args.gbit)
    return {"peer": "bitpush", "compressor": spec, "error_feedback": ef, "security": security,
            "transport": transport,
            "round_ms": median * 1e3,
            "goodput_gbps": recs[0]["tensor_bytes"] / median / 1e9,
            "line_rate_bound_ms": bound, "ratio_to_bound": bound / (median * 1e3),
            "cpu_seconds": cpu, "timed_rounds": iters,
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


# ---- PyTorch DDP on the same links -----------------------------------------------------------

def ddp_check(args, variant):
    """None when --peer-python can run the variant, else why not (ddp_driver.py --check)."""
    if not os.access(args.peer_python, os.X_OK):
        return "no Python at %s (--peer-python)" % args.peer_python
    if args.train_layout and variant == "fp32":
        variant = "ddp"  # ddp_driver.py's name for DDP without a hook
    p = subprocess.run([args.peer_python, DDP_DRIVER, "--check", "--variant", variant],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    if p.returncode == 0:
        return None
    lines = p.stdout.strip().splitlines()
    return lines[-1] if lines else "%s %s --check exited %d" % (args.peer_python, DDP_DRIVER,
                                                              p.returncode)


def run_ddp(args, net, variant):
    """One gloo process group, a rank in each worker namespace (MASTER_ADDR worker 0, as
    torchrun sets it up), running ddp_driver.py's rounds of the same tensor; rank 0's JSON."""
    tag = "ddp-" + variant
    res = os.path.join(args.work, tag + ".json")
    if os.path.exists(res):
        os.remove(res)
    elements = int(round(args.mb * (1 << 20) / 4))
    procs = Procs()
    t0 = time.time()
    try:
        argv = [args.peer_python, DDP_DRIVER, "--variant", variant, "--elements", str(elements),
                "--tensors", "1", "--dtype", "float32", "--iters", str(args.iters), "--warmup",
                str(args.warmup), "--timeout-s", str(args.timeout_s)]
        start_worker_ranks(procs, args, net, argv, lambda w: ddp_rank_env(net, w, args.workers),
                           "ddp rank", tag + "-rank", res)
        procs.wait_all(args.timeout_s)
        cpu = procs.cpu_seconds()
    finally:
        procs.kill_all()
    with open(res) as f:
        r = json.load(f)
    if r.get("status") != "OK":
        raise RuntimeError("%s: %s" % (res, r.get("status")))
    bound = ring_allreduce_bound_ms(r["allreduce_bytes_per_iter"], args.workers, args.gbit)
    return {"peer": "ddp", "backend": "gloo", "variant": variant, "dtype": r["dtype"],
            "hook": r.get("hook", ""), "torch_version": r["torch_version"],
            "world_size": r["world_size"], "round_ms": r["round_ms"],
            "best_round_ms": r["best_iter_seconds"] * 1e3,
            "local_ms": r.get("local_ms"), "goodput_gbps": r["goodput_gbps"],
            "tensor_bytes": r["tensor_bytes"],
            "allreduce_bytes_per_iter": r["allreduce_bytes_per_iter"],
            "line_rate_bound_ms": bound, "ratio_to_bound": bound / r["round_ms"],
            "cpu_seconds": cpu, "timed_rounds": r["iters"], "round_ms_all": r["round_ms_all"],
            "wall_seconds": time.time() - t0}


def combine(runs, key):
    """The alternations of one configuration as one record: the median of their round medians
    (and of the fields derived from it), with round_ms_reps listing each alternation's."""
    runs = sorted(runs, key=lambda r: r[key])
    mid = runs[len(runs) // 2]
    out = dict(mid)
    out["round_ms_reps"] = [round(r[key], 3) for r in runs]
    out["repeats"] = len(runs)
    return out


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
            env = bitpush_worker_env(args, yaml, w)
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


def bound_table(rows, ddp_rows):
    """Every record against its line-rate bound, and bitpush against DDP."""
    lines = ["| system | what | round (ms) | line-rate bound (ms) | round / bound | "
             "DDP allreduce round / this | CPU s (workers, servers, other) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows + ddp_rows:
        cpu = r.get("cpu_seconds", {})
        work = sum(v for k, v in cpu.items() if k.startswith(("worker", "ddp rank")))
        serv = sum(v for k, v in cpu.items() if k.startswith(("server", "scheduler")))
        what = (r["compressor"] + ("" if r["security"] == "none" else " " + r["security"])
                + ("" if r["transport"] == "zmq" else " over " + r["transport"])
                if r["peer"] == "bitpush" else "gloo " + r["variant"])
        vs = r.get("ratio_to_ddp")
        lines.append("| %s | %s | %.1f | %.1f | %.2fx | %s | %.1f, %.1f, %.1f |" % (
            r["peer"], what, r["round_ms"], r["line_rate_bound_ms"],
            r["round_ms"] / r["line_rate_bound_ms"], "%.2fx" % vs if vs else "-",
            work, serv, cpu.get("kernel and other", 0.0)))
    return "\n".join(lines)


def rep_note(rep, repeats):
    return "" if repeats == 1 else " (alternation %d of %d)" % (rep + 1, repeats)


# ---- driver ----------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--mb", type=float, default=100, help="model size, MiB of fp32")
    p.add_argument("--iters", type=int, default=None,
                   help="timed rounds (median reported; default 50), or timed steps with "
                        "--train-layout (default 10)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed rounds first (default 10): the first rounds of fresh processes "
                        "pay page faults (VM memory is faulted in lazily), ~1 s, 160 ms, 85 ms "
                        "for topk, and settle over about ten rounds; untimed steps with "
                        "--train-layout (default 3)")
    p.add_argument("--train-layout", default=None, metavar="MODEL",
                   help="instead of push_pull rounds of one tensor, training steps of a model "
                        "layout (a name under bench/layouts/ or a layout JSON) through "
                        "bench/train_driver.py: bitpush with each of --compressors and, with "
                        "--peer ddp, DDP with each --peer-variant (fp32, fp16, powersgd)")
    p.add_argument("--compute-scale", type=float, default=1.0,
                   help="--train-layout: multiplies every layer's backward_ms (0: no compute)")
    p.add_argument("--compute-profile", default=None, metavar="FILE",
                   help="--train-layout: per-layer backward ms instead of the layout's "
                        "(train_driver.py --compute-profile)")
    p.add_argument("--compressors", default=DEFAULT_COMPRESSORS,
                   help="comma-separated specs (default %(default)s)")
    p.add_argument("--security", action="append", default=None,
                   help="security modes, comma-separated (none, curve; the flag may repeat): "
                        "every compressor runs once per mode (default none)")
    p.add_argument("--transport", default="zmq",
                   help="data planes, comma-separated (zmq, ucx: UCX's tcp lanes on each "
                        "node's eth0): every compressor runs once per transport (default zmq)")
    p.add_argument("--gbit", type=float, default=1.0, help="per node, each direction")
    p.add_argument("--delay-ms", type=float, default=0.0, help="netem delay per node link")
    p.add_argument("--loss-pct", type=float, default=0.0, help="netem loss per node link")
    p.add_argument("--peer", choices=("ddp",), default=None,
                   help="also run PyTorch DDP's gradient exchange (gloo) on the same links, "
                        "alternating with bitpush")
    p.add_argument("--peer-variant", default="allreduce",
                   help="with --peer ddp, comma-separated: allreduce (torch.distributed "
                        "all_reduce, what DDP's reducer runs per bucket), ddp (DDP module, "
                        "default buckets), fp16 (DDP + fp16_compress_hook), powersgd (DDP + "
                        "powerSGD_hook, rank 4) (default %(default)s)")
    p.add_argument("--peer-python", default="/usr/bin/python3",
                   help="the Python with torch and gloo that runs the DDP ranks")
    p.add_argument("--repeats", type=int, default=1,
                   help="alternations: each runs every bitpush configuration and every DDP "
                        "variant once (order reversed on odd ones); records give the median "
                        "alternation")
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
    p.add_argument("--partition-kb", type=int, default=4000,
                   help="compression.partition_bytes / 1024 of every cluster (default "
                        "%(default)s: 4,096,000 bytes, BytePS's default partition)")
    p.add_argument("--raw-partition-kb", type=int, default=0,
                   help="compression.raw_partition_bytes / 1024 (0: auto, the default; "
                        "--raw-partition-kb equal to --partition-kb cuts raw tensors like "
                        "compressed ones)")
    p.add_argument("--credit-kb", type=int, default=0,
                   help="worker.credit_bytes / 1024 of every worker (0: the default)")
    p.add_argument("--server-window-kb", type=int, default=0,
                   help="worker.server_window_bytes / 1024 of every worker (0: auto)")
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
    args.transports = []
    for t in args.transport.split(","):
        if t not in ("zmq", "ucx"):
            p.error("--transport: '%s' is not a transport (zmq, ucx)" % t)
        if t not in args.transports:
            args.transports.append(t)
    args.peer_variants = []
    for v in args.peer_variant.split(","):
        if v not in DDP_VARIANTS and not (v == "fp32" and args.train_layout):
            p.error("--peer-variant: '%s' is not a variant (%s)"
                    % (v, ", ".join(DDP_VARIANTS + ("fp32",))))
        if v not in args.peer_variants:
            args.peer_variants.append(v)
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    if args.train_layout:
        try:
            args.layout_file = layout_file(args.train_layout, "--train-layout")
        except ValueError as e:
            p.error(str(e))
        if args.train:
            p.error("--train-layout and --train are separate runs")
        if args.security != ["none"] or args.transports != ["zmq"]:
            p.error("--train-layout runs over zmq without security (drop --security, "
                    "--transport)")
        if args.compute_profile:
            args.compute_profile = os.path.abspath(args.compute_profile)
        if args.compute_scale < 0:
            p.error("--compute-scale: at least 0")
        variants = []
        for v in args.peer_variants:
            v = TRAIN_DDP_VARIANTS.get(v, v)
            if v not in variants:
                variants.append(v)
        args.peer_variants = variants
        args.iters = 10 if args.iters is None else args.iters
        args.warmup = 3 if args.warmup is None else args.warmup
    else:
        args.iters = 50 if args.iters is None else args.iters
        args.warmup = 10 if args.warmup is None else args.warmup
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters: at least 1; --warmup: at least 0")
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
    rows, ddp_rows, training, train_rows = [], [], [], []
    keys_dir = None
    variants = []
    if args.peer == "ddp":
        for v in args.peer_variants:
            why = ddp_check(args, v)
            if why:
                log("DDP %s cannot run, bitpush runs alone: %s (install python3-torch, or "
                    "--peer-python PY of a Python with torch and gloo)" % (v, why))
            else:
                variants.append(v)
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
        if args.train_layout:
            plan = [("train-bitpush", spec, None) for spec in specs]
            plan += [("train-ddp", v, None) for v in variants]
        else:
            plan = [("bitpush", spec, (security, transport)) for spec in specs
                    for security in args.security for transport in args.transports]
            plan += [("ddp", v, None) for v in variants]
        runs = {item: [] for item in plan}
        for rep in range(args.repeats):
            for item in (plan if rep % 2 == 0 else list(reversed(plan))):
                kind, what, how = item
                if kind.startswith("train-"):
                    log("%s training steps of %s, %s: %d workers%s, %d+%d steps%s"
                        % ("bitpush" if kind == "train-bitpush" else "DDP (gloo)",
                           os.path.basename(args.layout_file), what, args.workers,
                           " x %d servers" % args.servers if kind == "train-bitpush" else "",
                           args.warmup, args.iters, rep_note(rep, args.repeats)))
                    runs[item].append(run_train_bitpush(args, net, what)
                                      if kind == "train-bitpush"
                                      else run_train_ddp(args, net, what))
                    r = runs[item][-1]
                    log("  median step %.1f ms (compute %.1f ms, link bound %.1f ms)"
                        % (r["step_ms"], r["compute_ms"], r["comm_bound_ms"]))
                    continue
                if kind == "bitpush":
                    security, transport = how
                    log("push_pull %s (security %s, %s): %d workers x %d servers, %g MiB, %d+%d "
                        "rounds%s" % (what, security, transport, args.workers, args.servers,
                                      args.mb, args.warmup, args.iters,
                                      rep_note(rep, args.repeats)))
                    runs[item].append(run_pushpull(args, net, what, security, keys_dir,
                                                   transport))
                else:
                    log("DDP %s (gloo): %d ranks, %g MiB, %d+%d rounds%s"
                        % (what, args.workers, args.mb, args.warmup, args.iters,
                           rep_note(rep, args.repeats)))
                    runs[item].append(run_ddp(args, net, what))
                r = runs[item][-1]
                log("  median round %.1f ms (%.2fx the line-rate bound %.1f ms)"
                    % (r["round_ms"], r["round_ms"] / r["line_rate_bound_ms"],
                       r["line_rate_bound_ms"]))
        if args.train_layout:
            train_rows = [combine(runs[item], "step_ms") for item in plan]
            for r in train_rows:
                r["step_ms_reps"] = r.pop("round_ms_reps")
        rows = [combine(runs[item], "round_ms") for item in plan if item[0] == "bitpush"]
        ddp_rows = [combine(runs[item], "round_ms") for item in plan if item[0] == "ddp"]
        for r in rows:
            r["median_round_ms"] = r["round_ms"]
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

    if args.train_layout:
        return report_train_layout(args, net, train_rows)

    def find(spec, security, transport):
        return next((r for r in rows if r["compressor"] == spec and r["security"] == security
                     and r["transport"] == transport), None)

    full_size = (args.workers, args.servers, args.mb, args.gbit) == (2, 2, 100, 1) \
        and args.delay_ms == 0 and args.loss_pct == 0
    for r in rows:
        none = find("none", r["security"], r["transport"])
        r["speedup_vs_none"] = none["median_round_ms"] / r["median_round_ms"] if none else None
        plain = find(r["compressor"], "none", r["transport"])
        r["security_ratio"] = (plain["median_round_ms"] / r["median_round_ms"]
                               if plain else None)
        target = TARGETS.get(r["compressor"])
        if target is not None and r["speedup_vs_none"]:
            r["target_speedup"] = target
            r["target_met"] = r["speedup_vs_none"] >= target
    ddp_by = {r["variant"]: r for r in ddp_rows}
    for r in rows:
        for v, d in ddp_by.items():
            r["ratio_to_ddp_" + v] = d["round_ms"] / r["round_ms"]
        base = ddp_by.get("allreduce") or (ddp_rows[0] if ddp_rows else None)
        r["ratio_to_ddp"] = base["round_ms"] / r["round_ms"] if base else None
    title = "%d workers x %d servers, %g MiB, %g Gbit/s per node%s" % (
        args.workers, args.servers, args.mb, args.gbit,
        (", %g ms, %g%% loss" % (args.delay_ms, args.loss_pct))
        if args.delay_ms or args.loss_pct else "")
    result = {"setup": {"workers": args.workers, "servers": args.servers, "mb": args.mb,
                        "partition_kb": args.partition_kb,
                        "raw_partition_kb": args.raw_partition_kb or "auto",
                        "credit_kb": args.credit_kb or "default",
                        "server_window_kb": args.server_window_kb or "auto",
                        "iters": args.iters, "warmup": args.warmup, "cpus": os.cpu_count(),
                        "security": args.security,
                        "targets_apply": full_size},
              "link": net.link_settings(), "pushpull": rows}
    if args.peer:
        result["setup"]["repeats"] = args.repeats
        result["ddp"] = ddp_rows
    if training:
        result["training"] = training
    plots = [] if args.no_plots else plot(args.out, rows, training, title)
    result["plots"] = plots
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print("### push_pull, " + title + "\n")
    print(table(rows, full_size))
    print()
    print(bound_table(rows, ddp_rows))
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
