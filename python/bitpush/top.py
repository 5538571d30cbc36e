"""`bitpush top`: a terminal view of a running cluster, from its nodes' metrics endpoints.

    bitpush top --config cluster.yaml [--interval 1.0] [--timeout 0.5] [--once] [--host NAME]

Every --interval seconds it scrapes `GET /metrics` of the scheduler, every server and every
worker node of the YAML (the ports of docs/metrics.md, python/bitpush/_metrics_targets.py), all
at once, each within --timeout, and shows one row per node: up or down (with the reason),
rounds/s, goodput (raw gradient bytes/s pushed + pulled), wire bytes/s (the same payloads as
sent), the compression ratio, the slowest stage (workers) or engine busy % (servers), queue
depth, refused messages/s, RSS and CPU %, under a header of cluster totals. What each figure is
made of: python/bitpush/_top_rows.py.

On a terminal it draws with curses and quits on `q` or Ctrl-C (exit 0), restoring the terminal
(also on SIGTERM: exit 143). Without a terminal it prints the table every interval (batch
mode, for logs). --once prints one table and exits: it scrapes twice, --interval apart, since
rates need two samples; exit 0 when some node answered, 1 when none did. Exit 2: a bad command
line, a YAML that does not load, metrics off (metrics.port 0) or no node on --host.
"""
import argparse
import math
import os
import signal
import sys
import threading
import time

from . import _metrics_targets, _top_rows
from ._scrape import Scraper

__all__ = ["main"]

EXIT_OK = 0
EXIT_NONE_UP = 1
EXIT_USAGE = 2

_PROG = "bitpush top"
# (header, width, right-aligned); columns are separated by two spaces and no cell holds two
# spaces in a row, so a script can split a row on runs of two or more.
_COLUMNS = (("NODE", 10, False), ("STATE", 5, False), ("ROUNDS/S", 8, True),
            ("GOODPUT", 11, True), ("WIRE", 11, True), ("RATIO", 7, True),
            ("SLOWEST", 15, False), ("QUEUE", 5, True), ("REFUSED/S", 9, True),
            ("RSS", 9, True), ("CPU%", 5, True))


class _Terminated(Exception):
    """SIGTERM arrived: leave the way Ctrl-C does, terminal restored."""


# -- formatting ------------------------------------------------------------------------------

def _bytes(v):
    if v is None or not math.isfinite(v):
        return "-"
    if abs(v) < 1024:
        return "%.0f B" % v
    for unit in ("KiB", "MiB", "GiB"):
        v /= 1024.0
        if abs(v) < 1024:
            return "%.1f %s" % (v, unit)
    return "%.1f TiB" % (v / 1024.0)


def _per_s(v):
    return "-" if v is None else _bytes(v) + "/s"


def _num(v):
    if v is None or not math.isfinite(v):
        return "-"
    if abs(v) >= 100 or v == int(v):
        return "%.0f" % v
    return "%.1f" % v if abs(v) >= 1 else "%.2f" % v


def _ratio(v):
    return "-" if v is None else "%.1fx" % v


def _cells(row):
    if not row.up:
        return [row.label, "down (%s)" % row.error]
    return [row.label, "up", _num(row.rounds_s), _per_s(row.goodput_bs), _per_s(row.wire_bs),
            _ratio(row.ratio), row.slowest, "-" if row.queue is None else "%d" % row.queue,
            _num(row.refused_s), _bytes(row.rss),
            "-" if row.cpu_pct is None else "%.0f" % row.cpu_pct]


def _line(cells, node_width):
    out = []
    for i, cell in enumerate(cells):
        if i == len(cells) - 1 and len(cells) < len(_COLUMNS):  # "down (reason)", unpadded
            out.append(cell)
            break
        _, width, right = _COLUMNS[i]
        width = node_width if i == 0 else width
        out.append(cell.rjust(width) if right else cell.ljust(width))
    return "  ".join(out).rstrip()


