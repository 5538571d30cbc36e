#!/usr/bin/python3
"""The bench/emulated_network.py contract, checked with a small run: 2 worker namespaces,
1 server, 4 MiB, compressors none + onebit over 1 Gbit/s links; then 1 worker, 1 server, 1 MiB
of none under --security none,curve. Checks results.json's fields and that no namespace with
the run's prefix (and no keys directory) is left. Exits 77 (skip) when not root or when
network namespaces cannot be created here.

    /usr/bin/python3 tests/bench/check_emulated_network.py BIN_DIR
"""

import glob
import json
import os
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
    with tempfile.TemporaryDirectory(prefix="bp-emnet-") as out:
        cmd = ["/usr/bin/python3", os.path.join(REPO, "bench", "emulated_network.py"),
               "--workers", "2", "--servers", "1", "--mb", "4", "--iters", "2", "--warmup", "1",
               "--compressors", "none,onebit", "--prefix", prefix, "--out", out,
               "--bin-dir", bin_dir, "--timeout-s", "30"]
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
        cmd = ["/usr/bin/python3", os.path.join(REPO, "bench", "emulated_network.py"),
               "--workers", "1", "--servers", "1", "--mb", "1", "--iters", "2", "--warmup", "1",
               "--compressors", "none", "--security", "none,curve", "--gbit", "10",
               "--prefix", prefix, "--out", out, "--bin-dir", bin_dir, "--timeout-s", "30",
               "--no-plots"]
        print(" ".join(cmd), flush=True)
        r = subprocess.run(cmd, timeout=120)
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
        curve = res["pushpull"][1]
        if not curve["median_round_ms"] > 0 or not curve.get("security_ratio"):
            fail("curve row %s" % curve)
        with open(os.path.join(out, "work", "none-curve.yaml")) as f:
            if "mode: curve" not in f.read():
                fail("the curve cluster's YAML has no security.mode curve")
    print("OK: none %.1f ms, onebit %.1f ms per round; curve/none %.2f; no namespace left"
          % (none_ms, onebit_ms, curve["security_ratio"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
