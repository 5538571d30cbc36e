"""`bitpush top` (python/bitpush/top.py): the Prometheus text parser and the rate math on fixed
inputs, the bounded scrape against sockets that misbehave, the command's errors, and the real
thing — a 2-server, 2-worker onebit cluster with metrics on, viewed with `--once` and inside a
tmux session (curses), where a killed server shows as down and `q` gives the shell back.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from bitpush import _prom, _top_rows, top
from bitpush._metrics_targets import Target
from bitpush._scrape import Result, Scraper
from bitpush.testing import LocalCluster, free_ports

PY = "/usr/bin/python3"


# -- the parser ------------------------------------------------------------------------------

EXPOSITION = r'''# HELP bitpush_worker_push_pulls_total push_pull operations
# TYPE bitpush_worker_push_pulls_total counter
bitpush_worker_push_pulls_total{result="completed"} 100
bitpush_worker_push_pulls_total{result="failed"} 2

# a comment of our own
odd_labels{path="C:\\dir \"x\"\nnext",le="+Inf",} 1.5e3 1700000000000
  spaced { a = "1" , b="2" }   -0.25
not_a_number NaN
up_inf +Inf
down_inf -Inf
bare 17
summary_seconds_sum 2.5
summary_seconds_count 4
'''


def test_parse_exposition_exact_values():
    s = _prom.parse(EXPOSITION)
    assert s.names() == ["bitpush_worker_push_pulls_total", "odd_labels", "spaced",
                         "not_a_number", "up_inf", "down_inf", "bare", "summary_seconds_sum",
                         "summary_seconds_count"]
    assert s.samples("bitpush_worker_push_pulls_total") == [
        ({"result": "completed"}, 100.0), ({"result": "failed"}, 2.0)]
    assert s.total("bitpush_worker_push_pulls_total") == 102.0
    assert s.total("bitpush_worker_push_pulls_total", result="failed") == 2.0
    assert s.total("bitpush_worker_push_pulls_total", result="other") is None
    assert s.total("absent") is None
    assert s.samples("odd_labels") == [({"path": 'C:\\dir "x"\nnext', "le": "+Inf"}, 1500.0)]
    assert s.samples("spaced") == [({"a": "1", "b": "2"}, -0.25)]
    nan = s.samples("not_a_number")[0][1]
    assert nan != nan and s.total("not_a_number") is None  # NaN kept, but not summed
    assert s.total("up_inf") == float("inf") and s.total("down_inf") == float("-inf")
    assert s.total("bare") == 17.0
    assert s.total("summary_seconds_sum") == 2.5 and s.total("summary_seconds_count") == 4.0
    assert s.label_values("bitpush_worker_push_pulls_total", "result") == ["completed", "failed"]


@pytest.mark.parametrize("line, why", [
    ("m{a=\"1\"", "unterminated|expected"),
    ("m{a=1} 2", "expected '\"'"),
    ("m{a=\"1\" b=\"2\"} 3", "expected ','"),
    ("m", "expected a value"),
    ("m 1 2 3", "expected a value"),
    ("m{a=\"1\"}2", "expected a value"),
    ("m one", "bad value"),
    ("m 1 soon", "bad value"),
    ("9m 1", "metric name"),
])
def test_parse_refuses_malformed_lines_naming_them(line, why):
    with pytest.raises(ValueError, match=r"^line 2: .*(%s)" % why):
        _prom.parse("ok 1\n" + line + "\n")


# -- the rate math ---------------------------------------------------------------------------

W = Target("worker", 0, "127.0.0.1", 1)
S = Target("server", 1, "127.0.0.1", 2)

WORKER_A = '''bitpush_node_info{role="worker",rank="0"} 1
bitpush_worker_push_pulls_total{result="completed"} 100
bitpush_worker_push_pulls_total{result="failed"} 1
bitpush_worker_payload_bytes_total{direction="push",encoding="compressed"} 32
bitpush_worker_payload_bytes_total{direction="push",encoding="raw"} 1000
bitpush_worker_payload_bytes_total{direction="pull",encoding="compressed"} 32
bitpush_worker_payload_bytes_total{direction="pull",encoding="raw"} 1000
bitpush_worker_stage_seconds_total{stage="compress"} 1.0
bitpush_worker_stage_seconds_total{stage="network"} 2.0
bitpush_worker_stage_seconds_total{stage="decompress"} 0.125
bitpush_worker_partitions_queued 0
bitpush_endpoint_messages_refused_total{reason="sender_role"} 1
bitpush_endpoint_messages_refused_total{reason="malformed_header"} 2
process_resident_memory_bytes 1048576
process_cpu_seconds_total 3.0
'''
WORKER_B = '''bitpush_node_info{role="worker",rank="0"} 1
bitpush_worker_push_pulls_total{result="completed"} 180
bitpush_worker_push_pulls_total{result="failed"} 1
bitpush_worker_payload_bytes_total{direction="push",encoding="compressed"} 96
bitpush_worker_payload_bytes_total{direction="push",encoding="raw"} 3048
bitpush_worker_payload_bytes_total{direction="pull",encoding="compressed"} 96
bitpush_worker_payload_bytes_total{direction="pull",encoding="raw"} 3048
bitpush_worker_stage_seconds_total{stage="compress"} 1.5
bitpush_worker_stage_seconds_total{stage="network"} 3.5
bitpush_worker_stage_seconds_total{stage="decompress"} 0.375
bitpush_worker_partitions_queued 4
bitpush_endpoint_messages_refused_total{reason="sender_role"} 3
bitpush_endpoint_messages_refused_total{reason="malformed_header"} 4
process_resident_memory_bytes 2097152
process_cpu_seconds_total 3.5
'''
SERVER_A = '''bitpush_node_info{role="server",rank="1"} 1
bitpush_server_rounds_published_total 10
bitpush_server_payload_bytes_total{direction="in",encoding="compressed"} 0
bitpush_server_payload_bytes_total{direction="in",encoding="raw"} 0
bitpush_server_engine_busy_seconds_total 1.0
bitpush_server_engine_queue_depth{thread="0"} 0
bitpush_server_engine_queue_depth{thread="1"} 0
process_cpu_seconds_total 1.0
'''
SERVER_B = '''bitpush_node_info{role="server",rank="1"} 1
bitpush_server_rounds_published_total 30
bitpush_server_payload_bytes_total{direction="in",encoding="compressed"} 512
bitpush_server_payload_bytes_total{direction="in",encoding="raw"} 8192
bitpush_server_engine_busy_seconds_total 2.0
bitpush_server_engine_queue_depth{thread="0"} 1
bitpush_server_engine_queue_depth{thread="1"} 2
process_cpu_seconds_total 1.25
'''


def _result(target, t, text):
    return Result(target, t, _prom.parse(text), "")


def test_rates_of_two_scrapes_exact():
    prev, cur = _result(W, 10.0, WORKER_A), _result(W, 12.0, WORKER_B)
    row = _top_rows.node_row(prev, cur)
    assert row == _top_rows.Row(
        label="worker 0", role="worker", up=True, error="", rounds_s=40.0, goodput_bs=2048.0,
        wire_bs=64.0, ratio=32.0, slowest="network 67%", queue=4.0, refused_s=2.0,
        rss=2097152.0, cpu_pct=25.0)
    srow = _top_rows.node_row(_result(S, 0.5, SERVER_A), _result(S, 2.5, SERVER_B))
    assert (srow.rounds_s, srow.goodput_bs, srow.wire_bs, srow.ratio, srow.slowest,
            srow.queue, srow.cpu_pct, srow.refused_s) == (10.0, 4096.0, 256.0, 16.0,
                                                          "engine 25%", 3.0, 12.5, None)
    first = _top_rows.node_row(None, cur)  # one scrape: gauges only
    assert (first.up, first.rounds_s, first.ratio, first.slowest, first.queue, first.rss) == \
        (True, None, None, "-", 4.0, 2097152.0)
    # A counter that went backwards is a restarted process: no rate, not a negative one.
    assert _top_rows.rate(cur, _result(W, 13.0, WORKER_A), "process_cpu_seconds_total") is None
    assert _top_rows.rate(prev, cur, "process_cpu_seconds_total") == 0.25
    assert _top_rows.rate(prev, Result(W, 12.0, None, "x"), "process_cpu_seconds_total") is None

    down = _top_rows.node_row(cur, Result(S, 13.0, None, "connection refused"))
    assert (down.up, down.error, down.label) == (False, "connection refused", "server 1")
    wrong = _top_rows.node_row(None, _result(W, 1.0, SERVER_A))
    assert (wrong.up, wrong.error) == (False, "port 1 answers as server 1")

    totals = _top_rows.cluster_totals([row, srow, down])
    assert (totals.nodes, totals.up, totals.rounds_s, totals.goodput_bs, totals.wire_bs,
            totals.ratio, totals.refused_s, totals.cpu_pct) == (3, 2, 40.0, 2048.0, 64.0, 32.0,
                                                                2.0, 37.5)
    lines = top.render([row, srow, down], totals, "c.yaml", 1.0)
    assert lines[1].startswith("nodes 2/3 up  rounds/s 40  goodput 2.0 KiB/s  wire 64 B/s  "
                               "ratio 32.0x  refused/s 2  RSS 2.0 MiB  CPU 38%"), lines[1]
    table = _table("\n".join(lines))
    assert table["worker 0"] == {"NODE": "worker 0", "STATE": "up", "ROUNDS/S": "40",
                                 "GOODPUT": "2.0 KiB/s", "WIRE": "64 B/s", "RATIO": "32.0x",
                                 "SLOWEST": "network 67%", "QUEUE": "4", "REFUSED/S": "2",
                                 "RSS": "2.0 MiB", "CPU%": "25"}
    assert table["server 1"]["STATE"] == "down (connection refused)"


# -- the bounded scrape ----------------------------------------------------------------------

def _serve(handler):
    """A loopback listener whose connections each go to handler(conn) on a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def run():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=run, daemon=True).start()
    return listener


