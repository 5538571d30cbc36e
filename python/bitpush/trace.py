"""`bitpush trace merge` and `bitpush trace plot` (docs/observability.md).

    bitpush trace merge DIR [-o trace.json]
    bitpush trace plot trace.json [-o step.png] [--round R] [--tensor NAME]

`merge` reads the span files of a --timeline run (DIR/<role>-<pid>-<n>.jsonl, the format of
docs/observability.md "Span files"), aligns every file's clock to the scheduler's from its
heartbeat exchanges (a line through the best exchange of each time window, so that a clock
that drifts stays aligned: bitpush/_trace_clock.py), and writes one Chrome trace-event JSON:
a process row per node (workers, then servers), a thread row per thread of each file, "X"
events for the spans and flow arrows from each worker `push` to the server's `push_received`
and from each server `reply_sent` to the end of the worker's `network` span. A file cut short
by a crash is merged as far as it goes, with a warning; so are files with lines that do not
decode.

`plot` draws one step (round) of a merged trace as a Gantt chart (bitpush/_trace_plot.py,
matplotlib). Which span answers which (the arrows, the causal check): bitpush/_trace_check.py.

The Python API, for tests and notebooks:

    t = bitpush.trace.load(DIR)                 # a Trace: .files, .spans, .warnings, ...
    t.write("trace.json")                       # what `merge` writes
    bitpush.trace.causal_violations(t)          # [] when every push/reply is in causal order

No torch here: the module starts fast.
"""
import argparse
import json
import os
import re
import sys

from . import _trace_check, _trace_clock
from ._trace_check import fmt_ns as _fmt_ns
from ._trace_clock import half as _half

