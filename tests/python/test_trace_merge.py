"""`bitpush trace merge` / `bitpush trace plot` and bitpush.trace.load / causal_violations
(python/bitpush/trace.py, docs/observability.md) on span files written by hand.

No cluster: a job of two workers and two servers is made up in scheduler time and written as
each process would see it on its own clock, with clock exchanges of known one-way delays:

    file                    node      clock vs the scheduler's   best exchange (up, down)
    daemon-101-0.jsonl      worker 0  +1 ms                      150 µs, 150 µs
    daemon-101-1.jsonl      worker 0  +1 ms (pid 101 again)      none: takes daemon-101-0's
    worker-100-0.jsonl      worker 0  +1 ms                      100 µs, 100 µs
    worker-200-0.jsonl      worker 1  -3 s                       50 µs, 50 µs (and a 2 ms one)
    server-300-0.jsonl      server 0  0                          20 µs, 20 µs
    server-400-0.jsonl      server 1  +5 s                       60 µs, 40 µs (and 2 ms, 1 ms)

so every file aligns exactly onto scheduler time except server 1, whose asymmetric best
exchange leaves it 10 µs late (offset -5 s + 10 µs, residual 50 µs).
"""
import json
import os

import pytest

import bitpush.launch
import bitpush.trace as bt

T = 10 ** 13  # the job's first span, scheduler clock (ns)
MS = 1000000
US = 1000
SKEW = {"daemon": MS, "worker0": MS, "worker1": -3000 * MS, "server0": 0,
        "server1": 5000 * MS}
TENSORS = [("fc.weight", [10, 11]), ("fc.bias", [12])]
KEYS = [10, 11, 12]
SERVER_OF = {10: 0, 11: 1, 12: 0}
ROUNDS = (1, 2)


def _clock(skew, s0, up, down, gap=1000):
    t0, t1 = s0 + skew, s0 + up
    t2 = t1 + gap
    return {"type": "clock", "t0": t0, "t1": t1, "t2": t2, "t3": t2 + down + skew}


def _span(name, ts, dur, tid, skew, **kw):
    rec = {"type": "span", "name": name, "ts": ts + skew, "dur": dur, "tid": tid}
    rec.update(kw)
    return rec