def _http(body, status="200 OK", chunked=False):
    def handle(conn):
        with conn:
            conn.recv(4096)
            if chunked:
                data = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:5], body[5:]))
                conn.sendall(b"HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n"
                             % (status.encode(), data))
            else:
                conn.sendall(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s"
                             % (status.encode(), len(body), body))
            time.sleep(1)  # keeps the connection open: the reader stops at Content-Length
    return handle


def test_scrape_reports_each_endpoint_within_its_deadline():
    silent = _serve(lambda conn: time.sleep(5))   # accepts, never answers
    ok = _serve(_http(WORKER_A.encode()))
    chunked = _serve(_http(WORKER_A.encode(), chunked=True))
    missing = _serve(_http(b"no", status="404 Not Found"))
    garbage = _serve(_http(b"m{a=1} 2\n"))
    closed = free_ports(1)[0]
    targets = [Target("worker", 0, "127.0.0.1", s.getsockname()[1])
               for s in (silent, ok, chunked, missing, garbage)]
    targets.append(Target("worker", 0, "127.0.0.1", closed))
    with Scraper(targets, timeout_s=0.3) as scraper:
        started = time.monotonic()
        results = scraper.scrape()
        took = time.monotonic() - started
    assert took < 1.0, took
    assert [r.error for r in results] == [
        "timed out after 0.3 s", "", "", "HTTP 404 Not Found",
        "malformed metrics: line 1: expected '\"' to open the value of label 'a'",
        "connection refused"]
    assert results[1].scrape.total("process_cpu_seconds_total") == 3.0
    assert results[2].scrape.total("process_cpu_seconds_total") == 3.0
    for s in (silent, ok, chunked, missing, garbage):
        s.close()