__all__ = ["load", "causal_violations", "main", "Trace", "TraceError"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

FORMAT_VERSION = 1
_FILE_RE = re.compile(r"^(?P<role>[A-Za-z_]+)-(?P<pid>\d+)-(?P<n>\d+)\.jsonl$")
# Rows: workers, then servers, then anything else; within a node the daemon first.
_NODE_ORDER = {"worker": 0, "server": 1, "scheduler": 2}
_PROCESS_ORDER = {"daemon": 0, "engine": 1, "server": 2}
# Spans that wait rather than work: rows of their own, nothing inside (see Trace._lanes).
_ASYNC_SPANS = frozenset(["network"])
_BAD_LINES_SHOWN = 3  # per file, lines named one by one in the warnings; the rest are counted
# Optional where a span does not have them (`local_rank`: a daemon's span about one of its
# training processes); older files have no `local_rank` at all.
_INT_FIELDS = ("key", "round", "bytes", "worker", "server", "local_rank")


class TraceError(Exception):
    """A reason no trace could be made or read (the CLI prints it and exits 2)."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Span:
    """One span record of one file. ts/dur are this process's clock (ns); `at` is ts on the
    scheduler's clock (ns, after alignment), `at_dur` dur on it (dur itself unless the file's
    clock drifts); `lane` the row it is drawn in (0 unless spans of its thread overlap without
    nesting)."""
    __slots__ = ("name", "file", "tid", "ts", "dur", "key", "round", "bytes", "worker",
                 "server", "local_rank", "at", "at_dur", "lane")

    def __init__(self, name, file, tid, ts, dur, fields):
        self.name, self.file, self.tid, self.ts, self.dur = name, file, tid, ts, dur
        self.key, self.round, self.bytes, self.worker, self.server, self.local_rank = fields
        self.at = None
        self.at_dur = dur
        self.lane = 0

    @property
    def end(self):
        return self.at + self.at_dur

    def __repr__(self):
        return "Span(%s %s tid %d ts %s dur %s key %s round %s)" % (
            self.file.node, self.name, self.tid, self.ts, self.dur, self.key, self.round)


class SpanFile:
    """What one span file says: who wrote it, its clock exchanges, tensors, threads, spans."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        m = _FILE_RE.match(self.name)
        self.role = m.group("role") if m else None
        self.pid = int(m.group("pid")) if m else None
        self.rank = None
        self.node = None
        self.process = None
        self.host = None
        self.version = None
        self.has_process_record = False
        self.clocks = []      # (t0, t1, t2, t3)
        self.tensors = {}     # name -> [keys]
        self.threads = {}     # tid -> name
        self.spans = []
        self.dropped = 0
        self.end = None       # the end record, or None (crashed / killed)
        self.bad_lines = []   # (line number, why)
        self.bad_records = []  # (line number, why): JSON, but not a record we understand
        # Set by the alignment:
        self.clock = None     # its _trace_clock.ClockModel (None: no clock exchange)
        self.offset2 = 0      # 2 x offset (ns): scheduler time = local + offset2 / 2 (at
        #                       clock.t_ref when the clock drifts)
        self.residual_ns = None  # None: unknown (no clock exchange)
        self.samples = 0
        self.clock_from = None  # the sibling file whose clock exchanges were used, if any

    @property
    def offset_ns(self):
        return _half(self.offset2)

    @property
    def drift_ppm(self):
        """The drift its alignment applies (ppm; 0: a constant offset), None: unknown."""
        return None if self.clock is None else self.clock.drift_ppm

    def align(self, span):
        """Sets span.at and span.at_dur: its times on the scheduler's clock."""
        c = self.clock
        if c is None:
            span.at = span.ts
        elif c.kind == "constant":
            span.at = span.ts + _half(self.offset2)
        else:
            span.at = c.at(span.ts)
            span.at_dur = c.at(span.ts + span.dur) - span.at

    @property
    def partial(self):
        return self.end is None or bool(self.bad_lines)

    @property
    def label(self):
        return "%s (%s)" % (self.name, self.node)

    # -- reading ---------------------------------------------------------------------------

    def read(self):
        with open(self.path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        last = len(lines) - 1  # lines[last] is what follows the last newline ("" if none)
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                why = ("is cut short (the process stopped mid-write)" if i == last else
                       "does not decode (%s)" % _short(e))
                self.bad_lines.append((i + 1, why))
                continue
            if not isinstance(rec, dict):
                self.bad_records.append((i + 1, "is not a JSON object"))
                continue
            why = self._record(rec)
            if why:
                self.bad_records.append((i + 1, why))
        self._fill_in()

    def _record(self, rec):
        """Takes one record in; returns why it was ignored, or None."""
        t = rec.get("type")
        if t == "span":
            name, ts, dur = rec.get("name"), rec.get("ts"), rec.get("dur")
            if not isinstance(name, str) or not _is_num(ts) or not _is_num(dur) or dur < 0:
                return "is a span without a name, ts or dur >= 0"
            tid = rec.get("tid", 0)
            fields = tuple(rec.get(k) if _is_int(rec.get(k)) else None for k in _INT_FIELDS)
            self.spans.append(Span(name, self, tid if _is_int(tid) else 0, ts, dur, fields))
        elif t == "clock":
            ts = tuple(rec.get(k) for k in ("t0", "t1", "t2", "t3"))
            if not all(_is_int(v) for v in ts):
                return "is a clock record without integer t0..t3"
            self.clocks.append(ts)
        elif t == "process":
            if self.has_process_record:
                return "is a second process record"
            self.has_process_record = True
            for k in ("role", "node", "process", "host"):
                if isinstance(rec.get(k), str):
                    setattr(self, k, rec[k])
            for k in ("rank", "pid", "version"):
                if _is_int(rec.get(k)):
                    setattr(self, k, rec[k])
        elif t == "tensor":
            name, keys = rec.get("name"), rec.get("keys")
            if not isinstance(name, str) or not isinstance(keys, list):
                return "is a tensor record without a name and keys"
            self.tensors[name] = [k for k in keys if _is_int(k)]
        elif t == "thread":
            if not _is_int(rec.get("tid")) or not isinstance(rec.get("name"), str):
                return "is a thread record without tid and name"
            self.threads[rec["tid"]] = rec["name"]
        elif t == "dropped":
            if _is_int(rec.get("count")):
                self.dropped = max(self.dropped, rec["count"])
        elif t == "end":
            self.end = rec
            if _is_int(rec.get("dropped")):
                self.dropped = max(self.dropped, rec["dropped"])
        else:
            return "has an unknown type %r" % (t,)
        return None

    def _fill_in(self):
        if self.node is None:
            self.node = "%s pid %s" % (self.role or "unknown", self.pid if self.pid else "?")
        if self.process is None:
            self.process = {"worker": "engine"}.get(self.role, self.role or "unknown")

    def warnings(self):
        out = []
        who = self.label
        if not self.has_process_record:
            out.append("%s: no process record (the process ended before it knew its rank): "
                       "shown as its own row" % self.name)
        elif self.version not in (None, FORMAT_VERSION):
            out.append("%s: format version %s, this reader knows %d: read as far as it "
                       "understands" % (who, self.version, FORMAT_VERSION))
        for kind, items in (("line", self.bad_lines), ("record", self.bad_records)):
            for n, why in items[:_BAD_LINES_SHOWN]:
                out.append("%s: line %d %s: skipped" % (who, n, why))
            if len(items) > _BAD_LINES_SHOWN:
                out.append("%s: %d more %ss like these skipped"
                           % (who, len(items) - _BAD_LINES_SHOWN, kind))
        if self.end is None:
            out.append("%s: ended without its end record (the process crashed or was killed): "
                       "merged %d spans as far as it goes" % (who, len(self.spans)))
        elif _is_int(self.end.get("spans")) and self.end["spans"] not in (
                len(self.spans), len(self.spans) + self.dropped):  # written, or recorded
            out.append("%s: its end record counts %d spans, the file holds %d"
                       % (who, self.end["spans"], len(self.spans)))
        if self.dropped:
            out.append("%s: %d spans dropped (the trace ring was full: raise "
                       "trace.buffer_spans); the trace lacks them" % (who, self.dropped))
        return out


def _short(e):
    s = str(e)
    return s if len(s) <= 80 else s[:77] + "..."


# -- clocks -----------------------------------------------------------------------------------

def _align(files):
    """Sets each file's clock model (offset, drift, residual: bitpush/_trace_clock.py); a file
    without exchanges takes the model of another file of the same process (same host and pid:
    the same steady clock) when there is one. Returns {file name: [warnings]}."""
    warnings = {}
    fits = {}

    def fit(g):
        if g.name not in fits:
            fits[g.name] = _trace_clock.fit(g.clocks)
            if fits[g.name][1]:
                warnings.setdefault(g.name, []).append("%s: %s" % (g.label, fits[g.name][1]))
        return fits[g.name][0]

    for f in files:
        model = fit(f)
        f.samples = len(f.clocks)
        if model is None and f.pid is not None:
            for g in files:
                if g is not f and g.pid == f.pid and (g.host == f.host or None in (
                        g.host, f.host)) and fit(g) is not None:
                    model, f.clock_from = fit(g), g.name
                    break
        f.clock = model
        if model is None:
            f.offset2, f.residual_ns = 0, None
            warnings.setdefault(f.name, []).append(
                "%s: no clock exchange with the scheduler (%s): its times are its own "
                "clock's, residual unknown" % (f.label, "none valid" if f.clocks else
                                               "it never heard from the scheduler"))
        else:
            f.offset2, f.residual_ns = model.offset2, model.residual_ns
    return warnings


# -- the merged trace -------------------------------------------------------------------------

def _node_key(node):
    parts = node.split()
    kind = _NODE_ORDER.get(parts[0] if parts else "", len(_NODE_ORDER))
    num = int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else float("inf")
    return (kind, num, node)


class Node:
    """One process row of the trace: a node ("worker 0") and the files written on it."""

    def __init__(self, name, index):
        self.name, self.index, self.files = name, index, []
        self.pid = index + 1  # the Chrome trace's pid

    @property
    def residual_ns(self):
        """The largest residual of its files (None: one of them is unknown)."""
        rs = [f.residual_ns for f in self.files]
        return None if any(r is None for r in rs) else max(rs)


class Trace:
    """The span files of one directory, aligned to the scheduler's clock.

    files:    [SpanFile], in row order          nodes: [Node], in row order
    spans:    [Span], sorted by aligned time    keys:  {key: (tensor name, partition)}
    base_ns:  the earliest aligned span start (scheduler clock, ns); the output's time 0
    warnings: [str], what did not read cleanly
    """

    def __init__(self, directory, files, warnings):
        self.directory = directory
        self.warnings = warnings
        by_node = {}
        for f in files:
            by_node.setdefault(f.node, []).append(f)
        self.nodes = []
        for i, name in enumerate(sorted(by_node, key=_node_key)):
            node = Node(name, i)
            node.files = sorted(by_node[name], key=lambda f: (
                _PROCESS_ORDER.get(f.process, len(_PROCESS_ORDER)), f.pid or 0, f.name))
            self.nodes.append(node)
        self.files = [f for n in self.nodes for f in n.files]
        self._node_of = {id(f): n for n in self.nodes for f in n.files}
        self.keys = {}
        for f in self.files:
            for name, keys in sorted(f.tensors.items()):
                for i, k in enumerate(keys):
                    self.keys.setdefault(k, (name, i))
        for f in self.files:
            for s in f.spans:
                f.align(s)
        self.spans = sorted((s for f in self.files for s in f.spans),
                            key=lambda s: (s.at, -s.dur))
        self.base_ns = self.spans[0].at if self.spans else 0
        known = [f.residual_ns for f in self.files if f.residual_ns is not None]
        self.max_residual_ns = max(known) if known else None
        self._lanes()

    def node_of(self, f):
        return self._node_of[id(f)]

    def tensor_of(self, span):
        """(tensor name, partition) of a span's key, or None."""
        if span.key is None or (span.name == "optimizer" and span.file.role != "server"):
            return None  # a worker's optimizer span has key 0 for the whole step
        return self.keys.get(span.key)

    def _lanes(self):
        """Spans of one thread that overlap without nesting go to extra rows of that thread:
        a Chrome trace's slices on one row must nest. A span that fits inside open spans of
        several rows goes inside the one that began last (the innermost, as on a thread's
        stack); else to the first row free at its start. Async spans (`network`: the thread
        waits for it, it is not in it) come after, in rows of their own, one after the other
        and nothing inside: the thread's row keeps its work, and a flow arrow that ends in a
        network span binds to it."""
        self.lane_count = {}  # (file name, tid) -> rows
        for f in self.files:
            by_tid = {}
            for s in f.spans:
                by_tid.setdefault(s.tid, []).append(s)
            for tid, spans in by_tid.items():
                spans.sort(key=lambda s: (s.ts, -s.dur))
                stacks = []  # per row, the (start, end) of its open spans
                for s in spans:
                    if s.name in _ASYNC_SPANS:
                        continue
                    end = s.ts + s.dur
                    inside, free = None, None
                    for lane, stack in enumerate(stacks):
                        while stack and stack[-1][1] <= s.ts:
                            stack.pop()
                        if not stack:
                            free = lane if free is None else free
                        elif stack[-1][1] >= end and (
                                inside is None or stack[-1][0] > stacks[inside][-1][0]):
                            inside = lane
                    lane = inside if inside is not None else free
                    if lane is None:
                        lane = len(stacks)
                        stacks.append([])
                    stacks[lane].append((s.ts, end))
                    s.lane = lane
                ends = []  # per async row, where its last span ends
                for s in spans:
                    if s.name not in _ASYNC_SPANS:
                        continue
                    lane = next((i for i, e in enumerate(ends) if e <= s.ts), len(ends))
                    if lane == len(ends):
                        ends.append(0)
                    ends[lane] = s.ts + s.dur
                    s.lane = len(stacks) + lane
                self.lane_count[(f.name, tid)] = max(1, len(stacks) + len(ends))

    # -- Chrome trace-event JSON -----------------------------------------------------------

    def _rows(self):
        """{(file name, tid, lane): (chrome pid, chrome tid, row name)} in row order."""
        rows = {}
        for node in self.nodes:
            procs = [f.process for f in node.files]
            n = 0
            for f in node.files:
                prefix = ""
                if len(node.files) > 1:
                    if procs.count(f.process) == 1:
                        prefix = f.process + ": "
                    elif sum(g.process == f.process and g.pid == f.pid
                             for g in node.files) == 1:
                        prefix = "%s %s: " % (f.process, f.pid)
                    else:
                        prefix = f.name[:-len(".jsonl")] + ": "
                for tid in sorted(set(f.threads) | {s.tid for s in f.spans}):
                    name = f.threads.get(tid, "thread %d" % tid)
                    for lane in range(self.lane_count.get((f.name, tid), 1)):
                        n += 1
                        rows[(f.name, tid, lane)] = (node.pid, n, prefix + name + (
                            " [%d]" % (lane + 1) if lane else ""))
        return rows

    def _args(self, s):
        args = {}
        t = self.tensor_of(s)
        if t is not None:
            args["tensor"], args["partition"] = t
        for k in _INT_FIELDS:
            v = getattr(s, k)
            if v is not None:
                args[k] = v
        return args

    def _us(self, at):
        return (at - self.base_ns) / 1000

    def to_chrome(self):
        """The trace as a Chrome trace-event JSON object (a dict)."""
        meta, events = [], []
        rows = self._rows()
        for node in self.nodes:
            meta.append({"ph": "M", "name": "process_name", "pid": node.pid, "tid": 0,
                         "ts": 0, "args": {"name": node.name}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": node.pid, "tid": 0,
                         "ts": 0, "args": {"sort_index": node.index}})
            meta.append({"ph": "M", "name": "process_labels", "pid": node.pid, "tid": 0,
                         "ts": 0, "args": {"labels": "clock ±" + _fmt_ns(node.residual_ns)}})
        for (pid, tid, name) in rows.values():
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                         "args": {"name": name}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                         "ts": 0, "args": {"sort_index": tid}})
        # (ts, 0 for slices / 1 for flow ends, sequence): a flow event at a slice's start
        # comes after that slice, so that it binds to it.
        for seq, s in enumerate(self.spans):
            pid, tid, _ = rows[(s.file.name, s.tid, s.lane)]
            events.append(((s.at, 0, seq), {
                "name": s.name, "cat": s.file.role or "unknown", "ph": "X",
                "ts": self._us(s.at), "dur": s.at_dur / 1000, "pid": pid, "tid": tid,
                "args": self._args(s)}))
        flow_id = 0
        for kind, src, dst, dst_at in _trace_check.flow_pairs(self):
            flow_id += 1
            spid, stid, _ = rows[(src.file.name, src.tid, src.lane)]
            dpid, dtid, _ = rows[(dst.file.name, dst.tid, dst.lane)]
            src_at = src.at + src.dur / 2  # inside the source slice: "s" binds to it
            common = {"name": kind, "cat": "bitpush.flow", "id": flow_id}
            events.append(((src_at, 1, flow_id), dict(common, ph="s", ts=self._us(src_at),
                                                       pid=spid, tid=stid)))
            events.append(((dst_at, 1, flow_id), dict(common, ph="f", bp="e",
                                                       ts=self._us(dst_at), pid=dpid,
                                                       tid=dtid)))
        events.sort(key=lambda e: e[0])
        return {"traceEvents": meta + [e for _, e in events], "displayTimeUnit": "ms",
                "otherData": self.metadata()}

    def metadata(self):
        files = []
        for f in self.files:
            files.append({
                "file": f.name, "node": f.node, "process": f.process, "role": f.role,
                "rank": f.rank, "pid": f.pid, "host": f.host, "offset_ns": f.offset_ns,
                "residual_ns": "unknown" if f.residual_ns is None else f.residual_ns,
                "samples": f.samples, "clock_from": f.clock_from, "spans": len(f.spans),
                "dropped": f.dropped, "partial": f.partial,
                "clock_model": "none" if f.clock is None else f.clock.kind,
                "drift_ppm": "unknown" if f.clock is None else f.clock.drift_ppm,
                "clock_ref_ns": None if f.clock is None else f.clock.t_ref,
                "fit_samples": 0 if f.clock is None else f.clock.fit_samples})
        nodes = {}
        for n in self.nodes:
            nodes[n.name] = {
                "pid": n.pid, "files": [f.name for f in n.files],
                "residual_ns": "unknown" if n.residual_ns is None else n.residual_ns,
                "spans": sum(len(f.spans) for f in n.files),
                "dropped": sum(f.dropped for f in n.files),
                "partial": any(f.partial for f in n.files)}
        return {
            "bitpush_trace": FORMAT_VERSION,
            "clock": "the scheduler's (ns); ts are µs from base_ns",
            "base_ns": self.base_ns,
            "max_residual_ns": ("unknown" if self.max_residual_ns is None
                                else self.max_residual_ns),
            "unaligned_files": [f.name for f in self.files if f.residual_ns is None],
            "max_drift_ppm": max((abs(f.drift_ppm) for f in self.files
                                  if f.drift_ppm is not None), default=0),
            "spans": len(self.spans), "dropped": sum(f.dropped for f in self.files),
            "nodes": nodes, "files": files, "warnings": list(self.warnings)}

    def write(self, path):
        """Writes the Chrome trace (one event per line)."""
        chrome = self.to_chrome()
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            out.write('{"displayTimeUnit": "ms",\n"otherData": ')
            json.dump(chrome["otherData"], out, ensure_ascii=False)
            out.write(',\n"traceEvents": [\n')
            ev = chrome["traceEvents"]
            for i, e in enumerate(ev):
                out.write(json.dumps(e, ensure_ascii=False, separators=(",", ":")))
                out.write(",\n" if i + 1 < len(ev) else "\n")
            out.write("]}\n")
        os.replace(tmp, path)