def job():
    """{file name: [records]} of the made-up job (scheduler-time plan in the module doc)."""
    files = {}
    w_recs = {w: [] for w in (0, 1)}
    s_recs = {s: [] for s in (0, 1)}
    d_recs = []
    for w in (0, 1):
        sk = SKEW["worker%d" % w]
        for i, (name, keys) in enumerate(TENSORS):
            w_recs[w].append({"type": "tensor", "name": name, "keys": keys})
            w_recs[w].append(_span("declare", T + w * 5 * US + i * US, US, 0, sk, key=keys[0],
                                   bytes=0))
    for r in ROUNDS:
        S = T + r * 10 * MS
        reply_at = {}
        for i, key in enumerate(KEYS):
            srv = SERVER_OF[key]
            ssk = SKEW["server%d" % srv]
            sums = []
            for w in (0, 1):
                sk = SKEW["worker%d" % w]
                c0 = S + w * 7 * US + i * 50 * US
                p = c0 + 30 * US
                recv = p + 20 * US
                w_recs[w].append(_span("compress", c0, 30 * US, 1, sk, key=key, round=r,
                                       bytes=4000))
                w_recs[w].append(_span("push", p, 5 * US, 2, sk, key=key, round=r,
                                       bytes=1000 + i, server=srv))
                s_recs[srv].append(_span("push_received", recv, 0, 1, ssk, key=key, round=r,
                                         bytes=1000 + i, worker=w))
                s_recs[srv].append(_span("queued", recv, 3 * US, 2, ssk, key=key, round=r,
                                         bytes=1000 + i, worker=w))
                s_recs[srv].append(_span("sum", recv + 3 * US, 8 * US, 2, ssk, key=key,
                                         round=r, bytes=1000 + i, worker=w))
                sums.append(recv + 11 * US)
            agg = max(sums)
            s_recs[srv].append(_span("compress", agg, 10 * US, 2, ssk, key=key, round=r,
                                     bytes=4000))
            for w in (0, 1):
                sent = agg + 10 * US + w * US
                reply_at[(key, w)] = sent
                s_recs[srv].append(_span("reply_sent", sent, 0, 1, ssk, key=key, round=r,
                                         bytes=500, worker=w))
        for w in (0, 1):
            sk = SKEW["worker%d" % w]
            last = 0
            for i, key in enumerate(KEYS):
                p = S + w * 7 * US + i * 50 * US + 30 * US
                got = reply_at[(key, w)] + 25 * US
                w_recs[w].append(_span("network", p, got - p, 2, sk, key=key, round=r,
                                       bytes=1000 + i, server=SERVER_OF[key]))
                w_recs[w].append(_span("decompress", got, 6 * US, 1, sk, key=key, round=r,
                                       bytes=500))
                last = max(last, got + 6 * US)
            w_recs[w].append(_span("optimizer", last, 100 * US, 0, sk, key=0, round=r,
                                   bytes=0))
        d_recs.append(_span("local_reduce", S - 200 * US, 150 * US, 1, SKEW["daemon"],
                            key=10, round=r, bytes=4000))

    def proc(role, rank, node, process, pid):
        return {"type": "process", "role": role, "rank": rank, "node": node,
                "process": process, "pid": pid, "host": "h%s" % node[-1], "version": 1}

    def finish(recs):
        return recs + [{"type": "end", "spans": sum(x["type"] == "span" for x in recs),
                        "dropped": 0}]

    files["worker-100-0.jsonl"] = finish(
        [proc("worker", 0, "worker 0", "engine", 100),
         _clock(SKEW["worker0"], T - 900 * MS, 100 * US, 100 * US),
         {"type": "thread", "tid": 0, "name": "main"},
         {"type": "thread", "tid": 1, "name": "compress"},
         {"type": "thread", "tid": 2, "name": "io"}] + w_recs[0])
    files["worker-200-0.jsonl"] = finish(
        [_clock(SKEW["worker1"], T - 900 * MS, MS, MS),  # spans/clocks before the process
         proc("worker", 1, "worker 1", "engine", 200),
         _clock(SKEW["worker1"], T - 800 * MS, 50 * US, 50 * US),
         {"type": "thread", "tid": 0, "name": "main"},
         {"type": "thread", "tid": 1, "name": "compress"},
         {"type": "thread", "tid": 2, "name": "io"}] + w_recs[1])
    for srv, pid in ((0, 300), (1, 400)):
        sk = SKEW["server%d" % srv]
        clocks = ([_clock(sk, T - 900 * MS, 20 * US, 20 * US)] if srv == 0 else
                  [_clock(sk, T - 900 * MS, 1900 * US, 100 * US),
                   _clock(sk, T - 800 * MS, 60 * US, 40 * US),
                   _clock(sk, T - 700 * MS, 700 * US, 300 * US)])
        files["server-%d-0.jsonl" % pid] = finish(
            [proc("server", srv, "server %d" % srv, "server", pid)] + clocks +
            [{"type": "thread", "tid": 1, "name": "recv"},
             {"type": "thread", "tid": 2, "name": "engine"}] + s_recs[srv])
    files["daemon-101-0.jsonl"] = finish(
        [proc("daemon", 0, "worker 0", "daemon", 101),
         _clock(SKEW["daemon"], T - 900 * MS, 150 * US, 150 * US),
         {"type": "thread", "tid": 1, "name": "reduce"}] + d_recs)
    files["daemon-101-1.jsonl"] = finish(
        [proc("daemon", 0, "worker 0", "daemon", 101),
         {"type": "thread", "tid": 0, "name": "nccl"},
         _span("local_reduce", T + 15 * MS, 100 * US, 0, SKEW["daemon"], key=11, round=1,
               bytes=4000)])
    return files