# -- the command -----------------------------------------------------------------------------

def _bin_dir():
    d = os.environ.get("BITPUSH_BIN_DIR")
    if d:
        return d
    from bitpush import _build_info
    return _build_info.BIN_DIR


def _top_cmd():
    wrapper = os.path.join(_bin_dir(), "bitpush")
    base = [wrapper] if os.access(wrapper, os.X_OK) else [PY, "-m", "bitpush.launch"]
    return base + ["top"]


def _run_top(args, timeout=20):
    return subprocess.run(_top_cmd() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)


def test_errors_exit_2_naming_the_problem():
    d = tempfile.mkdtemp(prefix="bp-top-")
    try:
        off = os.path.join(d, "off.yaml")
        with open(off, "w") as f:
            f.write("cluster:\n  scheduler: 127.0.0.1:20001\n  servers: [127.0.0.1:20002]\n"
                    "  workers: [127.0.0.1:20003]\n")
        ports = free_ports(4)
        on = os.path.join(d, "on.yaml")
        with open(on, "w") as f:  # nothing runs there
            f.write("cluster:\n  scheduler: 127.0.0.1:%d\n  servers: [127.0.0.1:%d]\n"
                    "  workers: [127.0.0.1:%d]\nmetrics:\n  port: %d\n" % tuple(ports))
        bad = os.path.join(d, "bad.yaml")
        with open(bad, "w") as f:
            f.write("cluster:\n  scheduler: [unclosed\n")
        for args, want in [
                (["--config", off], "metrics are off (metrics.port is 0 or unset)"),
                (["--config", bad], "bad.yaml"),
                (["--config", os.path.join(d, "absent.yaml")], "absent.yaml: no such file"),
                (["--config", on, "--host", "10.1.2.3"],
                 "no node of %s is on host 10.1.2.3 (its hosts: 127.0.0.1)" % on),
                (["--config", off, "--interval", "0"], "must be more than 0")]:
            r = _run_top(args)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert r.stderr.startswith("bitpush top: ") and want in r.stderr, r.stderr
            assert "Traceback" not in r.stderr, r.stderr
        # Nothing answers: every row down, exit 1.
        r = _run_top(["--config", on, "--once", "--interval", "0.1"])
        assert r.returncode == 1, r.stdout + r.stderr
        assert [(n, c["STATE"]) for n, c in _table(r.stdout).items()] == [
            ("scheduler", "down (connection refused)"), ("server 0", "down (connection refused)"),
            ("worker 0", "down (connection refused)")], r.stdout
    finally:
        subprocess.run(["rm", "-rf", d])