def _header(totals, title, interval):
    nodes = "nodes %d/%d up" % (totals.up, totals.nodes)
    if totals.expected is not None:
        nodes += " (scheduler: %d/%d registered, %d dead)" % (
            totals.registered or 0, totals.expected, totals.dead or 0)
    return ["bitpush top  %s  every %g s  %s" % (title, interval, time.strftime("%H:%M:%S")),
            "%s  rounds/s %s  goodput %s  wire %s  ratio %s  refused/s %s  RSS %s  CPU %s%%"
            % (nodes, _num(totals.rounds_s), _per_s(totals.goodput_bs), _per_s(totals.wire_bs),
               _ratio(totals.ratio), _num(totals.refused_s), _bytes(totals.rss),
               "-" if totals.cpu_pct is None else "%.0f" % totals.cpu_pct)]


def render(rows, totals, title, interval):
    """The lines of one screen: the header, a blank line, the column names and a row per
    node."""
    node_width = max([_COLUMNS[0][1]] + [len(r.label) for r in rows])
    return (_header(totals, title, interval) + [""]
            + [_line([c[0] for c in _COLUMNS], node_width)]
            + [_line(_cells(r), node_width) for r in rows])


# -- sampling --------------------------------------------------------------------------------

class _View:
    """The latest answer of each node and the rows made from it and the one before."""

    def __init__(self, scraper):
        self.scraper = scraper
        self.previous = [None] * len(scraper.targets)
        self.rows = []
        self.totals = None
        self.any_up = False

    def sample(self):
        results = self.scraper.scrape()
        self.rows = [_top_rows.node_row(p, c) for p, c in zip(self.previous, results)]
        scheduler = next((r for r in results if r.target.role == "scheduler"), None)
        self.totals = _top_rows.cluster_totals(self.rows, scheduler)
        self.previous = [c if c.scrape is not None else None for c in results]
        self.any_up = any(r.up for r in self.rows)


# -- the three ways to show it ---------------------------------------------------------------

def _print_table(view, args, out, before=""):
    out.write(before + "\n".join(render(view.rows, view.totals, args.config, args.interval))
              + "\n")
    out.flush()


def _run_once(view, args):
    view.sample()
    time.sleep(args.interval)
    view.sample()
    _print_table(view, args, sys.stdout)
    return EXIT_OK if view.any_up else EXIT_NONE_UP


def _run_batch(view, args):
    next_at = time.monotonic()
    before = ""
    while True:
        view.sample()
        _print_table(view, args, sys.stdout, before)
        before = "\n"  # a blank line between tables
        next_at = max(next_at + args.interval, time.monotonic())
        time.sleep(next_at - time.monotonic() if next_at > time.monotonic() else 0.0)


_FIXED = 4  # the header's two lines, a blank line and the column names stay put


def _draw(stdscr, curses, view, args, top_row):
    """Draws the screen with the node rows from top_row on; returns top_row clamped to what
    fits (rows beyond the window scroll with the arrow keys)."""
    height, width = stdscr.getmaxyx()
    lines = render(view.rows, view.totals, args.config, args.interval)
    room = max(1, height - _FIXED - 2)  # a blank line and the footer below the rows
    top_row = max(0, min(top_row, len(view.rows) - room))
    shown = view.rows[top_row:top_row + room]
    footer = "q: quit"
    if len(shown) < len(view.rows):
        footer = "nodes %d-%d of %d (up/down, page up/down: scroll)  q: quit" % (
            top_row + 1, top_row + len(shown), len(view.rows))
    screen = [(text, curses.A_REVERSE if y == _FIXED - 1 else curses.A_NORMAL)
              for y, text in enumerate(lines[:_FIXED])]
    screen += [(lines[_FIXED + top_row + i], curses.A_NORMAL if row.up else curses.A_BOLD)
               for i, row in enumerate(shown)]
    screen += [("", curses.A_NORMAL), (footer, curses.A_NORMAL)]
    stdscr.erase()
    for y, (text, attr) in enumerate(screen[:height]):
        try:
            stdscr.addnstr(y, 0, text, max(0, width - 1), attr)
        except curses.error:  # the last cell of a tiny window
            pass
    stdscr.refresh()
    return top_row


