#!/usr/bin/env python3
"""What a restart under `bitpush launch --max-restarts` costs (docs/benchmarks.md, "Restarts").

    PYTHONPATH=build/python /usr/bin/python3 bench/restart_bench.py --kills 5 --json restart.json

Starts a local cluster of 2 workers and 2 servers (embedded mode, CLAN + onebit, error feedback
both) under `bitpush launch --max-restarts`, with a small training script that records, per
process, when it was exec'd, when its imports were done, when bp.init returned, when
Checkpointer.resume returned and when its first step was done. A killer SIGKILLs a process of
each role in turn (scheduler, server, training process, ...) once training made progress
since the last kill. Per kill:

  restart_s           the kill -> the new run's first step done (the slowest process)
  startup_s           the new run's own start-up: exec -> imports done (the slowest process)
  restart_net_s       restart_s - startup_s: what the issue bounds by 3 s ("excluding the
                      training script's own start-up")
  launcher_s          the kill -> the first process of the new run exec'd (detection, kill,
                      reap, spawn)
  init_s / resume_s   bp.init (registration in the new cluster) / resume, slowest process

A killed server is restarted in place when --rejoin is given (the YAML's
server_rejoin_timeout_s); then the restart is measured to the first step after recover().
The JSON has every kill and the median / max of each figure.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TRAINER = r"""
import json, os, sys, time
t_exec = time.time()
import torch
import bitpush.torch as bp
t_imports = time.time()
stamps, total, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
bp.init()
t_init = time.time()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
named = [("m." + n, p) for n, p in model.named_parameters()]
opt = bp.CLAN([p for _, p in named], lr=0.01, named_parameters=named)
ckpt = bp.Checkpointer(os.path.join(stamps, "ckpt"), model, opt, every_steps=every)
step = ckpt.resume()
t_resume = time.time()
rec = {"restart": int(os.environ.get("BITPUSH_RESTART_COUNT", "0")), "rank": bp.rank(),
       "exec": t_exec, "imports": t_imports, "init": t_init, "resume": t_resume,
       "first_step": None, "recovered": []}
path = os.path.join(stamps, "r%d-%d.json" % (rec["restart"], bp.rank()))

def dump():
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".tmp", path)

recovering = False
while step < total:
    try:
        g = torch.Generator().manual_seed(step * 10 + bp.rank())
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
        if rec["first_step"] is None:
            rec["first_step"] = time.time()
            dump()
        if recovering:
            rec["recovered"].append(time.time())
            dump()
            recovering = False
        ckpt.step(step)
    except bp.BitpushError as e:
        step = ckpt.recover(e)
        recovering = True
opt.remove_hooks()
bp.shutdown()
"""


def newest(ckpt):
    try:
        return max((int(n[5:]) for n in os.listdir(ckpt) if n.startswith("step-")
                    and os.path.exists(os.path.join(ckpt, n, "COMPLETE"))), default=-1)
    except OSError:
        return -1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--rejoin", action="store_true",
                   help="set server_rejoin_timeout_s: a killed server restarts in place")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from bitpush.testing import free_ports, launched_processes

    d = tempfile.mkdtemp(prefix="bp-restart-")
    ports = free_ports(5)
    cfg = os.path.join(d, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write("cluster:\n  scheduler: 127.0.0.1:%d\n" % ports[0])
        f.write("  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (ports[1], ports[2]))
        f.write("  workers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (ports[3], ports[4]))
        f.write("  heartbeat_interval_ms: 200\n  heartbeat_timeout_ms: 1000\n"
                "  startup_timeout_s: 30\n")
        if args.rejoin:
            f.write("  server_rejoin_timeout_s: 20\n")
        f.write("compression:\n  spec: onebit\n  error_feedback: both\n  min_compress_bytes: 64\n"
                "server:\n  engine_threads: 1\n  numa: off\n"
                "worker:\n  compress_threads: 1\n")
    script = os.path.join(d, "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "bitpush.launch", "launch", "--config", cfg, "--max-restarts",
         str(args.kills + 2), "--", sys.executable, script, d, str(args.steps), str(args.every)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    rng = random.Random(args.seed)
    roles = ["scheduler", "server", "train"]
    kills = []
    try:
        last = -1
        while len(kills) < args.kills and launcher.poll() is None:
            n = newest(os.path.join(d, "ckpt"))
            if n <= last or n > args.steps - 10 * args.every:
                time.sleep(0.05)
                continue
            time.sleep(rng.uniform(0.5, 1.5))
            role = roles[len(kills) % len(roles)]
            victims = [pid for pid, r in launched_processes(launcher.pid) if r == role]
            if not victims:
                continue
            victim = rng.choice(victims)
            os.kill(victim, signal.SIGKILL)
            kills.append({"role": role, "pid": victim, "at": time.time()})
            last = newest(os.path.join(d, "ckpt"))
        out, _ = launcher.communicate(timeout=900)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    if launcher.returncode != 0:
        print(out, file=sys.stderr)
        raise SystemExit("restart_bench: the launcher exited %d" % launcher.returncode)

    runs = {}
    for name in os.listdir(d):
        if name.startswith("r") and name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                rec = json.load(f)
            runs.setdefault(rec["restart"], []).append(rec)
    records = []
    # BITPUSH_RESTART_COUNT counts every restart, in place or not: the run started after
    # kill i (1-based) has count i; a server restarted in place leaves the run of the
    # largest count below i going.
    for i, k in enumerate(kills, 1):
        if args.rejoin and k["role"] == "server":
            recs = runs.get(max((c for c in runs if c < i), default=-1), [])
            after = [min((t for t in r["recovered"] if t > k["at"]), default=None) for r in recs]
            if len(after) != 2 or None in after:
                continue
            records.append({"role": k["role"], "in_place": True,
                            "restart_s": max(after) - k["at"], "startup_s": 0.0,
                            "restart_net_s": max(after) - k["at"]})
            continue
        recs = runs.get(i, [])
        if len(recs) != 2 or any(r["first_step"] is None for r in recs):
            continue
        rec = {"role": k["role"], "in_place": False,
               "restart_s": max(r["first_step"] for r in recs) - k["at"],
               "startup_s": max(r["imports"] - r["exec"] for r in recs),
               "launcher_s": min(r["exec"] for r in recs) - k["at"],
               "init_s": max(r["init"] - r["imports"] for r in recs),
               "resume_s": max(r["resume"] - r["init"] for r in recs)}
        rec["restart_net_s"] = rec["restart_s"] - rec["startup_s"]
        records.append(rec)
    summary = {"bench": "restart", "kills": len(kills), "measured": len(records),
               "rejoin": args.rejoin, "steps": args.steps, "checkpoint_every": args.every,
               "target_restart_net_s": 3.0, "records": records}
    for key in ("restart_s", "startup_s", "restart_net_s", "launcher_s", "init_s", "resume_s"):
        vals = [r[key] for r in records if key in r]
        if vals:
            summary[key + "_median"] = statistics.median(vals)
            summary[key + "_max"] = max(vals)
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    main()