# -- a real cluster --------------------------------------------------------------------------

TRAIN = r"""
import os, sys, time, torch
import bitpush.torch as bp
bp.init()
grad = torch.randn(1 << 16)
steps = 0
while not os.path.exists(sys.argv[1]):
    try:
        bp.push_pull(grad, "grad")
        steps += 1
        if steps == 1:
            print("ready", flush=True)
        time.sleep(0.01)
    except Exception:  # a server was killed: every push_pull fails until it is back
        time.sleep(0.05)
"""


def _metrics_block(n, avoid):
    """A port p with p .. p + n - 1 all free on loopback and none in `avoid` (the cluster's
    own ports, picked but not yet bound): the metrics ports of one cluster."""
    for _ in range(50):
        first = free_ports(1)[0]
        if any(first <= p < first + n for p in avoid):
            continue
        socks = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no %d consecutive free ports" % n)


def _table(screen):
    """{node label: {column: cell}} of the table on a screen (rows split on 2+ spaces)."""
    lines = screen.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith("NODE ")), None)
    if start is None:
        return {}
    columns = lines[start].split()
    out = {}
    for line in lines[start + 1:]:
        if not re.match(r"(scheduler|server \d+|worker \d+)\b", line):
            break
        cells = re.split(r"\s{2,}", line.strip())
        out[cells[0]] = dict(zip(columns, cells))
    return out


def _wait_for(what, probe, timeout):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(0.2)
    pytest.fail("%s not seen in %.0f s; last:\n%s" % (what, timeout, last))


NODES = ["scheduler", "server 0", "server 1", "worker 0", "worker 1"]


def _training(table):
    return sorted(table) == sorted(NODES) and all(
        table[n]["STATE"] == "up" for n in NODES) and all(
        table[w]["ROUNDS/S"] not in ("-", "0") and table[w]["RATIO"] != "-"
        for w in ("worker 0", "worker 1"))


def _ratio(cell):
    return float(cell.rstrip("x"))


@pytest.fixture
def cluster(request):
    # A killed server does not end this job (server_rejoin_timeout_s): the others stay up.
    c = LocalCluster(workers=2, servers=2, compression="onebit", error_feedback="both",
                     extra={"cluster": {"server_rejoin_timeout_s": 60}})
    c.stop_file = os.path.join(c.dir, "stop")
    used = [int(a.rsplit(":", 1)[1]) for a in
            [c.scheduler_address] + c.server_addresses + c.worker_addresses]
    with open(c.config_path, "a") as f:
        f.write("metrics:\n  port: %d\n" % _metrics_block(5, used))
    try:
        c.start()
        script = os.path.join(c.dir, "train.py")
        with open(script, "w") as f:
            f.write(TRAIN)
        workers = [c.start_worker(script, [c.stop_file], worker_rank=n) for n in range(2)]
        _wait_for("both workers training",
                  lambda: (all("ready" in w.output() for w in workers), c.logs_text()), 60)
        yield c
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(c.logs_text())
    except BaseException:
        print(c.logs_text())
        raise
    finally:
        open(c.stop_file, "w").close()
        c.stop(grace_s=0.5, term_wait_s=2.0)