def load(directory):
    """The span files of `directory`, read and aligned: a Trace. Raises TraceError when the
    directory is missing or holds no span file (*.jsonl)."""
    if not os.path.isdir(directory):
        raise TraceError("%s: no such directory (the --timeline DIR of a run)" % directory)
    names = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
    if not names:
        raise TraceError("%s: no span files (*.jsonl) in it: was the run started with "
                         "--timeline %s (or trace.dir)?" % (directory, directory))
    files, warnings = [], []
    for n in names:
        f = SpanFile(os.path.join(directory, n))
        try:
            f.read()
        except OSError as e:
            warnings.append("%s: cannot be read (%s): left out" % (n, e.strerror or e))
            continue
        files.append(f)
    if not files:
        raise TraceError("%s: none of its span files could be read" % directory)
    unaligned = _align(files)
    t = Trace(directory, files, warnings)
    for f in t.files:  # in row order
        t.warnings.extend(f.warnings())
        t.warnings.extend(unaligned.get(f.name, ()))
    return t


def causal_violations(trace, slack_ns=0):
    """[str]: each place where the aligned trace breaks causality or a push goes unanswered
    (an empty list when all is well). `trace`: a Trace, or a span directory to load.

    For every worker `push` (key, round, worker rank w, server s): exactly one `push_received`
    on server s for (key, round, w), not earlier than the push's start; one `reply_sent` for
    it, and the worker's `network` span for (key, round, s) ending no earlier than that reply.
    Every push_received must have its push. "Earlier" allows the two files' residuals
    (+ slack_ns): the alignment's error bound. A file without clock exchanges cannot be
    checked for time: one line says so. Where a counterpart is missing and a file involved is
    partial or dropped spans, the line says that too."""
    if isinstance(trace, str):
        trace = load(trace)
    return _trace_check.causal_violations(trace, slack_ns)


