"""The Grafana dashboard (deploy/grafana/bitpush.json) and `bitpush metrics-config`
(python/bitpush/metrics_config.py) against the exporters of a real cluster
(docs/observability.md, "Dashboard"; docs/metrics.md).

One `bitpush launch` of a scheduler, 2 servers and 2 embedded worker nodes with metrics.port
set, training with onebit compression until the test has scraped every endpoint the generated
scrape configuration lists: its targets are exactly the cluster's processes, each labelled
with the role and rank its `bitpush_node_info` names, and every metric (and every label value a
selector asks for) that any dashboard expression uses is in some process's output. The
dashboard's structure, the command's errors and, where `promtool` is installed, Prometheus' own
checks of the configuration and of the dashboard's PromQL need no cluster.
"""
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest
import yaml  # Debian's python3-yaml, a dependency of python3-torch

from bitpush import metrics_config
from bitpush.testing import free_ports

PY = "/usr/bin/python3"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "bitpush.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Labels Prometheus attaches from the scrape configuration, not the exporter.
TARGET_LABELS = {"job", "instance", "role", "rank", "node"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan", "atan2"}

# Trains until the file argv[1] exists (every worker stops at the same step: each step also
# sums whether anyone has seen it), at most ~60 s.
TRAIN = r"""
import os, sys, time, torch
import bitpush.torch as bp
bp.init()
grad = torch.randn(16384)  # 64 KiB: above min_compress_bytes, pushed 1-bit
for step in range(6000):
    bp.push_pull(grad, "grad")
    seen = bp.push_pull(torch.tensor([float(os.path.exists(sys.argv[1]))]), "stop",
                        average=False)
    if float(seen[0]) > 0:
        break
    time.sleep(0.01)
bp.shutdown()
"""


# -- PromQL and exposition text -------------------------------------------------------------

_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_SELECTOR = re.compile(r'([A-Za-z_:][\w:]*)?\s*\{((?:[^}"\']|%s)*)\}' % _STRING)
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!=|!~|=)\s*(%s)' % _STRING)
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")


def _unquote(s):
    return json.loads('"%s"' % s[1:-1].replace('"', '\\"')) if s[0] == "'" else json.loads(s)


