#!/usr/bin/python3
"""`bitpush-bench train`: training steps of a model layout on loopback, bitpush with each of
--compressors against PyTorch DDP with each --peer-variant, alternating in one invocation
(docs/benchmarks.md, "Training steps of model layouts").

    bitpush-bench train --layout bert-base --workers 4 --servers 4 \
        --compressors none,onebit --peer ddp --peer-variant fp32,powersgd --json

Every run is bench/train_driver.py --local W (W rank processes on loopback; bitpush ranks
against a bitpush.testing.LocalCluster of --servers servers). --repeats R runs every
configuration R times, the order reversed on odd alternations; each record is the median
alternation (step_ms_reps lists them all). bitpush records carry ratio_to_ddp (DDP fp32's
step / this one's; > 1: bitpush is faster) and ratio_to_ddp_<variant> for every variant that
ran. Across emulated links the same runs come from
bench/emulated_network.py --train-layout MODEL --peer ddp.

Output: a table, or with --json the JSON array of records on stdout (progress on stderr).
Exit: 0 ok, 1 a run failed (its output names why), 2 usage.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from train_driver import layout_file  # bench/train_driver.py

BENCH = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(BENCH, "train_driver.py")
DDP_VARIANTS = ("fp32", "fp16", "powersgd")


def log(msg):
    print("bitpush-bench train: " + msg, file=sys.stderr, flush=True)


def run_one(a, system, what, port):
    """One train_driver.py --local run; its rank 0 result."""
    argv = [a.python, DRIVER, "--layout", a.layout_file, "--system", system, "--local",
            str(a.workers), "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--compute-scale", "%.17g" % a.compute_scale, "--timeout-s", str(a.timeout_s)]
    if a.compute_profile:
        argv += ["--compute-profile", a.compute_profile]
    if system == "ddp":
        argv += ["--variant", what, "--master-port", str(port)]
    else:
        argv += ["--compression", what, "--servers", str(a.servers)]
    with tempfile.TemporaryFile(mode="w+") as out:
        p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, universal_newlines=True)
        out.seek(0)
        text = out.read()
    if p.returncode != 0:
        raise RuntimeError("%s %s failed (exit %d): %s" % (system, what, p.returncode,
                                                          text.strip()[-2000:]))
    result = json.loads(text[text.index("{"):text.rindex("}") + 1])
    result["link"] = "loopback"
    if system == "bitpush":
        result["servers"] = a.servers
    return result


def combine(runs):
    """The alternations of one configuration: the median one, with every step_ms."""
    runs = sorted(runs, key=lambda r: r["step_ms"])
    out = dict(runs[len(runs) // 2])
    out["step_ms_reps"] = [round(r["step_ms"], 3) for r in runs]
    out["repeats"] = len(runs)
    return out


def compare(rows):
    """bitpush records against every DDP variant that ran."""
    ddp = {r["variant"]: r for r in rows if r["peer"] == "ddp"}
    for r in rows:
        if r["peer"] != "bitpush":
            continue
        for v, d in ddp.items():
            r["ratio_to_ddp_" + v] = d["step_ms"] / r["step_ms"]
        r["ratio_to_ddp"] = ddp["fp32"]["step_ms"] / r["step_ms"] if "fp32" in ddp else None


def table(rows):
    lines = ["| system | what | step (ms, median) | compute (ms) | exposed comm (ms) | "
             "MB/worker/step | DDP fp32 step / this |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        what = r["compression"] if r["peer"] == "bitpush" else "gloo " + r["variant"]
        vs = r.get("ratio_to_ddp")
        lines.append("| %s | %s | %.1f | %.1f | %.1f | %.2f | %s |" % (
            r["peer"], what, r["step_ms"], r["compute_ms"], r["comm_exposed_ms"],
            r["bytes_per_worker"] / 1e6, "%.2fx" % vs if vs else "-"))
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bitpush-bench train",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", required=True,
                   help="a layout under bench/layouts/ (resnet50, vgg16, bert-base, "
                        "gpt2-small) or a layout JSON")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--compressors", default="none,onebit",
                   help="bitpush's specs, comma-separated (default %(default)s); '' for none")
    p.add_argument("--peer", choices=("ddp",), default=None,
                   help="ddp: torch's DistributedDataParallel over gloo on the same layout")
    p.add_argument("--peer-variant", default="fp32",
                   help="DDP variants, comma-separated: fp32 (no hook), fp16 (torch's "
                        "fp16_compress_hook), powersgd (torch's powerSGD_hook, rank 4)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps first (>= 2 with powersgd, whose hook starts at the "
                        "third step)")
    p.add_argument("--repeats", type=int, default=1, help="alternations of every run")
    p.add_argument("--compute-scale", type=float, default=1.0)
    p.add_argument("--compute-profile", default=None, metavar="FILE",
                   help="per-layer backward ms instead of the layout's (train_driver.py)")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="the Python with torch (and gloo) that runs every rank")
    p.add_argument("--master-port", type=int, default=29431, help="DDP's, on loopback")
    p.add_argument("--timeout-s", type=float, default=900, help="bound on each run")
    p.add_argument("--json", action="store_true", help="JSON records on stdout")
    a = p.parse_args(argv)
    try:
        a.layout_file = layout_file(a.layout)
    except ValueError as e:
        p.error(str(e))
    a.specs = [s for s in a.compressors.split(",") if s]
    a.variants = []
    if a.peer:
        for v in a.peer_variant.split(","):
            if v not in DDP_VARIANTS:
                p.error("--peer-variant: '%s' is not a variant (%s)" % (v, ", ".join(DDP_VARIANTS)))
            if v not in a.variants:
                a.variants.append(v)
    if not a.specs and not a.variants:
        p.error("nothing to run: no --compressors and no --peer")
    if a.workers < 1 or a.servers < 1 or a.steps < 1 or a.warmup < 0 or a.repeats < 1:
        p.error("--workers, --servers, --steps, --repeats at least 1; --warmup at least 0")
    if "powersgd" in a.variants and a.warmup < 2:
        p.error("--warmup: at least 2 with powersgd (its hook all-reduces plainly for the "
                "first two steps)")
    if a.compute_profile:
        a.compute_profile = os.path.abspath(a.compute_profile)
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    plan = [("bitpush", s) for s in a.specs] + [("ddp", v) for v in a.variants]
    runs = {item: [] for item in plan}
    try:
        for rep in range(a.repeats):
            for i, item in enumerate(plan if rep % 2 == 0 else list(reversed(plan))):
                system, what = item
                log("%s %s: %s, %d workers%s, %d+%d steps%s" % (
                    system, what, os.path.basename(a.layout_file), a.workers,
                    " x %d servers" % a.servers if system == "bitpush" else "", a.warmup,
                    a.steps, "" if a.repeats == 1 else " (alternation %d of %d)"
                    % (rep + 1, a.repeats)))
                # A fresh port per DDP run: the last run's sockets may linger in TIME_WAIT.
                runs[item].append(run_one(a, system, what, a.master_port + i))
                log("  median step %.1f ms" % runs[item][-1]["step_ms"])
    except (RuntimeError, ValueError) as e:
        log(str(e))
        return 1
    rows = [combine(runs[item]) for item in plan]
    compare(rows)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