# -- the command line -------------------------------------------------------------------------

def _warn(msg):
    print("bitpush trace: warning: " + msg, file=sys.stderr)


def _merge(args):
    t = load(args.dir)
    for w in t.warnings:
        _warn(w)
    out = args.output or os.path.join(args.dir, "trace.json")
    try:
        t.write(out)
    except OSError as e:
        print("bitpush trace merge: cannot write %s: %s" % (out, e.strerror or e),
              file=sys.stderr)
        return EXIT_FAILED
    drifting = [f for f in t.files if f.clock is not None and f.clock.kind == "linear"]
    print("bitpush trace merge: wrote %s: %d spans of %d files, %d nodes (%s); clocks aligned "
          "to the scheduler's within ±%s%s%s; open it in ui.perfetto.dev or chrome://tracing"
          % (out, len(t.spans), len(t.files), len(t.nodes),
             ", ".join(n.name for n in t.nodes), _fmt_ns(t.max_residual_ns),
             " (%d files unaligned)" % sum(f.residual_ns is None for f in t.files)
             if any(f.residual_ns is None for f in t.files) else "",
             ", drift modelled in %d files (up to %.1f ppm)" % (
                 len(drifting), max(abs(f.drift_ppm) for f in drifting)) if drifting else ""))
    return EXIT_OK


