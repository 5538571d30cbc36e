"""`bitpush trace plot`: one step of a merged trace as a Gantt chart (docs/observability.md,
"A step without a browser").

One group of rows per node (in the trace's row order: workers, then servers), one row per
thread row of the trace, a bar per span colored by its name, zero-length spans (push_received,
reply_sent) as ticks; x in ms from the step's first span. matplotlib with the Agg backend
(Debian's python3-matplotlib); imported only here, so `bitpush trace merge` never loads it.
"""
import json
import os



class PlotError(Exception):
    """Why no picture was drawn (bitpush.trace prints it and exits 2)."""

# Span names in the order of docs/observability.md: fixed colors, the same in every picture.
_KNOWN = ("declare", "compress", "push", "network", "decompress", "optimizer", "local_reduce",
          "push_received", "queued", "sum", "reply_sent")
_PALETTE = ("#9e9e9e", "#1f77b4", "#ff7f0e", "#aec7e8", "#2ca02c", "#d62728", "#9467bd",
            "#000000", "#c7c7c7", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
            "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2")


def read(path):
    """The Chrome trace dict of the trace JSON `path`."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except OSError as e:
        raise PlotError("%s: cannot be read (%s)" % (path, e.strerror or e))
    except ValueError as e:
        raise PlotError("%s is not a trace: not JSON (%s)" % (path, str(e)[:80]))
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise PlotError("%s is not a trace: no traceEvents (write one with `bitpush trace "
                         "merge DIR -o %s`)" % (path, path))
    return data


class _Step:
    """The spans of one round, and the rows they are drawn in."""

    def __init__(self, chrome, path, round_, tensor):
        pnames, psort, tnames, tsort = {}, {}, {}, {}
        spans = []
        for e in chrome["traceEvents"]:
            if not isinstance(e, dict):
                continue
            ph, args = e.get("ph"), e.get("args") if isinstance(e.get("args"), dict) else {}
            if ph == "M":
                pid, tid, name = e.get("pid"), e.get("tid"), e.get("name")
                if name == "process_name":
                    pnames[pid] = args.get("name", str(pid))
                elif name == "process_sort_index":
                    psort[pid] = args.get("sort_index", 0)
                elif name == "thread_name":
                    tnames[(pid, tid)] = args.get("name", str(tid))
                elif name == "thread_sort_index":
                    tsort[(pid, tid)] = args.get("sort_index", 0)
            elif ph == "X" and isinstance(e.get("ts"), (int, float)):
                spans.append(e)
        if not spans:
            raise PlotError("%s holds no spans" % path)
        if tensor is not None:
            tensors = sorted({e["args"]["tensor"] for e in spans
                              if isinstance(e.get("args"), dict) and "tensor" in e["args"]})
            spans = [e for e in spans if _arg(e, "tensor") == tensor]
            if not spans:
                raise PlotError("%s: no spans of tensor %r (its tensors: %s)"
                                 % (path, tensor, ", ".join(tensors) or "none named"))
        rounds = sorted({_arg(e, "round") for e in spans if _arg(e, "round") is not None})
        if not rounds:
            raise PlotError("%s: no span has a round" % path)
        self.why = "asked for"
        if round_ is None:
            per_worker = {}
            for e in spans:
                if e.get("cat") == "worker" and _arg(e, "round") is not None:
                    per_worker.setdefault(e.get("pid"), set()).add(_arg(e, "round"))
            common = set.intersection(*per_worker.values()) if per_worker else set()
            if common:
                round_, self.why = max(common), "the last round in every worker's spans"
            else:
                round_, self.why = rounds[-1], "the last round of any span (no round is in " \
                                               "every worker's spans)"
        chosen = [e for e in spans if _arg(e, "round") == round_]
        if not chosen:
            raise PlotError("%s: round %d has no spans%s (rounds present: %s)" % (
                path, round_, " of tensor %r" % tensor if tensor else "", _ranges(rounds)))
        t0 = min(e["ts"] for e in chosen)
        t1 = max(e["ts"] + e.get("dur", 0) for e in chosen)
        # Spans without a round (a worker's optimizer step, declarations) inside the step.
        chosen += [e for e in spans if _arg(e, "round") is None and e["ts"] < t1
                   and e["ts"] + e.get("dur", 0) > t0]
        self.round, self.t0, self.spans = round_, t0, chosen
        rows = sorted({(e.get("pid"), e.get("tid")) for e in chosen},
                      key=lambda r: (psort.get(r[0], 0), r[0], tsort.get(r, 0), r[1]))
        self.groups = []  # [(node name, [(row, thread name)])]
        for pid, tid in rows:
            if not self.groups or self.groups[-1][2] != pid:
                self.groups.append((pnames.get(pid, "pid %s" % pid), [], pid))
            self.groups[-1][1].append(((pid, tid), tnames.get((pid, tid), "tid %s" % tid)))
        meta = chrome.get("otherData") if isinstance(chrome.get("otherData"), dict) else {}
        self.residual = meta.get("max_residual_ns")


def _arg(e, k):
    a = e.get("args")
    return a.get(k) if isinstance(a, dict) else None


def _ranges(xs):
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else "%d-%d" % (start, x))
            start = None
    return ", ".join(out)


def _colors(names):
    order = [n for n in _KNOWN if n in names] + sorted(n for n in names if n not in _KNOWN)
    colors = {}
    for n in order:
        i = _KNOWN.index(n) if n in _KNOWN else len(_KNOWN) + len(colors)
        colors[n] = _PALETTE[i % len(_PALETTE)]
    return order, colors


def draw(step, out, title_extra=""):
    """Writes the Gantt chart of `step` (a _Step) to `out` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # Rows top to bottom: a header row per node (its name, bold), then its threads.
    y, labels, bold, ypos = 0, [], [], {}
    for node, rows, _ in step.groups:
        labels.append(node)
        bold.append(True)
        y += 1
        for row, name in rows:
            ypos[row] = y
            labels.append(name)
            bold.append(False)
            y += 1
    names = {e.get("name", "?") for e in step.spans}
    order, colors = _colors(names)
    fig_h = min(2.0 + 0.24 * len(labels), 40)
    fig, ax = plt.subplots(figsize=(11, fig_h), dpi=90)
    # A span inside another of its row (a push inside its network span) is drawn thinner,
    # over it: depth = how many spans of the row enclose it.
    by_row = {}
    for e in step.spans:
        by_row.setdefault(ypos[(e.get("pid"), e.get("tid"))], []).append(e)
    ticks, bars = {}, {}  # name -> [(row, start)], (name, depth) -> {row: [(start, dur)]}
    for row, spans in by_row.items():
        open_ends = []
        for e in sorted(spans, key=lambda e: (e["ts"], -e.get("dur", 0))):
            start, dur = e["ts"], e.get("dur", 0)
            while open_ends and open_ends[-1] <= start and not (dur == 0 and
                                                                 open_ends[-1] == start):
                open_ends.pop()
            name = e.get("name", "?")
            x = (start - step.t0) / 1000.0
            if dur > 0:
                depth = min(len(open_ends), 2)
                bars.setdefault((name, depth), {}).setdefault(row, []).append(
                    (x, dur / 1000.0))
                open_ends.append(start + dur)
            else:
                ticks.setdefault(name, []).append((row, x))
    heights = (0.76, 0.46, 0.26)
    for (name, depth) in sorted(bars, key=lambda k: (k[1], order.index(k[0]))):
        h = heights[depth]
        for row, xs in bars[(name, depth)].items():
            ax.broken_barh(xs, (row - h / 2, h), facecolors=colors[name], edgecolor="none",
                           zorder=2 + depth)
    for name, pts in ticks.items():
        ax.scatter([x for _, x in pts], [r for r, _ in pts], marker="|", s=120,
                   linewidths=1.2, color=colors[name], zorder=6)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    for lbl, b in zip(ax.get_yticklabels(), bold):
        if b:
            lbl.set_fontweight("bold")
    for i, b in enumerate(bold):
        if b and i:
            ax.axhline(i - 0.5, color="#cccccc", linewidth=0.8)
    ax.set_xlim(left=0)
    ax.set_xlabel("ms from the step's first span")
    ax.grid(axis="x", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    title = "round %d%s" % (step.round, title_extra)
    if step.residual is not None:
        title += " — clocks aligned within ±%s" % (
            "%.1f µs" % (step.residual / 1000) if isinstance(step.residual, (int, float))
            else step.residual)
    ax.set_title(title, fontsize=10)
    handles = []
    for name in order:
        if any(n == name for n, _ in bars):
            handles.append(Patch(facecolor=colors[name], label=name))
        else:
            handles.append(Line2D([], [], color=colors[name], marker="|", linestyle="none",
                                  markersize=10, label=name))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot_command(args, chrome):
    """`bitpush trace plot` on `chrome` (the trace of args.trace, read); the exit status."""
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotError("needs matplotlib (apt install python3-matplotlib, for "
                        "/usr/bin/python3)")
    step = _Step(chrome, args.trace, args.round, args.tensor)
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(args.trace))
                                      if not os.path.isdir(args.trace) else args.trace,
                                      "step.png")
    extra = ", tensor %s" % args.tensor if args.tensor else ""
    try:
        draw(step, out, extra)
    except OSError as e:
        raise PlotError("cannot write %s: %s" % (out, e.strerror or e))
    print("bitpush trace plot: drew round %d (%s)%s: %d spans on %d rows of %d nodes -> %s"
          % (step.round, step.why, extra, len(step.spans),
             sum(len(r) for _, r, _ in step.groups), len(step.groups), out))
    return 0
