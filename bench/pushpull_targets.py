#!/usr/bin/env python3
"""Checks `bitpush-bench pushpull --json` output against the push-pull targets (1 worker, 1 server,
100 MiB in partitions of 4000 KiB; every figure a ratio within one run) and prints a Markdown
table. Exit 1 if a target is missed.

usage: pushpull_targets.py RESULT.json
       pushpull_targets.py --run [BENCH]   (runs BENCH, default build/bin/bitpush-bench, as
                                            below, prints its JSON, then checks it)

  BENCH pushpull --json --workers 1 --servers 1 --mb 100 --partition-kb 4000 \\
        --compressor none,onebit,topk:ratio=0.01 --security none,curve --iters 20

Targets (the first two on the records under security none):
  none                      goodput_gbps >= 0.6 x raw_tcp_gbps of the same run
  onebit (error feedback)   goodput_gbps >= 2 x the none goodput of the same run
  topk:ratio=0.01 (error feedback)  the same, when a topk:ratio=0.01 record is there
  none under curve          goodput_gbps >= 0.8 x none under security none (security_ratio)
  onebit under curve        goodput_gbps >= 0.95 x onebit under security none (security_ratio)
  every record              server_peak_rss_mb <= 4 x server_owned_mb + 64 (rss_target_mb)
The security targets are checked when the JSON has curve records (a record without a
`security` field ran under none).

When the JSON has ps-lite records (`bitpush-bench pushpull --peer pslite --pslite-dir DIR`,
bench/peers/README.md), at the sizes that ran:
  none (bitpush)            goodput_gbps >= 1.3 x the ps-lite goodput of the same run (medians)
and the onebit target is checked only if a onebit record is there. Records are told apart by
their `peer` field ("bitpush" or "pslite"; a record without one is bitpush's).

Also printed, for information (not a target): none goodput / raw_tcp_duplex_gbps, the raw TCP
throughput per direction when both ends send at once (ratio_to_raw_tcp_duplex): a push_pull
moves the bytes both ways at once, and on loopback both directions share the same CPUs.
"""
import json
import subprocess
import sys

RUN_ARGS = ["pushpull", "--json", "--workers", "1", "--servers", "1", "--mb", "100",
            "--partition-kb", "4000", "--compressor", "none,onebit,topk:ratio=0.01",
            "--security", "none,curve",
            "--iters", "20"]


def load():
    if len(sys.argv) >= 2 and sys.argv[1] == "--run":
        bench = sys.argv[2] if len(sys.argv) >= 3 else "build/bin/bitpush-bench"
        print("$ " + " ".join([bench] + RUN_ARGS))
        r = subprocess.run([bench] + RUN_ARGS, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            sys.exit(f"benchmark failed ({r.returncode}):\n{r.stderr}")
        print(r.stdout)
        return json.loads(r.stdout)
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    return json.load(open(sys.argv[1]))


records = load()
pslite = [r for r in records if r.get("peer") == "pslite"]
records = [r for r in records if r.get("peer", "bitpush") == "bitpush"]
by_spec = {r["compressor"].split(":")[0]: r for r in records
           if r.get("security", "none") == "none"}
topk = next((r for r in records if r["compressor"] == "topk:ratio=0.01"
             and r.get("security", "none") == "none"), None)
curve = {r["compressor"].split(":")[0]: r for r in records if r.get("security") == "curve"}
for need in ("none",) if pslite else ("none", "onebit"):
    if need not in by_spec:
        sys.exit(f"no '{need}' record under security none: run with --compressor none,onebit")
none, onebit = by_spec["none"], by_spec.get("onebit")
if onebit is not None and onebit["error_feedback"] == "none":
    sys.exit("the onebit record ran without error feedback; the target is onebit with it")
for r in records:
    if (r["workers"], r["servers"], r["partition_kb"]) != (1, 1, 4000) or r["mb"] < 100:
        print(f"note: {r['compressor']} ran with {r['workers']} worker(s), {r['servers']} "
              f"server(s), {r['mb']} MiB, {r['partition_kb']} KiB partitions: the targets are "
              "for 1 x 1, 100 MiB, 4000 KiB")

print(f"raw TCP reference: {none['raw_tcp_gbps']:.2f} GB/s one way"
      + (f", {none['raw_tcp_duplex_gbps']:.2f} GB/s per direction both ways at once"
         if "raw_tcp_duplex_gbps" in none else "")
      + (f"; servers behind an emulated {none['link_gbit']:g} Gbit/s link"
         if none.get("link_gbit", 0) > 0 else "")
      + "; goodput in GB/s per worker per direction\n")
print("| target | measured | required | |")
print("|---|---|---|---|")
ok = True


def row(name, got, need, text):
    global ok
    met = got >= need
    ok &= met
    print(f"| {name} | {text} | ≥ {need:g} | {'ok' if met else 'MISSED'} |")


row("none goodput / raw TCP", none["ratio_to_raw_tcp"], 0.6,
    f"{none['goodput_gbps']:.3f} / {none['raw_tcp_gbps']:.3f} = "
    f"{none['ratio_to_raw_tcp']:.2f}")
if "raw_tcp_duplex_gbps" in none:
    print(f"| (info) none goodput / raw TCP both ways at once | {none['goodput_gbps']:.3f} / "
          f"{none['raw_tcp_duplex_gbps']:.3f} = {none['ratio_to_raw_tcp_duplex']:.2f} | — | "
          "info |")
if onebit is not None:
    ratio = onebit["goodput_gbps"] / none["goodput_gbps"]
    row(f"onebit (ef {onebit['error_feedback']}) goodput / none", ratio, 2.0,
        f"{onebit['goodput_gbps']:.3f} / {none['goodput_gbps']:.3f} = {ratio:.2f}")
else:
    print("| (info) onebit goodput / none | no onebit record | — | not checked |")
if topk is not None:
    ratio = topk["goodput_gbps"] / none["goodput_gbps"]
    row(f"topk:ratio=0.01 (ef {topk['error_feedback']}) goodput / none", ratio, 2.0,
        f"{topk['goodput_gbps']:.3f} / {none['goodput_gbps']:.3f} = {ratio:.2f}")
for p in pslite:
    ratio = none["goodput_gbps"] / p["goodput_gbps"]
    row(f"none goodput / ps-lite ({p['workers']} x {p['servers']}, {p['mb']:g} MiB, "
        f"{p['partition_kb']} KiB partitions, median of {p.get('peer_reps', 1)})", ratio, 1.3,
        f"{none['goodput_gbps']:.3f} / {p['goodput_gbps']:.3f} = {ratio:.2f}")
for name, need in (("none", 0.8), ("onebit", 0.95)):
    if name in curve:
        c, n = curve[name], by_spec[name]
        ratio = c["goodput_gbps"] / n["goodput_gbps"]
        row(f"{c['compressor']}: goodput under curve / under none", ratio, need,
            f"{c['goodput_gbps']:.3f} / {n['goodput_gbps']:.3f} = {ratio:.2f}")
if not curve:
    print("| (info) security targets | no curve records (--security none,curve) | — | "
          "not checked |")
for r in records:
    headroom = r["rss_target_mb"] / r["server_peak_rss_mb"]
    row(f"{r['compressor']}{' (curve)' if r.get('security') == 'curve' else ''}: server RSS within 4 x owned + 64 MB", headroom, 1.0,
        f"{r['server_peak_rss_mb']:.0f} MB of {r['rss_target_mb']:.0f} MB "
        f"({r['server_owned_mb']:.0f} MB owned)")
print("\nall targets met" if ok else "\nSOME TARGETS MISSED")
sys.exit(0 if ok else 1)
