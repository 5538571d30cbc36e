"""What `bitpush top` shows of each node, from two successive scrapes (docs/metrics.md names).

    row = node_row(previous_result, current_result)     # a Row; rates None until two scrapes
    totals = cluster_totals(rows)

Rates are counter deltas over the time between the two answers. A rate is None (shown "-")
when either scrape lacks the metric, the node was down in either, or a counter went backwards
(the process restarted: its counters began again at 0). Gauges (RSS, queue depths) are the
current scrape's.

Per role:
  worker     rounds/s = completed push_pulls; goodput = raw (uncompressed) payload bytes pushed
             + pulled; wire = the same payloads as sent (compressed); slowest = the stage
             (compress, network, decompress) with the most stage seconds per second, with its
             share of the three; queue = partitions waiting for credit.
  server     rounds/s = rounds published (summed over keys: a tensor of k partitions counts
             k); goodput / wire = push (in) and reply (out) payloads, raw / as sent; slowest =
             the engine threads' busy time as a percentage of their wall time; queue =
             messages waiting for the engine threads.
  scheduler  no data plane: only the process figures (and, in the totals, its node counts).
  every one  refused/s = messages its endpoint refused (all reasons); RSS; CPU % (100 = one
             core).

Pure functions of their inputs; no state, no I/O.
"""
import math
from typing import List, NamedTuple, Optional

from ._scrape import Result

__all__ = ["Row", "Totals", "node_row", "cluster_totals", "rate"]

_STAGES = ("compress", "network", "decompress")


class Row(NamedTuple):
    label: str                  # "scheduler", "server 0", "worker 1"
    role: str
    up: bool
    error: str                  # why it is down ("" when up)
    rounds_s: Optional[float]
    goodput_bs: Optional[float]  # raw bytes/s
    wire_bs: Optional[float]     # bytes/s as sent
    ratio: Optional[float]       # goodput / wire
    slowest: str                 # "network 91%", "engine 12%", "-"
    queue: Optional[float]
    refused_s: Optional[float]
    rss: Optional[float]         # bytes
    cpu_pct: Optional[float]


class Totals(NamedTuple):
    nodes: int
    up: int
    rounds_s: Optional[float]    # the up workers' mean: each worker takes part in every round
    goodput_bs: Optional[float]  # summed over workers (the servers see the same bytes)
    wire_bs: Optional[float]
    ratio: Optional[float]
    refused_s: Optional[float]   # summed over every node
    rss: Optional[float]
    cpu_pct: Optional[float]
    registered: Optional[float]  # the scheduler's bitpush_scheduler_nodes{state=registered}
    expected: Optional[float]
    dead: Optional[float]


def rate(prev: Optional[Result], cur: Result, name: str, **match: str) -> Optional[float]:
    """(cur - prev) / seconds between them of the sum of `name`'s samples matching `match`;
    None without two answers holding the metric, or when it went backwards (a restart)."""
    if prev is None or prev.scrape is None or cur.scrape is None:
        return None
    dt = cur.time - prev.time
    a, b = prev.scrape.total(name, **match), cur.scrape.total(name, **match)
    if a is None or b is None or dt <= 0 or b < a or math.isinf(a) or math.isinf(b):
        return None
    return (b - a) / dt


def _ratio(raw: Optional[float], wire: Optional[float]) -> Optional[float]:
    if raw is None or not wire:
        return None
    return raw / wire


def _identity_error(cur: Result) -> str:
    """Non-empty when the port answers as another node (another cluster's process, or a
    YAML that does not match the running cluster)."""
    info = cur.scrape.samples("bitpush_node_info")
    if not info:
        return ""
    labels = info[0][0]
    role, rank = labels.get("role", "?"), labels.get("rank")
    t = cur.target
    if role == t.role and (t.rank is None or rank == str(t.rank)):
        return ""
    return "port %d answers as %s" % (t.port, role if rank is None else "%s %s" % (role, rank))


