"""--train-layout of bench/emulated_network.py: training steps of a model layout across the
emulated links, bitpush (a cluster in the namespaces, a bench/train_driver.py rank in each
worker namespace) and PyTorch DDP (a gloo rank in each worker namespace), and their report
(results.json's `train_layout` records and the table). Not a program of its own;
single-threaded (the driver's thread).
"""

import json
import os
import re
import time

from emulated_cluster import (bitpush_worker_env, ddp_rank_env,  # bench/emulated_cluster.py
                              error_feedback_for, pushpull_bound_ms, ring_allreduce_bound_ms,
                              start_control, start_worker_ranks, write_yaml)
from netns import Procs  # bench/netns.py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_DRIVER = os.path.join(REPO, "bench", "train_driver.py")
# DDP's variants here (train_driver.py --variant); allreduce and ddp name its plain fp32 DDP,
# as --peer-variant's default does.
TRAIN_DDP_VARIANTS = {"allreduce": "fp32", "ddp": "fp32", "fp32": "fp32", "fp16": "fp16",
                      "powersgd": "powersgd"}
# The size threshold of --train-layout clusters: the configuration's default.
TRAIN_MIN_COMPRESS_BYTES = 4096


def train_argv(args, system):
    return [args.peer_python, TRAIN_DRIVER, "--layout", args.layout_file, "--system", system,
            "--steps", str(args.iters), "--warmup", str(args.warmup),
            "--compute-scale", "%.17g" % args.compute_scale] + \
        (["--compute-profile", args.compute_profile] if args.compute_profile else [])


def run_ranks(args, res, start):
    """Runs what `start(procs)` starts (bounded by --timeout-s, everything killed after) and
    returns rank 0's result at `res` with the processes' cpu_seconds and the wall_seconds."""
    if os.path.exists(res):
        os.remove(res)
    procs = Procs()
    t0 = time.time()
    try:
        start(procs)
        procs.wait_all(args.timeout_s)
        cpu = procs.cpu_seconds()
    finally:
        procs.kill_all()
    with open(res) as f:
        r = json.load(f)
    r["cpu_seconds"] = cpu
    r["wall_seconds"] = time.time() - t0
    return r


def run_train_bitpush(args, net, spec):
    """A bitpush cluster in the namespaces (scheduler, S servers) and a train_driver.py rank in
    each worker namespace, the layout's gradients as `spec`; rank 0's result."""
    ef = error_feedback_for(spec)
    tag = "layout-" + re.sub(r"[^A-Za-z0-9]+", "_", spec)
    yaml = os.path.join(args.work, tag + ".yaml")
    write_yaml(yaml, net, args.servers, args.workers, spec, ef, TRAIN_MIN_COMPRESS_BYTES,
               args.timeout_s, args)
    res = os.path.join(args.work, tag + ".json")

    def start(procs):
        start_control(procs, args, net, yaml, tag)
        start_worker_ranks(procs, args, net, train_argv(args, "bitpush") + ["--compression", spec],
                           lambda w: bitpush_worker_env(args, yaml, w), "worker",
                           tag + "-worker", res)

    r = run_ranks(args, res, start)
    r.update({"servers": args.servers, "error_feedback": ef,
              "min_compress_bytes": TRAIN_MIN_COMPRESS_BYTES,
              "comm_bound_ms": pushpull_bound_ms(r["bytes_pushed_per_worker"],
                                                 r["bytes_pulled_per_worker"], args.workers,
                                                 args.servers, args.gbit)})
    return r


def run_train_ddp(args, net, variant):
    """A gloo process group with a train_driver.py rank in each worker namespace (MASTER_ADDR
    worker 0, as torchrun sets it up), DDP on the layout; rank 0's result."""
    tag = "layout-ddp-" + variant
    res = os.path.join(args.work, tag + ".json")
    r = run_ranks(args, res, lambda procs: start_worker_ranks(
        procs, args, net, train_argv(args, "ddp") + ["--variant", variant],
        lambda w: ddp_rank_env(net, w, args.workers), "ddp rank", tag + "-rank", res))
    r["comm_bound_ms"] = ring_allreduce_bound_ms(r["allreduce_bytes_per_step"], args.workers,
                                                 args.gbit)
    return r


def step_bound_ms(r):
    """The step's floor on this link: the backward compute or the busiest link direction's
    bytes, whichever is longer (perfect overlap)."""
    return max(r["compute_ms"], r["comm_bound_ms"])


def train_table(rows):
    lines = ["| system | what | step (ms, median) | compute (ms) | exposed comm (ms) | "
             "bytes/worker/step (MB) | link bound (ms) | DDP fp32 step / this | CPU s (workers, "
             "servers) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cpu = r.get("cpu_seconds", {})
        work = sum(v for k, v in cpu.items() if k.startswith(("worker", "ddp rank")))
        serv = sum(v for k, v in cpu.items() if k.startswith(("server", "scheduler")))
        what = r["compression"] if r["peer"] == "bitpush" else "gloo " + r["variant"]
        vs = r.get("ratio_to_ddp")
        lines.append("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.1f, %.1f |" % (
            r["peer"], what, r["step_ms"], r["compute_ms"], r["comm_exposed_ms"],
            r["bytes_per_worker"] / 1e6, r["comm_bound_ms"], "%.2fx" % vs if vs else "-",
            work, serv))
    return "\n".join(lines)


def report_train_layout(args, net, rows):
    """--train-layout's results.json and table: every run's step record, bitpush's against
    each DDP variant that ran (ratio_to_ddp: DDP fp32's step / this one's)."""
    ddp_by = {r["variant"]: r for r in rows if r["peer"] == "ddp"}
    for r in rows:
        r["step_bound_ms"] = step_bound_ms(r)
        r["ratio_to_step_bound"] = r["step_bound_ms"] / r["step_ms"]
        if r["peer"] != "bitpush":
            continue
        for v, d in ddp_by.items():
            r["ratio_to_ddp_" + v] = d["step_ms"] / r["step_ms"]
        base = ddp_by.get("fp32")
        r["ratio_to_ddp"] = base["step_ms"] / r["step_ms"] if base else None
    model = rows[0]["model"] if rows else os.path.basename(args.layout_file)
    title = "%s, %d workers x %d servers, %g Gbit/s per node" % (model, args.workers,
                                                                 args.servers, args.gbit)
    result = {"setup": {"layout": args.layout_file, "model": model, "workers": args.workers,
                        "servers": args.servers, "steps": args.iters, "warmup": args.warmup,
                        "compute_scale": args.compute_scale,
                        "compute_profile": args.compute_profile, "repeats": args.repeats,
                        "partition_kb": args.partition_kb,
                        "min_compress_bytes": TRAIN_MIN_COMPRESS_BYTES,
                        "cpus": os.cpu_count(), "python": args.peer_python},
              "link": net.link_settings(), "train_layout": rows}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print("### training steps, " + title + "\n")
    print(train_table(rows))
    print("\nresults: %s" % os.path.join(args.out, "results.json"))
    return 0