def _scroll_step(key, curses, height):
    """How many rows a key scrolls the node rows by (0: not a scrolling key)."""
    page = max(1, height - _FIXED - 2)
    return {curses.KEY_UP: -1, curses.KEY_DOWN: 1, ord("k"): -1, ord("j"): 1,
            curses.KEY_PPAGE: -page, curses.KEY_NPAGE: page, curses.KEY_HOME: -(1 << 30),
            curses.KEY_END: 1 << 30}.get(key, 0)


def _run_curses(view, args):
    import curses

    def loop(stdscr):
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        stdscr.keypad(True)
        stdscr.timeout(100)  # getch waits at most this long (ms)
        next_at = time.monotonic()
        top_row = 0
        while True:
            if time.monotonic() >= next_at:
                view.sample()
                next_at = max(next_at + args.interval, time.monotonic())
                top_row = _draw(stdscr, curses, view, args, top_row)
            key = stdscr.getch()
            if key in (ord("q"), ord("Q")):
                return EXIT_OK
            step = _scroll_step(key, curses, stdscr.getmaxyx()[0])
            if step or key == curses.KEY_RESIZE:
                top_row = _draw(stdscr, curses, view, args, top_row + step)

    return curses.wrapper(loop)  # restores the terminal however loop ends


# -- command line ----------------------------------------------------------------------------

def _parser():
    p = argparse.ArgumentParser(prog=_PROG, description="A terminal view of a running "
                                "cluster's metrics endpoints (docs/metrics.md), refreshed "
                                "every --interval seconds; q or Ctrl-C quits.")
    p.add_argument("--config", required=True, help="the cluster YAML (its metrics.port set)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1.0)")
    p.add_argument("--timeout", type=float, default=0.5, metavar="S",
                   help="the most one node's scrape may take before it shows as down "
                   "(default 0.5; never more than --interval)")
    p.add_argument("--once", action="store_true",
                   help="print one table (two scrapes, --interval apart) and exit")
    p.add_argument("--host", action="append", metavar="NAME",
                   help="show only the nodes whose metrics listen on this host, as the YAML "
                   "names it (repeatable)")
    return p


def _fail(text):
    print("%s: %s" % (_PROG, text), file=sys.stderr)
    return EXIT_USAGE


def _targets(args):
    """The endpoints to scrape, or an error text."""
    try:
        from . import _C
        config = _C.load_cluster_config(args.config)
    except ImportError as e:
        return None, "the bitpush extension is not importable: %s" % e
    except RuntimeError as e:  # BitpushError: the parser's message names the file and key
        return None, str(e)
    targets = _metrics_targets.targets(config)
    if not targets:
        return None, ("%s: metrics are off (metrics.port is 0 or unset); set metrics.port in "
                      "its metrics: section and start the cluster with it (docs/metrics.md)"
                      % args.config)
    if args.host:
        kept = [t for t in targets if t.host in args.host]
        if not kept:
            hosts = sorted(set(t.host for t in targets))
            return None, "no node of %s is on host %s (its hosts: %s)" % (
                args.config, ", ".join(args.host), ", ".join(hosts))
        targets = kept
    return targets, ""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help 0
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not (0 < args.interval < 86400 and 0 < args.timeout < 86400):
        return _fail("--interval and --timeout must be more than 0 (and less than a day)")
    if not os.path.isfile(args.config):
        return _fail("%s: no such file" % args.config)
    targets, error = _targets(args)
    if error:
        return _fail(error)

    def on_term(signum, frame):
        raise _Terminated()

    main_thread = threading.current_thread() is threading.main_thread()
    previous_term = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    scraper = Scraper(targets, timeout_s=min(args.timeout, args.interval))
    view = _View(scraper)
    try:
        if args.once:
            return _run_once(view, args)
        if sys.stdout.isatty() and sys.stdin.isatty() and os.environ.get("TERM", "dumb") != "dumb":
            return _run_curses(view, args)
        return _run_batch(view, args)
    except KeyboardInterrupt:
        return EXIT_OK
    except _Terminated:
        return 128 + signal.SIGTERM
    except BrokenPipeError:  # `bitpush top ... | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    finally:
        scraper.close()
        if main_thread:
            signal.signal(signal.SIGTERM, previous_term)


if __name__ == "__main__":
    sys.exit(main())