def _worker_slowest(prev: Optional[Result], cur: Result) -> str:
    name = "bitpush_worker_stage_seconds_total"
    stages = cur.scrape.label_values(name, "stage") or list(_STAGES)
    rates = [(rate(prev, cur, name, stage=s), s) for s in stages]
    known = [(r, s) for r, s in rates if r is not None]
    total = sum(r for r, _ in known)
    if not known or total <= 0:
        return "-"
    best, stage = max(known)
    return "%s %d%%" % (stage, round(100.0 * best / total))


def _server_busy(prev: Optional[Result], cur: Result) -> str:
    busy = rate(prev, cur, "bitpush_server_engine_busy_seconds_total")
    if busy is None:
        return "-"
    threads = len(cur.scrape.label_values("bitpush_server_engine_queue_depth", "thread")) or 1
    return "engine %d%%" % round(100.0 * busy / threads)


def down_row(cur: Result, error: str) -> Row:
    return Row(cur.target.label, cur.target.role, False, error, None, None, None, None, "-",
               None, None, None, None)


def node_row(prev: Optional[Result], cur: Result) -> Row:
    """The row of cur's node; prev is the node's previous answer (None on the first)."""
    if cur.scrape is None:
        return down_row(cur, cur.error)
    error = _identity_error(cur)
    if error:
        return down_row(cur, error)
    if prev is not None and prev.scrape is not None and _identity_error(prev):
        prev = None
    s = cur.scrape
    role = cur.target.role
    rounds = raw = wire = queue = None
    slowest = "-"
    if role == "worker":
        rounds = rate(prev, cur, "bitpush_worker_push_pulls_total", result="completed")
        raw = rate(prev, cur, "bitpush_worker_payload_bytes_total", encoding="raw")
        wire = rate(prev, cur, "bitpush_worker_payload_bytes_total", encoding="compressed")
        slowest = _worker_slowest(prev, cur)
        queue = s.total("bitpush_worker_partitions_queued")
    elif role == "server":
        rounds = rate(prev, cur, "bitpush_server_rounds_published_total")
        raw = rate(prev, cur, "bitpush_server_payload_bytes_total", encoding="raw")
        wire = rate(prev, cur, "bitpush_server_payload_bytes_total", encoding="compressed")
        slowest = _server_busy(prev, cur)
        queue = s.total("bitpush_server_engine_queue_depth")
    cpu = rate(prev, cur, "process_cpu_seconds_total")
    return Row(cur.target.label, role, True, "", rounds, raw, wire, _ratio(raw, wire), slowest,
               queue, rate(prev, cur, "bitpush_endpoint_messages_refused_total"),
               s.total("process_resident_memory_bytes"), None if cpu is None else 100.0 * cpu)


def _sum(values) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def cluster_totals(rows: List[Row], scheduler: Optional[Result] = None) -> Totals:
    """The header's figures; `scheduler` is the scheduler's latest answer (its node counts)."""
    up = [r for r in rows if r.up]
    workers = [r for r in up if r.role == "worker"]
    rounds = [r.rounds_s for r in workers if r.rounds_s is not None]
    raw = _sum(r.goodput_bs for r in workers)
    wire = _sum(r.wire_bs for r in workers)
    registered = expected = dead = None
    if scheduler is not None and scheduler.scrape is not None:
        nodes = "bitpush_scheduler_nodes"
        registered = scheduler.scrape.total(nodes, state="registered")
        expected = scheduler.scrape.total(nodes, state="expected")
        dead = scheduler.scrape.total(nodes, state="dead")
    return Totals(len(rows), len(up), sum(rounds) / len(rounds) if rounds else None, raw, wire,
                  _ratio(raw, wire), _sum(r.refused_s for r in up), _sum(r.rss for r in up),
                  _sum(r.cpu_pct for r in up), registered, expected, dead)