class _Tmux:
    """A tmux server of its own (-L) with one 160x40 session running bash."""

    def __init__(self):
        self.cmd = ["tmux", "-L", "bp-top-%d" % os.getpid(), "-f", "/dev/null"]
        subprocess.run(self.cmd + ["new-session", "-d", "-s", "t", "-x", "160", "-y", "40",
                                   "bash --norc --noprofile"],
                       env=dict(os.environ, TERM="xterm"), check=True)

    def keys(self, *keys):
        subprocess.run(self.cmd + ["send-keys", "-t", "t"] + list(keys), check=True)

    def screen(self):
        return subprocess.run(self.cmd + ["capture-pane", "-p", "-t", "t"],
                              stdout=subprocess.PIPE, universal_newlines=True).stdout

    def alternate_screen(self):
        return subprocess.run(self.cmd + ["display-message", "-p", "-t", "t", "#{alternate_on}"],
                              stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()

    def kill(self):
        subprocess.run(self.cmd + ["kill-server"], stderr=subprocess.DEVNULL)


def _check_once(cluster):
    """--once: one plain table, its rates from two scrapes."""
    r = _run_top(["--config", cluster.config_path, "--once", "--interval", "0.5"])
    assert r.returncode == 0, r.stdout + r.stderr
    table = _table(r.stdout)
    assert _training(table), r.stdout
    for w in ("worker 0", "worker 1"):
        assert float(table[w]["ROUNDS/S"]) > 0 and _ratio(table[w]["RATIO"]) > 4, r.stdout
        assert table[w]["SLOWEST"].split()[0] in ("compress", "network", "decompress"), r.stdout
    assert table["server 0"]["SLOWEST"].startswith("engine "), r.stdout
    assert re.search(r"^nodes 5/5 up \(scheduler: 4/4 registered, 0 dead\)  rounds/s [\d.]+  ",
                     r.stdout, re.M), r.stdout


def _check_tmux(cluster, tmux):
    """The curses view in a real terminal: a row per node, a killed server down, q and Ctrl-C
    give the shell back with exit 0 and the alternate screen left."""
    command = " ".join(_top_cmd()) + " --config %s --interval 0.5; echo top-exit=$?" \
        % cluster.config_path

    def exited():
        s = tmux.screen()  # the command line holds "top-exit=$?"; its output starts a line
        return re.search(r"^top-exit=\d+$", s, re.M) is not None, s

    def training():
        s = tmux.screen()
        return _training(_table(s)), s

    def server_down():
        s = tmux.screen()
        t = _table(s)
        return (t.get("server 1", {}).get("STATE", "").startswith("down (")
                and all(t[n]["STATE"] == "up" for n in NODES if n != "server 1")), s

    tmux.keys(command, "Enter")
    shown = _wait_for("a row per node, the workers training", training, 15)
    assert re.search(r"^bitpush top  \S+cluster.yaml  every 0.5 s", shown, re.M), shown
    table = _table(shown)
    assert all(_ratio(table[w]["RATIO"]) > 4 for w in ("worker 0", "worker 1")), shown

    cluster.kill_server(1)
    shown = _wait_for("server 1 down, the others up", server_down, 10)
    assert _table(shown)["server 1"]["STATE"] == "down (connection refused)", shown

    tmux.keys("q")
    shown = _wait_for("top's exit", exited, 5)
    assert re.search(r"^top-exit=0$", shown, re.M), shown
    assert "NODE " not in shown, shown  # the table went with the alternate screen
    assert tmux.alternate_screen() == "0"

    tmux.keys("clear; " + command, "Enter")
    _wait_for("the table again", lambda: ("NODE " in tmux.screen(), tmux.screen()), 10)
    tmux.keys("C-c")
    shown = _wait_for("top's exit", exited, 5)
    assert re.search(r"^top-exit=0$", shown, re.M) and "NODE " not in shown, shown
    assert tmux.alternate_screen() == "0"


def test_top_once_batch_and_tmux(cluster):
    _check_once(cluster)
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (deploy/install-deps.sh installs it)")
    # Without a terminal (a pipe), meanwhile: a table every interval until SIGTERM (exit 143).
    batch = subprocess.Popen(_top_cmd() + ["--config", cluster.config_path, "--interval", "0.3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
    tmux = None
    try:
        tmux = _Tmux()
        _check_tmux(cluster, tmux)
    finally:
        if tmux is not None:
            tmux.kill()
        batch.terminate()
        out, err = batch.communicate(timeout=10)
    assert batch.returncode == 128 + signal.SIGTERM, (batch.returncode, err)
    assert err == "" and out.count("\nNODE ") >= 3, (out, err)
    last = _table(out.split("\n\nbitpush top ")[-1])
    assert last["server 1"]["STATE"] == "down (connection refused)", out