def _parser():
    p = argparse.ArgumentParser(prog="bitpush trace", description="merge the span files of a "
                                "--timeline run into one Chrome trace, or draw one step of "
                                "it (docs/observability.md)")
    sub = p.add_subparsers(dest="cmd", metavar="{merge,plot}")
    sub.required = True
    m = sub.add_parser("merge", help="merge DIR/*.jsonl into one Chrome trace-event JSON "
                       "(Perfetto, chrome://tracing)")
    m.add_argument("dir", metavar="DIR", help="the run's --timeline directory")
    m.add_argument("-o", "--output", metavar="TRACE_JSON",
                   help="where to write it (default DIR/trace.json)")
    pl = sub.add_parser("plot", help="draw one step of a merged trace as a Gantt chart (PNG)")
    pl.add_argument("trace", metavar="TRACE_JSON",
                    help="a trace written by `bitpush trace merge` (or a span directory)")
    pl.add_argument("-o", "--output", metavar="PNG",
                    help="the picture (default: step.png next to the trace)")
    pl.add_argument("--round", type=int, default=None, metavar="R",
                    help="the step to draw (default: the last round in every worker's spans)")
    pl.add_argument("--tensor", default=None, metavar="NAME",
                    help="only this tensor's spans")
    return p


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.cmd == "merge":
            return _merge(args)
        from . import _trace_plot
        try:
            chrome = (load(args.trace).to_chrome() if os.path.isdir(args.trace)
                      else _trace_plot.read(args.trace))
            return _trace_plot.plot_command(args, chrome)
        except _trace_plot.PlotError as e:
            raise TraceError(str(e))
    except TraceError as e:
        print("bitpush trace %s: %s" % (args.cmd, e), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