def selectors(expr):
    """[(metric name or None, [(label, op, value)])] of every series selector in a PromQL
    expression: `name{matchers}` and bare `name` alike (functions, keywords, label lists of
    by/on/..., ranges, strings and Grafana variables are not metric names)."""
    out = []
    for m in _SELECTOR.finditer(expr):
        out.append((m.group(1), [(l, op, _unquote(v)) for l, op, v
                                 in _MATCHER.findall(m.group(2))]))
    rest = _SELECTOR.sub(" ", expr)
    rest = re.sub(_STRING, " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)        # [5m], [$__rate_interval], subqueries
    rest = _LABEL_LIST.sub(" ", rest)
    for name in _IDENT.findall(rest):
        if name.lower() not in PROMQL_WORDS:
            out.append((name, []))
    return out


def dashboard_expressions(dashboard):
    """[(where, PromQL)] of every query the dashboard runs: each panel's targets (panels in
    rows too) and each query variable's metric expression (label_values(EXPR, label))."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append(("panel %r %s" % (p.get("title"), t.get("refId")), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    for v in dashboard["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.match(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", q)
        assert m, "variable %s: not label_values(EXPR, label): %r" % (v["name"], q)
        out.append(("variable %s" % v["name"], m.group(1)))
    return out


def parse_exposition(text):
    """{series name: [(labels dict, value)]} of Prometheus text format 0.0.4."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)", line)
        assert m, "not a sample line: %r" % line
        labels = {k: _unquote('"%s"' % v) for k, v
                  in re.findall(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"', m.group(2) or "")}
        series.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return series


def dashboard_problems(dashboard, series):
    """What the dashboard asks for that the exporters' `series` (parse_exposition's, all processes
    together) do not have: a metric name no process exports (names are series names, so a
    histogram's `_bucket` is as exported), or an equality matcher `label="value"` on an
    exporter label that no series of that metric carries. [] when everything exists."""
    problems = []
    for where, expr in dashboard_expressions(dashboard):
        for name, matchers in selectors(expr):
            if name is None:
                problems.append("%s: a selector without a metric name: %s" % (where, expr))
                continue
            if name not in series:
                problems.append("%s: metric %s is exported by no process" % (where, name))
                continue
            for label, op, value in matchers:
                if op != "=" or label in TARGET_LABELS or "$" in value:
                    continue
                if not any(s.get(label) == value for s, _ in series[name]):
                    problems.append("%s: no series %s{%s=%r} is exported" % (where, name, label,
                                                                               value))
    return problems


# -- the dashboard's structure ----------------------------------------------------------------

def _load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def test_dashboard_is_well_formed():
    d = _load_dashboard()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, d["schemaVersion"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource", variables["datasource"]
    assert variables["datasource"]["query"] == "prometheus", variables["datasource"]
    for name in ("job", "node"):
        assert variables[name]["type"] == "query", variables[name]
        assert variables[name]["datasource"] == DATASOURCE, variables[name]

    ids, panels = [], []

    def walk(ps):
        for p in ps:
            ids.append(p["id"])
            if p["type"] != "row":
                panels.append(p)
            walk(p.get("panels", []))

    walk(d["panels"])
    assert len(ids) == len(set(ids)), "panel ids repeat: %s" % sorted(ids)
    assert len(panels) >= 10, len(panels)
    for p in panels:
        what = "panel %r" % p.get("title")
        assert p.get("title") and p.get("datasource") == DATASOURCE, what
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, (what, g)
        targets = p.get("targets") or []
        assert targets, what + ": no target"
        assert len({t["refId"] for t in targets}) == len(targets), what + ": refIds repeat"
        for t in targets:
            assert t.get("datasource", DATASOURCE) == DATASOURCE, (what, t)
            assert t["expr"].strip(), (what, t)
            # Per node: the legend names it and every selector follows the variables.
            assert "{{node}}" in t.get("legendFormat", ""), (what, t)
            for name, matchers in selectors(t["expr"]):
                got = {(l, op, v) for l, op, v in matchers}
                assert {("job", "=", "$job"), ("node", "=~", "$node")} <= got, (what, name, t)


def test_selectors_parse_promql():
    expr = ('sum by (node, stage) (rate(bitpush_worker_stage_seconds_total{job="$job", '
            'node=~"$node"}[$__rate_interval])) / ignoring (stage) group_left sum by (node) '
            '(rate(bitpush_worker_partitions_pushed_total[5m] offset 1m)) '
            '+ on (node) histogram_quantile(0.9, foo_seconds_bucket{le="+Inf", x=\'a}b\'}) '
            '* bool up')
    assert selectors(expr) == [
        ("bitpush_worker_stage_seconds_total", [("job", "=", "$job"), ("node", "=~", "$node")]),
        ("foo_seconds_bucket", [("le", "=", "+Inf"), ("x", "=", "a}b")]),
        ("bitpush_worker_partitions_pushed_total", []),
        ("up", []),
    ]


# -- bitpush metrics-config: errors, promtool --------------------------------------------------

def _write_yaml(d, ports, metrics_port, compression="onebit"):
    """A cluster YAML: scheduler ports[0], servers ports[1:3], workers ports[3:5]."""
    path = os.path.join(d, "cluster.yaml")
    with open(path, "w") as f:
        f.write("cluster:\n  scheduler: 127.0.0.1:%d\n" % ports[0])
        f.write("  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (ports[1], ports[2]))
        f.write("  workers: [127.0.0.1:%d, 127.0.0.1:%d]\n" % (ports[3], ports[4]))
        f.write("  heartbeat_interval_ms: 100\n  heartbeat_timeout_ms: 1000\n"
                "  startup_timeout_s: 30\n")
        # 16 KiB partitions: the training's 64 KiB tensor gives both servers keys.
        f.write("compression:\n  spec: %s\n  error_feedback: both\n  partition_bytes: 16384\n"
                % compression)
        f.write("server:\n  engine_threads: 1\n  numa: off\n")
        f.write("worker:\n  compress_threads: 1\n  op_timeout_s: 30\n")
        f.write("metrics:\n  port: %d\n" % metrics_port)
    return path


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="bp-dash-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_metrics_config_refuses_with_a_reason(tmp, capsys):
    off = _write_yaml(tmp, [19100, 19101, 19102, 19111, 19112], 0)
    assert metrics_config.main([off]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "metrics.port is 0" in err and off in err, err

    bad = os.path.join(tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write("cluster:\n  scheduler: [\n")
    assert metrics_config.main([bad]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("bitpush metrics-config: ") and "bad.yaml" in err, err
    assert metrics_config.main([os.path.join(tmp, "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr()[1]

    on = _write_yaml(tmp, [19100, 19101, 19102, 19111, 19112], 9400)
    assert metrics_config.main([on, "--scrape-interval", "5"]) == 2
    assert "--scrape-interval '5'" in capsys.readouterr()[1]
    assert metrics_config.main([on, "-o", os.path.join(tmp, "no", "such", "dir.yml")]) == 2
    assert "cannot write" in capsys.readouterr()[1]
    assert metrics_config.main([on, "--no-such-option"]) == 2
    capsys.readouterr()

    written = os.path.join(tmp, "prometheus.yml")
    assert metrics_config.main([on, "-o", written, "--scrape-interval", "1m30s"]) == 0
    with open(written) as f:
        prom = yaml.safe_load(f)
    job = prom["scrape_configs"][0]
    assert job["scrape_interval"] == "1m30s" and job["job_name"] == "bitpush", job
    assert [c["targets"] for c in job["static_configs"]] == [
        ["127.0.0.1:%d" % p] for p in range(9400, 9405)]


def test_promtool_accepts_the_config_and_the_dashboard_queries(tmp):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    on = _write_yaml(tmp, [19100, 19101, 19102, 19111, 19112], 9400)
    written = os.path.join(tmp, "prometheus.yml")
    assert metrics_config.main([on, "-o", written]) == 0
    r = subprocess.run([promtool, "check", "config", written], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=60)
    assert r.returncode == 0, r.stdout
    # Each dashboard expression as a recording rule, Grafana's variables filled in: promtool
    # parses every one.
    rules = os.path.join(tmp, "rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (_, expr) in enumerate(dashboard_expressions(_load_dashboard())):
            expr = (expr.replace("$__rate_interval", "1m").replace("$job", "bitpush")
                    .replace("$node", ".*"))
            f.write("      - record: dashboard_%d\n        expr: %s\n" % (i, json.dumps(expr)))
    r = subprocess.run([promtool, "check", "rules", rules], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=60)
    assert r.returncode == 0, r.stdout


# -- a live cluster ------------------------------------------------------------------------------

def _launcher():
    bin_dir = os.environ.get("BITPUSH_BIN_DIR")
    if not bin_dir:
        from bitpush import _build_info
        bin_dir = _build_info.BIN_DIR
    wrapper = os.path.join(bin_dir, "bitpush")
    return [wrapper] if os.access(wrapper, os.X_OK) else [PY, "-m", "bitpush.launch"]


def _scrape(address):
    """The series of http://address/metrics, or None while nothing answers there."""
    try:
        with urllib.request.urlopen("http://%s/metrics" % address, timeout=5) as r:
            return parse_exposition(r.read().decode())
    except OSError:
        return None


def _consecutive_ports(n):
    while True:
        block = free_ports(n)
        if block == list(range(block[0], block[0] + n)):
            return block[0]


def _sum(series, name, **labels):
    """The sum of the values of `name{labels}` in parse_exposition's `series` (None: 0)."""
    return sum(v for s, v in (series or {}).get(name, [])
               if all(s.get(k) == want for k, want in labels.items()))


def test_config_targets_and_dashboard_metrics_on_a_live_cluster(tmp):
    metrics_port = _consecutive_ports(5)
    cfg = _write_yaml(tmp, free_ports(5), metrics_port)
    r = subprocess.run(_launcher() + ["metrics-config", cfg, "--job", "bp-test"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    prom = yaml.safe_load(r.stdout)
    assert [j["job_name"] for j in prom["scrape_configs"]] == ["bp-test"], prom
    targets = {}
    for group in prom["scrape_configs"][0]["static_configs"]:
        assert len(group["targets"]) == 1, group
        targets[group["targets"][0]] = group["labels"]
    expected = {("scheduler", None), ("server", "0"), ("server", "1"), ("worker", "0"),
                ("worker", "1")}
    assert {(l["role"], l.get("rank")) for l in targets.values()} == expected, targets
    for labels in targets.values():
        assert labels["node"] == " ".join(v for v in (labels["role"], labels.get("rank")) if v)

    stop_file = os.path.join(tmp, "stop")
    log_path = os.path.join(tmp, "launch.log")
    with open(log_path, "w") as log:
        launcher = subprocess.Popen(_launcher() + ["launch", "--config", cfg, "--", PY, "-c",
                                                   TRAIN, stop_file],
                                    stdout=log, stderr=subprocess.STDOUT)

    def launch_log():
        with open(log_path) as f:
            return f.read()[-6000:]

    rc = None
    try:
        # Training runs: every worker completed push_pulls and every server published rounds.
        deadline = time.monotonic() + 60
        workers = [a for a, l in targets.items() if l["role"] == "worker"]
        servers = [a for a, l in targets.items() if l["role"] == "server"]
        while True:
            scraped = {a: _scrape(a) for a in targets}
            rounds = {a: _sum(scraped[a], "bitpush_worker_push_pulls_total", result="completed")
                      for a in workers}
            rounds.update({a: _sum(scraped[a], "bitpush_server_rounds_published_total")
                           for a in servers})
            if min(rounds.values()) >= 5:
                break
            assert launcher.poll() is None, "the job ended early:\n" + launch_log()
            assert time.monotonic() < deadline, ("not every process counted rounds within "
                                                 "60 s: %s\n%s" % (rounds, launch_log()))
            time.sleep(0.1)
        assert launcher.poll() is None, "the job ended during the scrape:\n" + launch_log()
    finally:
        with open(stop_file, "w"):
            pass  # the workers stop at their next step
        try:
            rc = launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.send_signal(signal.SIGTERM)  # the launcher stops every process it started
            try:
                launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                launcher.kill()  # its children die with it (PR_SET_PDEATHSIG)
                launcher.wait()
    assert rc == 0, launch_log()

    # (a) The targets are the live endpoints: each answers, naming the node its labels say.
    for address, labels in targets.items():
        series = scraped[address]
        assert series is not None, "%s (%s) did not answer" % (address, labels["node"])
        info = series.get("bitpush_node_info", [])
        want = {"role": labels["role"]}
        if "rank" in labels:
            want["rank"] = labels["rank"]
        assert info == [(want, 1.0)], (address, labels, info)
    # Compression ran: the workers pushed fewer bytes than they had (the "bytes saved" panels).
    for address in workers:
        raw = _sum(scraped[address], "bitpush_worker_payload_bytes_total", direction="push",
                   encoding="raw")
        sent = _sum(scraped[address], "bitpush_worker_payload_bytes_total", direction="push",
                    encoding="compressed")
        assert raw > 8 * sent > 0, (address, raw, sent)

    # (b) Every metric and label value the dashboard uses is exported by some process.
    everything = {}
    for series in scraped.values():
        for name, samples in series.items():
            everything.setdefault(name, []).extend(samples)
    dashboard = _load_dashboard()
    problems = dashboard_problems(dashboard, everything)
    assert not problems, "\n".join(problems)

    # ... and the check fails for a name or a label value that is not exported.
    broken = copy.deepcopy(dashboard)
    for p in broken["panels"]:
        for t in p.get("targets", []):
            t["expr"] = (t["expr"]
                         .replace("bitpush_worker_stage_seconds_total",
                                  "bitpush_worker_stage_second_total")
                         .replace('encoding="compressed"', 'encoding="compresed"'))
    problems = "\n".join(dashboard_problems(broken, everything))
    assert "metric bitpush_worker_stage_second_total is exported by no process" in problems
    assert "bitpush_worker_payload_bytes_total{encoding='compresed'}" in problems, problems

    # (c) docs/metrics.md names every metric a process exported.
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        documented = set(re.findall(r"`((?:bitpush|process)_[a-z0-9_]+)", f.read()))
    families = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in documented else n
                for n in everything}
    undocumented = sorted(n for n in families if n not in documented)
    assert not undocumented, "exported but not in docs/metrics.md: %s" % undocumented
