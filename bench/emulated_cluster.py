"""The clusters of bench/emulated_network.py: a cluster YAML for the emulated network's
namespaces (write_yaml), its scheduler and servers started there (start_control), the error
feedback a method's runs use, and the line-rate bounds every record is compared with (the
busiest link direction's bytes at --gbit; the same formulas as bench/pushpull/line_rate.h).
Shared by the push_pull rounds and the training steps of model layouts. Not a program of its
own; single-threaded (the driver's thread).
"""

import os

DDP_PORT = 29500  # torchrun's default MASTER_PORT (below Linux's ephemeral range)


def ddp_rank_env(net, rank, workers):
    """The environment of DDP rank `rank` in worker namespace w<rank>, as torchrun sets it up
    (MASTER_ADDR worker 0), gloo on the node's shaped eth0."""
    env = dict(os.environ)
    env.update({"MASTER_ADDR": net.ip("w0"), "MASTER_PORT": str(DDP_PORT), "RANK": str(rank),
                "WORLD_SIZE": str(workers), "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "eth0"})
    return env


def start_worker_ranks(procs, args, net, argv, env_of, label, log_stem, results):
    """Starts `argv` in every worker namespace w<i> with environment env_of(i), rank 0 adding
    --results `results`; logs at args.work/<log_stem><i>.log, processes labelled
    "<label> <i>" (procs.wait_all bounds them)."""
    for w in range(args.workers):
        procs.start("%s %d" % (label, w), net.ns("w%d" % w),
                    argv + (["--results", results] if w == 0 else []),
                    os.path.join(args.work, "%s%d.log" % (log_stem, w)), env=env_of(w))


def bitpush_worker_env(args, yaml, rank):
    """The environment of an embedded bitpush training process on worker node `rank`."""
    env = dict(os.environ)
    env.update({"BITPUSH_CONFIG": yaml, "BITPUSH_WORKER_RANK": str(rank),
                "BITPUSH_LOCAL_RANK": "0", "BITPUSH_LOCAL_SIZE": "1",
                "BITPUSH_MODE": "embedded", "BITPUSH_BIN_DIR": args.bin_dir,
                "PYTHONPATH": args.python_dir, "OMP_NUM_THREADS": "1"})
    return env

def error_feedback_for(spec):
    """The compression.error_feedback a method's rounds run with: both for the biased ones and
    binsgdm (paper 004 Algorithm 1 keeps worker and server errors), worker for separate (its
    moving-average error; servers only sum projections), none for the unbiased ones."""
    name = spec.split(":")[0]
    if name in ("onebit", "topk", "binsgdm"):
        return "both"
    return "worker" if name == "separate" else "none"


def write_yaml(path, net, servers, workers, spec, ef, min_compress_bytes, timeout_s, tuning,
               keys_dir=None, transport="zmq"):
    y = ["cluster:",
         "  scheduler: %s:9000" % net.ip("sched"),
         "  servers: [%s]" % ", ".join("%s:9100" % net.ip("s%d" % i) for i in range(servers)),
         "  workers: [%s]" % ", ".join("%s:9200" % net.ip("w%d" % i) for i in range(workers)),
         "  heartbeat_interval_ms: 500",
         "  heartbeat_timeout_ms: 5000",
         "  startup_timeout_s: 30"]
    if transport == "ucx":
        # The data plane over UCX's TCP lanes on each node's eth0 (the shaped link).
        y += ["  transport: ucx", "  ucx:", "    port_offset: 1000", '    tls: "tcp"',
              '    net_devices: "eth0"']
    y += [
         "compression:",
         '  spec: "%s"' % spec,
         "  error_feedback: %s" % ef,
         "  min_compress_bytes: %d" % min_compress_bytes,
         "  partition_bytes: %d" % (tuning.partition_kb * 1024),
         "server:",
         "  engine_threads: %s" % (tuning.engine_threads or "auto"),
         "  numa: %s" % tuning.server_numa,
         "worker:",
         "  op_timeout_s: %d" % timeout_s,
         "  compress_threads: %s" % (tuning.compress_threads or "auto")]
    if tuning.raw_partition_kb:
        y.insert(y.index("server:"), "  raw_partition_bytes: %d" % (tuning.raw_partition_kb * 1024))
    if tuning.credit_kb:
        y += ["  credit_bytes: %d" % (tuning.credit_kb * 1024)]
    if tuning.server_window_kb:
        y += ["  server_window_bytes: %d" % (tuning.server_window_kb * 1024)]
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


# ---- line-rate bounds ------------------------------------------------------------------------
# The time the busiest link direction needs at --gbit (each node has its own link, full duplex;
# the same formulas as bench/pushpull/line_rate.h).

def line_rate_ms(nbytes, gbit):
    return nbytes * 8 / (gbit * 1e9) * 1e3


def pushpull_bound_ms(push_bytes, pull_bytes, workers, servers, gbit):
    """A parameter-server round: a worker's link carries its push one way and its pull the
    other; a server's link W x push / S and W x pull / S."""
    up = max(push_bytes, workers * push_bytes / servers)
    down = max(pull_bytes, workers * pull_bytes / servers)
    return line_rate_ms(max(up, down), gbit)


def ring_allreduce_bound_ms(allreduce_bytes, workers, gbit):
    """A ring all-reduce: each worker sends (and receives) 2 (W - 1) / W of the bytes."""
    return line_rate_ms(2 * (workers - 1) / workers * allreduce_bytes, gbit)