def write(d, files):
    os.makedirs(d, exist_ok=True)
    for name, recs in files.items():
        with open(os.path.join(d, name), "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    return str(d)


def merge(capsys, d, out):
    assert bt.main(["merge", d, "-o", out]) == 0
    cap = capsys.readouterr()
    with open(out) as f:
        return json.load(f), cap


def rows(chrome):
    """{pid: name}, {(pid, tid): thread name} of the metadata events."""
    procs = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in chrome["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    return procs, threads


def find(chrome, name, pid=None, **args):
    """The one span `name` (of row pid, if given) whose args include `args`."""
    out = [e for e in chrome["traceEvents"] if e["ph"] == "X" and e["name"] == name
           and pid in (None, e["pid"]) and all(e["args"].get(k) == v for k, v in args.items())]
    assert len(out) == 1, (name, args, out)
    return out[0]


@pytest.fixture
def consistent(tmp_path):
    return write(tmp_path / "spans", job())


def test_clock_alignment(consistent):
    t = bt.load(consistent)
    by = {f.name: f for f in t.files}
    got = {n: (f.offset_ns, f.residual_ns, f.samples, f.clock_from) for n, f in by.items()}
    assert got == {
        "daemon-101-0.jsonl": (-MS, 150 * US, 1, None),
        "daemon-101-1.jsonl": (-MS, 150 * US, 0, "daemon-101-0.jsonl"),
        "worker-100-0.jsonl": (-MS, 100 * US, 1, None),
        "worker-200-0.jsonl": (3000 * MS, 50 * US, 2, None),
        "server-300-0.jsonl": (0, 20 * US, 1, None),
        "server-400-0.jsonl": (-5000 * MS + 10 * US, 50 * US, 3, None),
    }
    assert t.base_ns == T and t.max_residual_ns == 150 * US
    assert t.warnings == []
    assert [n.name for n in t.nodes] == ["worker 0", "worker 1", "server 0", "server 1"]
    assert bt.causal_violations(t) == []


def test_merge_output(consistent, tmp_path, capsys):
    out = str(tmp_path / "trace.json")
    chrome, cap = merge(capsys, consistent, out)
    assert cap.err == ""
    assert "wrote %s: 113 spans of 6 files, 4 nodes" % out in cap.out
    assert "±150.0 µs" in cap.out
    assert chrome["displayTimeUnit"] == "ms"
    procs, threads = rows(chrome)
    assert procs == {1: "worker 0", 2: "worker 1", 3: "server 0", 4: "server 1"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in chrome["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert sort == {1: 0, 2: 1, 3: 2, 4: 3}
    # Several processes on worker 0: the process part prefixes its rows (the file's name
    # when one process wrote two files); spans of one thread that overlap without nesting
    # get extra rows ("io [2]"), and nothing is put inside a network span (async: the pushes
    # stay in "io", the network spans overlap in "io [2]", "io [3]").
    by_pid = {}
    for (pid, tid) in sorted(threads):
        by_pid.setdefault(pid, []).append((tid, threads[(pid, tid)]))
    assert by_pid == {
        1: list(enumerate(["daemon-101-0: reduce", "daemon-101-1: nccl", "engine: main",
                           "engine: compress", "engine: io", "engine: io [2]",
                           "engine: io [3]"], 1)),
        2: list(enumerate(["main", "compress", "compress [2]", "io", "io [2]", "io [3]"], 1)),
        3: list(enumerate(["recv", "engine", "engine [2]"], 1)),
        4: list(enumerate(["recv", "engine", "engine [2]"], 1))}

    # Aligned times (µs from the first span, worker 0's declare at T): server 1 is 10 µs
    # late (its best exchange's asymmetry), everything else exact.
    w1_push = find(chrome, "push", pid=2, key=11, round=2)
    assert w1_push["ts"] == 20087.0 and w1_push["dur"] == 5.0
    assert w1_push["cat"] == "worker"
    assert w1_push["args"] == {"tensor": "fc.weight", "partition": 1, "key": 11,
                                  "round": 2, "bytes": 1001, "server": 1}
    recv = find(chrome, "push_received", key=11, round=2, worker=1)
    assert recv["pid"] == 4 and recv["ts"] == 20117.0 and recv["dur"] == 0
    assert recv["cat"] == "server"
    assert find(chrome, "push_received", key=12, round=1, worker=0)["ts"] == 10150.0
    decl = find(chrome, "declare", pid=1, key=10, tensor="fc.weight")
    assert decl["ts"] == 0.0 and decl["args"]["partition"] == 0
    assert find(chrome, "declare", pid=2, key=12)["args"] == {
        "tensor": "fc.bias", "partition": 0, "key": 12, "bytes": 0}  # no round
    opt = [e for e in chrome["traceEvents"] if e["ph"] == "X" and e["name"] == "optimizer"]
    assert len(opt) == 4 and all("tensor" not in e["args"] for e in opt)
    nccl = find(chrome, "local_reduce", key=11)
    assert nccl["ts"] == 15000.0 and threads[(nccl["pid"], nccl["tid"])] == \
        "daemon-101-1: nccl"
    xs = [e["ts"] for e in chrome["traceEvents"] if e["ph"] != "M"]
    assert xs == sorted(xs)

    # Flows: each push -> its push_received, each reply_sent -> the end of its network span.
    flows = {}
    for e in chrome["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert len(flows) == 24
    assert all(set(f) == {"s", "f"} and f["f"]["bp"] == "e" and f["s"]["name"] == f["f"]["name"]
               for f in flows.values())
    # Each flow event binds to the slice its viewer takes: the one that began last on its
    # row at or before its time (Perfetto: the top of the row's stack), which must be its own
    # and still open.
    slices = {}
    for e in chrome["traceEvents"]:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append(e)
    for f in flows.values():
        for ph, want in (("s", {"push": "push", "reply": "reply_sent"}),
                         ("f", {"push": "push_received", "reply": "network"})):
            ev = f[ph]
            top = [x for x in slices[(ev["pid"], ev["tid"])] if x["ts"] <= ev["ts"]][-1]
            assert top["name"] == want[ev["name"]], (ph, ev, top)
            assert top["ts"] + top["dur"] >= ev["ts"]
    by_dst = {(f["f"]["pid"], f["f"]["ts"]): f for f in flows.values()}
    f = by_dst[(4, 20117.0)]  # worker 1's push of key 11 round 2 -> server 1
    assert f["s"]["name"] == "push" and f["s"]["pid"] == 2 and f["s"]["tid"] == w1_push["tid"]
    assert f["s"]["ts"] == 20089.5  # inside the push slice
    net = find(chrome, "network", pid=2, key=11, round=2)
    reply = find(chrome, "reply_sent", key=11, round=2, worker=1)
    r = [f for f in flows.values() if f["s"]["name"] == "reply" and f["s"]["ts"] == reply["ts"]
         and f["s"]["pid"] == 4]
    assert len(r) == 1 and r[0]["f"]["pid"] == 2 and r[0]["f"]["tid"] == net["tid"]
    assert r[0]["f"]["ts"] == pytest.approx(net["ts"] + net["dur"] - 0.001)

    meta = chrome["otherData"]
    assert meta["base_ns"] == T and meta["max_residual_ns"] == 150 * US
    assert meta["spans"] == 113 and meta["dropped"] == 0 and meta["unaligned_files"] == []
    s1 = [f for f in meta["files"] if f["file"] == "server-400-0.jsonl"][0]
    assert (s1["offset_ns"], s1["residual_ns"], s1["samples"], s1["partial"], s1["node"]) == \
        (-5000 * MS + 10 * US, 50 * US, 3, False, "server 1")
    assert meta["nodes"]["worker 0"]["residual_ns"] == 150 * US
    assert meta["nodes"]["worker 0"]["files"] == [
        "daemon-101-0.jsonl", "daemon-101-1.jsonl", "worker-100-0.jsonl"]


def _lines(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read().split(b"\n")


def test_partial_files(tmp_path, capsys):
    d = write(tmp_path / "spans", job())
    # worker 1 crashed mid-write: no end record, its last line cut in half, and a line of
    # garbage (what a crash can leave) in the middle.
    w_lines = _lines(d, "worker-200-0.jsonl")[:-2]  # [..., last span, end, ""] -> no end
    assert len(w_lines) == 36 and b'"push"' in w_lines[11] and b'"span"' in w_lines[35]
    w_lines[11] = b"\x00\x00\x00garbage"  # its first push
    cut = b"\n".join(w_lines[:-1]) + b"\n" + w_lines[-1][:len(w_lines[-1]) // 2]
    with open(os.path.join(d, "worker-200-0.jsonl"), "wb") as f:
        f.write(cut)
    # server 1 was killed between two lines: complete lines, no end record.
    lines = _lines(d, "server-400-0.jsonl")
    with open(os.path.join(d, "server-400-0.jsonl"), "wb") as f:
        f.write(b"\n".join(lines[:-2] + [b""]))
    # A process that died before it knew its rank or heard from the scheduler.
    write(d, {"worker-999-0.jsonl": [{"type": "thread", "tid": 0, "name": "main"},
                                     _span("compress", T + 5 * MS, 10 * US, 0, 0, key=10,
                                           round=1, bytes=4000)]})
    out = str(tmp_path / "trace.json")
    chrome, cap = merge(capsys, d, out)
    warnings = [x[len("bitpush trace: warning: "):] for x in cap.err.splitlines()]
    w1, s1, lost = ("worker-200-0.jsonl (worker 1)", "server-400-0.jsonl (server 1)",
                    "worker-999-0.jsonl (worker pid 999)")
    assert warnings == [  # in row order
        w1 + ": line 12 does not decode (Expecting value: line 1 column 1 (char 0)): skipped",
        w1 + ": line 36 is cut short (the process stopped mid-write): skipped",
        w1 + ": ended without its end record (the process crashed or was killed): merged "
        "26 spans as far as it goes",  # of its 28
        "worker-999-0.jsonl: no process record (the process ended before it knew its rank): "
        "shown as its own row",
        lost + ": ended without its end record (the process crashed or was killed): merged "
        "1 spans as far as it goes",
        lost + ": no clock exchange with the scheduler (it never heard from the scheduler): "
        "its times are its own clock's, residual unknown",
        s1 + ": ended without its end record (the process crashed or was killed): merged "
        "18 spans as far as it goes"]
    procs, threads = rows(chrome)
    assert procs == {1: "worker 0", 2: "worker 1", 3: "worker pid 999", 4: "server 0",
                     5: "server 1"}
    meta = chrome["otherData"]
    assert meta["spans"] == 113 - 2 + 1
    assert meta["warnings"] == warnings
    files = {f["file"]: f for f in meta["files"]}
    assert sorted(n for n in files if files[n]["partial"]) == [
        "server-400-0.jsonl", "worker-200-0.jsonl", "worker-999-0.jsonl"]
    assert files["worker-999-0.jsonl"]["residual_ns"] == "unknown"
    assert files["worker-999-0.jsonl"]["offset_ns"] == 0
    assert meta["unaligned_files"] == ["worker-999-0.jsonl"]
    assert meta["max_residual_ns"] == 150 * US  # over the files whose residual is known
    assert meta["nodes"]["worker pid 999"]["residual_ns"] == "unknown"
    assert find(chrome, "compress", pid=3)["ts"] == 5000.0  # its own clock, unaligned
    # The garbage cost worker 1 its first push: the check says so, and that the file is
    # partial.
    assert bt.causal_violations(bt.load(d)) == [
        "server 0 push_received key 10 (fc.weight partition 0) round 1 from worker 1 at "
        "10.057 ms: worker 1 has no such push [worker-200-0.jsonl (worker 1) is partial: the "
        "match may be among what is missing]"]


def test_dropped_spans(tmp_path, capsys):
    files = job()
    recs = files["worker-100-0.jsonl"]
    recs.insert(20, {"type": "dropped", "count": 3})
    recs.insert(40, {"type": "dropped", "count": 7})
    recs[-1]["dropped"] = 7
    d = write(tmp_path / "spans", files)
    chrome, cap = merge(capsys, d, str(tmp_path / "trace.json"))
    assert cap.err == ("bitpush trace: warning: worker-100-0.jsonl (worker 0): 7 spans dropped "
                       "(the trace ring was full: raise trace.buffer_spans); the trace lacks "
                       "them\n")
    meta = chrome["otherData"]
    assert meta["dropped"] == 7 and meta["nodes"]["worker 0"]["dropped"] == 7
    assert {f["file"]: f["dropped"] for f in meta["files"]}["worker-100-0.jsonl"] == 7
    assert not any(f["partial"] for f in meta["files"])


def _move(recs, name, skew, delta, **args):
    hit = [r for r in recs if r["type"] == "span" and r["name"] == name
           and all(r.get(k) == v for k, v in args.items())]
    assert len(hit) == 1
    hit[0]["ts"] += delta
    return hit[0]


def test_causal_violations(tmp_path):
    files = job()
    s0, s1 = files["server-300-0.jsonl"], files["server-400-0.jsonl"]
    # Server 1 "receives" worker 1's push of key 11 in round 1 a ms before it was pushed...
    _move(s1, "push_received", SKEW["server1"], -MS, key=11, round=1, worker=1)
    # ... and "sends" its reply to worker 0 for key 11 in round 2 2 ms after worker 0 got it;
    _move(s1, "reply_sent", SKEW["server1"], 2 * MS, key=11, round=2, worker=0)
    # server 0 never logs the arrival of worker 0's push of key 12 in round 1.
    s0.remove([r for r in s0 if r["type"] == "span" and r["name"] == "push_received" and
               r["key"] == 12 and r["round"] == 1 and r["worker"] == 0][0])
    s0[-1]["spans"] -= 1
    v = bt.causal_violations(write(tmp_path / "spans", files))
    assert v == [
        "worker 1 push key 11 (fc.weight partition 1) round 1 at 10.087 ms: server 1 received "
        "it at 9.117 ms, 970.0 µs before it was pushed (tolerance 100.0 µs)",
        "worker 0 push key 12 (fc.bias partition 0) round 1 to server 0 at 10.130 ms: 0 "
        "push_received on server 0, expected 1",
        "worker 0 key 11 (fc.weight partition 1) round 2: the reply arrived (network ends) at "
        "20.153 ms, 1.985 ms before server 1 sent it at 22.138 ms (tolerance 150.0 µs)"]
    # A slack wider than the errors hides the timing ones, not the missing arrival.
    assert len(bt.causal_violations(bt.load(str(tmp_path / "spans")), slack_ns=3 * MS)) == 1


def test_plot(consistent, tmp_path, capsys):
    out = str(tmp_path / "trace.json")
    merge(capsys, consistent, out)
    png = str(tmp_path / "step.png")
    assert bt.main(["plot", out, "-o", png]) == 0
    said = capsys.readouterr().out
    assert said.startswith("bitpush trace plot: drew round 2 (the last round in every "
                           "worker's spans): 54 spans on 18 rows of 4 nodes -> " + png)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    png1 = str(tmp_path / "bias.png")
    assert bt.main(["plot", out, "-o", png1, "--round", "1", "--tensor", "fc.bias"]) == 0
    assert "drew round 1 (asked for), tensor fc.bias: 17 spans on 10 rows of 3 nodes" in \
        capsys.readouterr().out
    assert os.path.getsize(png1) > 1000
    # A round without spans, a tensor that is not there, a file that is not a trace: exit 2
    # with one line, no picture.
    assert bt.main(["plot", out, "-o", str(tmp_path / "x.png"), "--round", "7"]) == 2
    assert capsys.readouterr().err == (
        "bitpush trace plot: %s: round 7 has no spans (rounds present: 1-2)\n" % out)
    assert bt.main(["plot", out, "--tensor", "nope", "-o", str(tmp_path / "x.png")]) == 2
    assert "no spans of tensor 'nope' (its tensors: fc.bias, fc.weight)" in \
        capsys.readouterr().err
    bad = str(tmp_path / "bad.json")
    with open(bad, "w") as f:
        f.write('{"hello": 1}')
    assert bt.main(["plot", bad]) == 2
    assert "bad.json is not a trace: no traceEvents" in capsys.readouterr().err
    with open(bad, "w") as f:
        f.write('{"traceEve')
    assert bt.main(["plot", bad]) == 2
    assert "bad.json is not a trace: not JSON" in capsys.readouterr().err
    assert not os.path.exists(str(tmp_path / "x.png"))


def test_errors_and_dispatch(tmp_path, capsys):
    missing = str(tmp_path / "nothing")
    assert bt.main(["merge", missing]) == 2
    assert capsys.readouterr().err == (
        "bitpush trace merge: %s: no such directory (the --timeline DIR of a run)\n" % missing)
    os.makedirs(missing)
    with open(os.path.join(missing, "notes.txt"), "w") as f:
        f.write("x")
    assert bitpush.launch.main(["trace", "merge", missing]) == 2
    assert "%s: no span files (*.jsonl) in it" % missing in capsys.readouterr().err
    # Through `bitpush trace`, with the default output DIR/trace.json.
    d = write(tmp_path / "spans", job())
    assert bitpush.launch.main(["trace", "merge", d]) == 0
    assert os.path.exists(os.path.join(d, "trace.json"))
    assert bitpush.launch.main(["trace", "merge", d]) == 0  # its own output is no span file


# -- clock drift -------------------------------------------------------------------------------
#
# A worker whose clock runs `ppm` fast (local = L0 + (s - T) (10^6 + ppm) / 10^6, exact on a
# 10 µs grid of scheduler time s) and a server whose clock is 2 s ahead and does not drift,
# each with a heartbeat exchange every second for two minutes (up = down: every exchange's
# offset is exact) and a push of key 1 at 1 s, 60 s and 119 s: push_received 20 µs later,
# reply_sent 100 µs later, the reply back at 130 µs.

L0 = 7 * 10 ** 12
SEC = 1000 * MS
PUSHES = (1 * SEC, 60 * SEC, 119 * SEC)


def _local(ppm):
    def local(s):
        num = (s - T) * (10 ** 6 + ppm)
        assert num % 10 ** 6 == 0, s  # on the grid: every time exact
        return L0 + num // 10 ** 6
    return local


def _exchange(local, s0, up, down, gap=10 * US):
    t1 = s0 + up
    t2 = t1 + gap
    return {"type": "clock", "t0": local(s0), "t1": t1, "t2": t2, "t3": local(t2 + down)}


def _at(local, name, s, d, **kw):
    rec = {"type": "span", "name": name, "ts": local(s), "dur": local(s + d) - local(s),
           "tid": 1}
    rec.update(kw)
    return rec


def drift_job(ppm=100, seconds=121, noisy=False):
    """{file name: [records]} of the drifting pair (above). noisy: every exchange has a slow
    twin half a second later (3 ms up, 40 µs down: its offset 1.5 ms off), and from 50 s to
    62 s only slow ones arrive (so some windows have no good exchange)."""
    w, srv = _local(ppm), (lambda s: s + 2 * SEC)
    w_recs = [{"type": "process", "role": "worker", "rank": 0, "node": "worker 0",
               "process": "engine", "pid": 600, "host": "ha", "version": 1}]
    s_recs = [{"type": "process", "role": "server", "rank": 0, "node": "server 0",
               "process": "server", "pid": 700, "host": "hb", "version": 1}]
    for k in range(seconds):
        s0 = T + k * SEC
        if not (noisy and 50 <= k < 62):
            w_recs.append(_exchange(w, s0, 40 * US, 40 * US))
        if noisy:
            w_recs.append(_exchange(w, s0 + SEC // 2, 3 * MS, 40 * US))
        s_recs.append(_exchange(srv, s0, 20 * US, 20 * US))
    for r, p in enumerate(PUSHES, 1):
        w_recs.append(_at(w, "push", T + p, 50 * US, key=1, round=r, server=0))
        w_recs.append(_at(w, "network", T + p, 130 * US, key=1, round=r, server=0))
        s_recs.append(_at(srv, "push_received", T + p + 20 * US, 0, key=1, round=r, worker=0))
        s_recs.append(_at(srv, "reply_sent", T + p + 100 * US, 0, key=1, round=r, worker=0))
    end = {"type": "end", "dropped": 0}
    return {"worker-600-0.jsonl": w_recs + [dict(end, spans=6)],
            "server-700-0.jsonl": s_recs + [dict(end, spans=6)]}


def _theta(ppm, t):
    """The worker's true offset (scheduler - local, ns, a Fraction) at local time t."""
    from fractions import Fraction
    return T + Fraction((t - L0) * 10 ** 6, 10 ** 6 + ppm) - t


def _span_times(t):
    return {(s.file.role, s.name, s.round): (s.at, s.at_dur) for s in t.spans}


def _exact(t):
    """Every span where the made-up job put it, on the scheduler's clock."""
    want = {}
    for r, p in enumerate(PUSHES, 1):
        want.update({("worker", "push", r): (T + p, 50 * US),
                     ("worker", "network", r): (T + p, 130 * US),
                     ("server", "push_received", r): (T + p + 20 * US, 0),
                     ("server", "reply_sent", r): (T + p + 100 * US, 0)})
    return _span_times(t) == want


def test_drift_model(tmp_path, capsys):
    d = write(tmp_path / "spans", drift_job())
    t = bt.load(d)
    w, s = t.files[0], t.files[1]
    # Every exchange of the worker is exact (up = down), so the line is the clock's: 100 ppm
    # fast, every span exactly where it was (durations shrunk back from local time), and the
    # residual half the exchanges' round trip: 40 µs up + 10 µs + 40 µs down on a clock
    # 100 ppm fast, less the scheduler's 10 µs.
    assert (w.clock.kind, w.drift_ppm, w.residual_ns, w.clock.fit_samples) == \
        ("linear", 100.0, 40004.5, 32)
    assert abs(w.offset_ns - _theta(100, w.clock.t_ref)) <= 0.5
    assert (s.clock.kind, s.drift_ppm, s.residual_ns, s.offset_ns) == \
        ("linear", 0.0, 20 * US, -2 * SEC)
    assert _exact(t)
    assert bt.causal_violations(t) == []
    assert t.warnings == []

    chrome, cap = merge(capsys, d, str(tmp_path / "trace.json"))
    assert cap.err == ""
    assert "within ±40.0 µs, drift modelled in 2 files (up to 100.0 ppm)" in cap.out
    meta = chrome["otherData"]
    assert meta["max_drift_ppm"] == 100.0 and meta["max_residual_ns"] == 40004.5
    files = {f["file"]: f for f in meta["files"]}
    got = {k: files["worker-600-0.jsonl"][k] for k in (
        "clock_model", "drift_ppm", "residual_ns", "samples", "fit_samples", "clock_ref_ns",
        "offset_ns", "clock_from")}
    assert got == {"clock_model": "linear", "drift_ppm": 100.0, "residual_ns": 40004.5,
                   "samples": 121, "fit_samples": 32, "clock_ref_ns": w.clock.t_ref,
                   "offset_ns": w.offset_ns, "clock_from": None}
    far = find(chrome, "push", round=3)
    assert far["ts"] == 118 * 10 ** 6 and far["dur"] == 50.0  # µs from the first push


def test_drift_constant_model_is_off_at_the_far_end(tmp_path, monkeypatch):
    """What one offset per file does with the same files: right at the exchange it comes
    from (the first), two minutes later off by the 100 ppm (12 ms), far beyond its residual:
    a push received before it was pushed."""
    d = write(tmp_path / "spans", drift_job())
    monkeypatch.setattr(bt._trace_clock, "MIN_SPAN_NS", 10 ** 15)
    t = bt.load(d)
    w = t.files[0]
    assert (w.clock.kind, w.drift_ppm, w.residual_ns) == ("constant", 0, 40004.5)
    push = {s.round: s for s in t.spans if s.name == "push"}
    assert push[1].at - (T + 1 * SEC) == 99995.5  # 1 s after its exchange: 100 µs late
    off = push[3].at - (T + 119 * SEC)
    assert 11.8 * MS < off < 11.9 * MS and off > w.residual_ns + t.files[1].residual_ns
    assert bt.causal_violations(t) == [
        "worker 0 push key 1 round 1 at 0.080 ms: server 0 received it at 0.000 ms, 80.0 µs "
        "before it was pushed (tolerance 60.0 µs)",
        "worker 0 push key 1 round 2 at 59005.980 ms: server 0 received it at 59000.000 ms, "
        "5.980 ms before it was pushed (tolerance 60.0 µs)",
        "worker 0 push key 1 round 3 at 118011.880 ms: server 0 received it at 118000.000 ms, "
        "11.880 ms before it was pushed (tolerance 60.0 µs)"]


def test_drift_noisy_exchanges(tmp_path):
    """Slow exchanges (their offsets 1.5 ms off) lose to the window's best; a window with
    none but slow ones is left out of the fit: the line and residual stay exact."""
    t = bt.load(write(tmp_path / "spans", drift_job(noisy=True)))
    w = t.files[0]
    assert w.samples == 121 - 12 + 121
    assert (w.clock.kind, w.drift_ppm, w.residual_ns) == ("linear", 100.0, 40004.5)
    assert w.clock.fit_samples < 32
    assert _exact(t) and bt.causal_violations(t) == []


def test_drift_too_steep_falls_back(tmp_path, capsys):
    """A clock 1000 ppm fast is no steady clock: warned about, one constant offset (today's:
    the best exchange, the first of equals)."""
    files = drift_job(ppm=1000)
    d = write(tmp_path / "spans", files)
    t = bt.load(d)
    w = t.files[0]
    first = files["worker-600-0.jsonl"][1]
    offset2 = (first["t1"] - first["t0"]) + (first["t2"] - first["t3"])
    rtt = (first["t3"] - first["t0"]) - (first["t2"] - first["t1"])
    assert rtt == 80090
    assert (w.clock.kind, w.offset2, w.residual_ns, w.drift_ppm) == \
        ("constant", offset2, rtt // 2, 0)
    warning = ("worker-600-0.jsonl (worker 0): its exchanges put its clock's drift at "
               "+1000.0 ppm against the scheduler's, beyond ±500 ppm (no steady clock drifts "
               "that much): aligned with one constant offset instead")
    assert t.warnings == [warning]
    chrome, cap = merge(capsys, d, str(tmp_path / "trace.json"))
    assert cap.err == "bitpush trace: warning: " + warning + "\n"
    meta = chrome["otherData"]
    f = [f for f in meta["files"] if f["file"] == "worker-600-0.jsonl"][0]
    assert (f["clock_model"], f["drift_ppm"], f["fit_samples"], f["clock_ref_ns"]) == \
        ("constant", 0, 1, None)
    assert meta["max_drift_ppm"] == 0.0  # the server's: its line is flat


def test_drift_few_samples_is_constant(tmp_path):
    """Exchanges over less than MIN_SPAN_NS, or one: today's constant offset, exactly."""
    t = bt.load(write(tmp_path / "short", drift_job(seconds=4)))
    w = t.files[0]
    best = bt._trace_clock.best_exchange(w.clocks)
    assert best[1] == 80009
    assert (w.clock.kind, w.offset2, w.residual_ns, w.drift_ppm) == \
        ("constant", best[0], 40004.5, 0)
    assert all(s.at == s.ts + bt._half(best[0]) and s.at_dur == s.dur for s in w.spans)
    t = bt.load(write(tmp_path / "one", drift_job(seconds=1)))
    assert all(f.clock.kind == "constant" and f.clock.fit_samples == 1 for f in t.files)
    # The made-up job above: every file constant, its metadata says so.
    t = bt.load(write(tmp_path / "job", job()))
    meta = t.metadata()
    assert {f["clock_model"] for f in meta["files"]} == {"constant"}
    assert {f["drift_ppm"] for f in meta["files"]} == {0} and meta["max_drift_ppm"] == 0


def test_drift_clock_from(tmp_path):
    """A second file of the drifting process, without clock records, takes its sibling's
    line."""
    files = drift_job()
    w = _local(100)
    files["worker-600-1.jsonl"] = [
        {"type": "process", "role": "worker", "rank": 0, "node": "worker 0",
         "process": "engine", "pid": 600, "host": "ha", "version": 1},
        _at(w, "compress", T + 100 * SEC, 30 * US, key=1, round=9),
        {"type": "end", "spans": 1, "dropped": 0}]
    t = bt.load(write(tmp_path / "spans", files))
    f = [f for f in t.files if f.name == "worker-600-1.jsonl"][0]
    assert (f.clock_from, f.clock.kind, f.drift_ppm, f.residual_ns, f.samples) == \
        ("worker-600-0.jsonl", "linear", 100.0, 40004.5, 0)
    assert (f.spans[0].at, f.spans[0].at_dur) == (T + 100 * SEC, 30 * US)


def test_drift_model_float_times():
    """Times that are not whole ns (the format allows numbers) land on the same line."""
    import bitpush._trace_clock as tc
    m = tc.fit([(_local(100)(T + k * SEC), T + k * SEC + 40 * US, T + k * SEC + 50 * US,
                 _local(100)(T + k * SEC + 90 * US)) for k in range(0, 20)])[0]
    assert m.kind == "linear"
    ts = _local(100)(T + 7 * SEC)
    assert m.at(ts) == T + 7 * SEC
    assert m.at(ts + 0.5) == pytest.approx(T + 7 * SEC + 0.5 / 1.0001, abs=1e-3)


def _picture(path):
    """Draws round 2 of the made-up job (docs/images/trace-step.png):
    /usr/bin/python3 tests/python/test_trace_merge.py docs/images/trace-step.png"""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        d = write(os.path.join(tmp, "spans"), job())
        bt.main(["merge", d, "-o", os.path.join(tmp, "trace.json")])
        return bt.main(["plot", os.path.join(tmp, "trace.json"), "-o", path])


if __name__ == "__main__":
    import sys
    sys.exit(_picture(sys.argv[1]))
