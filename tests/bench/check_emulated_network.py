#!/usr/bin/python3
"""The bench/emulated_network.py contract, checked with a small run: 2 worker namespaces,
1 server, 4 MiB, compressors none + onebit over 1 Gbit/s links, with PyTorch DDP (gloo
all_reduce, a rank per worker namespace) alongside when /usr/bin/python3 has torch; then 1
worker, 1 server, 1 MiB of none under --security none,curve, with --peer ddp under a Python
without torch (it says why and runs bitpush alone). Then --train-layout with a two-layer layout, bitpush
none against DDP fp32 (when /usr/bin/python3 has torch). Checks results.json's fields, the
line-rate bounds exactly, and that no namespace with the run's prefix (and no keys directory)
is left.
Exits 77 (skip) when not root or when network namespaces cannot be created here.

    /usr/bin/python3 tests/bench/check_emulated_network.py BIN_DIR
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77


def skip(reason):
    print("SKIP: " + reason)
    sys.exit(SKIP)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def netns_names():
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, universal_newlines=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def has_torch_at(python):
    return subprocess.run([python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build", "bin")
    if os.geteuid() != 0:
        skip("needs root (network namespaces, veth, tc)")
    probe = "bpnet-probe-%d" % os.getpid()
    try:
        p = subprocess.run(["ip", "netns", "add", probe], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
    except OSError as e:
        skip("no `ip` tool: %s" % e)
    if p.returncode != 0:
        skip("`ip netns add` is not permitted here: " + p.stdout.strip())
    subprocess.run(["ip", "netns", "del", probe])
    for tool in ("tc",):
        if subprocess.run(["which", tool], stdout=subprocess.DEVNULL).returncode != 0:
            skip("no `%s` tool" % tool)

    prefix = "bpnet-test-%d" % os.getpid()
    has_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed as d; "
                                "assert d.is_available() and d.is_gloo_available()"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    with tempfile.TemporaryDirectory(prefix="bp-emnet-") as out:
        cmd = ["/usr/bin/python3", os.path.join(REPO, "bench", "emulated_network.py"),
               "--workers", "2", "--servers", "1", "--mb", "4", "--iters", "2", "--warmup", "1",
               "--compressors", "none,onebit", "--prefix", prefix, "--out", out,
               "--bin-dir", bin_dir, "--timeout-s", "30"]
        if has_torch:
            cmd += ["--peer", "ddp", "--peer-variant", "allreduce"]
        else:
            print("no torch with gloo at /usr/bin/python3: the DDP records are not checked")
        print(" ".join(cmd), flush=True)
        r = subprocess.run(cmd, timeout=120)
        left = [n for n in netns_names() if n.startswith(prefix)]
        if left:
            fail("namespaces left behind: %s" % left)
        if r.returncode != 0:
            fail("emulated_network.py exited %d" % r.returncode)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        for key in ("setup", "link", "pushpull", "plots"):
            if key not in res:
                fail("results.json has no '%s'" % key)
        if res["link"].get("gbit_per_direction_per_node") != 1.0:
            fail("link settings: %s" % res["link"])
        rows = {row["compressor"]: row for row in res["pushpull"]}
        if sorted(rows) != ["none", "onebit"]:
            fail("compressors %s" % sorted(rows))
        for name, row in rows.items():
            for key in ("median_round_ms", "push_bytes_per_round_per_worker",
                        "pull_bytes_per_round_per_worker", "speedup_vs_none", "error_feedback"):
                if key not in row:
                    fail("%s: no '%s' in %s" % (name, key, row))
            if not row["median_round_ms"] > 0:
                fail("%s: median_round_ms %s" % (name, row["median_round_ms"]))
        # The bound of a parameter-server round with a link per node: the busiest direction,
        # here the one server's link carrying both workers' pushes.
        for name, row in rows.items():
            push, pull = (row["push_bytes_per_round_per_worker"],
                          row["pull_bytes_per_round_per_worker"])
            want = max(push, 2 * push, pull, 2 * pull) * 8 / 1e9 * 1e3
            if abs(row["line_rate_bound_ms"] - want) > 1e-6 * want:
                fail("%s: line_rate_bound_ms %s, want %s" % (name, row["line_rate_bound_ms"], want))
            if abs(row["ratio_to_bound"] - want / row["round_ms"]) > 1e-9:
                fail("%s: ratio_to_bound %s" % (name, row["ratio_to_bound"]))
            if row.get("peer") != "bitpush" or not row.get("cpu_seconds"):
                fail("%s: peer / cpu_seconds in %s" % (name, row))
        if has_torch:
            ddp = res.get("ddp") or []
            if len(ddp) != 1:
                fail("--peer ddp: %d DDP records" % len(ddp))
            d = ddp[0]
            for key, value in (("peer", "ddp"), ("backend", "gloo"), ("variant", "allreduce"),
                               ("dtype", "float32"), ("world_size", 2),
                               ("tensor_bytes", 4 << 20), ("allreduce_bytes_per_iter", 4 << 20)):
                if d.get(key) != value:
                    fail("DDP record: %s is %r, want %r" % (key, d.get(key), value))
            # A ring all-reduce: each worker sends 2 (W - 1) / W of the bytes.
            want = 2 * (2 - 1) / 2 * (4 << 20) * 8 / 1e9 * 1e3
            if abs(d["line_rate_bound_ms"] - want) > 1e-6 * want:
                fail("DDP line_rate_bound_ms %s, want %s" % (d["line_rate_bound_ms"], want))
            if not d["round_ms"] >= want or not 0 < d["ratio_to_bound"] <= 1:
                fail("DDP round %s ms under its bound %s ms: the link is not shaped"
                     % (d["round_ms"], want))
            if abs(d["goodput_gbps"] - (4 << 20) / d["round_ms"] * 1e3 / 1e9) > 0.5 * d["goodput_gbps"]:
                fail("DDP goodput_gbps %s against round_ms %s" % (d["goodput_gbps"], d["round_ms"]))
            for name, row in rows.items():
                if abs(row["ratio_to_ddp"] - d["round_ms"] / row["round_ms"]) > 1e-9:
                    fail("%s: ratio_to_ddp %s" % (name, row.get("ratio_to_ddp")))
                if row.get("ratio_to_ddp_allreduce") != row["ratio_to_ddp"]:
                    fail("%s: ratio_to_ddp_allreduce %s" % (name, row.get("ratio_to_ddp_allreduce")))
        if rows["onebit"]["error_feedback"] != "both":
            fail("onebit error feedback %s" % rows["onebit"]["error_feedback"])
        # 4 MiB fp32 at 1 bit per element: about 32x fewer bytes pushed.
        ratio = (rows["none"]["push_bytes_per_round_per_worker"]
                 / rows["onebit"]["push_bytes_per_round_per_worker"])
        if ratio < 20:
            fail("onebit pushes only %.1fx fewer bytes than none" % ratio)
        # 2 workers x 4 MiB through one server's 1 Gbit/s link: at least ~67 ms each way.
        if rows["none"]["median_round_ms"] < 60:
            fail("none took %.1f ms per round: the link is not rate-limited"
                 % rows["none"]["median_round_ms"])
        for plot in res["plots"]:
            if not os.path.getsize(plot) > 0:
                fail("empty plot " + plot)
    none_ms, onebit_ms = rows["none"]["median_round_ms"], rows["onebit"]["median_round_ms"]

    # --security none,curve: one cluster per mode; the curve one with keys of its own.
    keys_before = set(glob.glob("/tmp/bp-emnet-keys-*"))
    with tempfile.TemporaryDirectory(prefix="bp-emnet-") as out:
        # --peer ddp under a Python that cannot import torch: the run says why, bitpush alone.
        no_torch = next(py for py in (shutil.which("python3"), "/bin/false")
                        if py and not has_torch_at(py))
        cmd = ["/usr/bin/python3", os.path.join(REPO, "bench", "emulated_network.py"),
               "--workers", "1", "--servers", "1", "--mb", "1", "--iters", "2", "--warmup", "1",
               "--compressors", "none", "--security", "none,curve", "--gbit", "10",
               "--prefix", prefix, "--out", out, "--bin-dir", bin_dir, "--timeout-s", "30",
               "--no-plots", "--peer", "ddp", "--peer-python", no_torch]
        print(" ".join(cmd), flush=True)
        r = subprocess.run(cmd, timeout=120, stderr=subprocess.PIPE, universal_newlines=True)
        sys.stderr.write(r.stderr)
        if "DDP allreduce cannot run, bitpush runs alone: " not in r.stderr:
            fail("--peer-python %s (no torch): the run did not say why DDP cannot run"
                 % no_torch)
        left = [n for n in netns_names() if n.startswith(prefix)]
        if left:
            fail("namespaces left behind: %s" % left)
        if set(glob.glob("/tmp/bp-emnet-keys-*")) - keys_before:
            fail("the keys directory was left behind")
        if r.returncode != 0:
            fail("emulated_network.py --security none,curve exited %d" % r.returncode)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        got = [(row["compressor"], row["security"]) for row in res["pushpull"]]
        if got != [("none", "none"), ("none", "curve")]:
            fail("--security none,curve ran %s" % got)
        if res.get("ddp") != []:
            fail("DDP records without torch: %s" % res.get("ddp"))
        curve = res["pushpull"][1]
        if not curve["median_round_ms"] > 0 or not curve.get("security_ratio"):
            fail("curve row %s" % curve)
        with open(os.path.join(out, "work", "none-curve.yaml")) as f:
            if "mode: curve" not in f.read():
                fail("the curve cluster's YAML has no security.mode curve")
    if has_torch:
        check_train_layout(bin_dir, prefix)
    else:
        print("no torch with gloo at /usr/bin/python3: --train-layout is not checked")
    print("OK: none %.1f ms, onebit %.1f ms per round; curve/none %.2f; no namespace left"
          % (none_ms, onebit_ms, curve["security_ratio"]))
    return 0


def check_train_layout(bin_dir, prefix):
    """--train-layout: a two-layer layout's training steps, bitpush none against DDP fp32,
    one rank per worker namespace; the records' bounds and ratios exactly."""
    with tempfile.TemporaryDirectory(prefix="bp-emnet-") as out:
        layout = os.path.join(out, "tiny.json")
        with open(layout, "w") as f:
            json.dump({"model": "tiny",
                       "tensors": [{"name": "a", "shape": [256, 256], "dtype": "float32"},
                                   {"name": "b", "shape": [256], "dtype": "float32"}],
                       "layers": [{"name": "l0", "backward_ms": 2.0, "tensors": ["a", "b"]}]},
                      f)
        cmd = ["/usr/bin/python3", os.path.join(REPO, "bench", "emulated_network.py"),
               "--workers", "2", "--servers", "1", "--train-layout", layout, "--iters", "2",
               "--warmup", "1", "--compressors", "none", "--peer", "ddp", "--prefix", prefix,
               "--out", out, "--bin-dir", bin_dir, "--timeout-s", "60"]
        print(" ".join(cmd), flush=True)
        r = subprocess.run(cmd, timeout=180)
        left = [n for n in netns_names() if n.startswith(prefix)]
        if left:
            fail("--train-layout: namespaces left behind: %s" % left)
        if r.returncode != 0:
            fail("emulated_network.py --train-layout exited %d" % r.returncode)
        with open(os.path.join(out, "results.json")) as f:
            rows = json.load(f)["train_layout"]
        got = [(row["peer"], row.get("compression") or row.get("variant")) for row in rows]
        if got != [("bitpush", "none"), ("ddp", "fp32")]:
            fail("--train-layout ran %s" % got)
        bp, ddp = rows
        model = (256 * 256 + 256) * 4
        for row in rows:
            if row["model_bytes"] != model or row["compute_ms"] != 2.0 or row["workers"] != 2:
                fail("--train-layout record %s" % row)
            if row["step_bound_ms"] != max(row["compute_ms"], row["comm_bound_ms"]):
                fail("step_bound_ms %s" % row)
        # bitpush: 2 workers' pushes through the one server's link; DDP: a ring of the model.
        push, pull = bp["bytes_pushed_per_worker"], bp["bytes_pulled_per_worker"]
        want = max(push, 2 * push, pull, 2 * pull) * 8 / 1e9 * 1e3
        if abs(bp["comm_bound_ms"] - want) > 1e-9 * want or push < model:
            fail("bitpush comm_bound_ms %s, want %s (pushed %s)" % (bp["comm_bound_ms"], want,
                                                                  push))
        want = 2 * (2 - 1) / 2 * model * 8 / 1e9 * 1e3
        if ddp["allreduce_bytes_per_step"] != model or abs(ddp["comm_bound_ms"] - want) > 1e-9:
            fail("DDP comm_bound_ms %s, want %s" % (ddp["comm_bound_ms"], want))
        if bp["ratio_to_ddp"] != ddp["step_ms"] / bp["step_ms"] or \
                bp["ratio_to_ddp_fp32"] != bp["ratio_to_ddp"]:
            fail("ratio_to_ddp %s" % bp)


if __name__ == "__main__":
    sys.exit(main())
