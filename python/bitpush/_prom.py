"""Prometheus text exposition format 0.0.4, the reading side: what `bitpush top` makes of one
`GET /metrics` answer (docs/metrics.md).

    scrape = parse(text)                       # ValueError naming the line on a malformed one
    scrape.total("bitpush_worker_payload_bytes_total", encoding="raw")   # summed over the rest
    scrape.samples("bitpush_server_engine_queue_depth")                  # [(labels, value)]

Handles what an exposition may hold: `# HELP` / `# TYPE` and other comments (skipped), blank
lines, label sets with the escapes `\\\\`, `\\"` and `\\n` in their values (and a trailing comma),
the values NaN, +Inf, -Inf and any float, and an optional timestamp after the value (ignored).
A sample's name is kept as written (a summary's `_sum` / `_count` are names of their own).

A Scrape is immutable once parsed; share it between threads freely.
"""
import math
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["Scrape", "parse"]

Labels = Tuple[Tuple[str, str], ...]  # sorted (name, value) pairs

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SPECIAL = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


class Scrape:
    """The samples of one exposition: {metric name: [(labels, value)]}, in the order read."""

    def __init__(self, families: Dict[str, List[Tuple[Labels, float]]]):
        self._families = families

    def names(self) -> List[str]:
        return list(self._families)

    def samples(self, name: str) -> List[Tuple[Dict[str, str], float]]:
        """Every sample of `name` as (labels dict, value); [] when the metric is absent."""
        return [(dict(labels), v) for labels, v in self._families.get(name, ())]

    def has(self, name: str) -> bool:
        return name in self._families

    def total(self, name: str, **match: str) -> Optional[float]:
        """The sum of `name`'s samples whose labels include every `match` pair (NaN samples
        skipped); None when no sample matches (the metric is not exported here)."""
        found = None
        for labels, v in self._families.get(name, ()):
            if match and any(dict(labels).get(k) != want for k, want in match.items()):
                continue
            if math.isnan(v):
                continue
            found = v if found is None else found + v
        return found

    def label_values(self, name: str, label: str) -> List[str]:
        """The distinct values of `label` among `name`'s samples, in the order first seen."""
        out = []
        for labels, _ in self._families.get(name, ()):
            value = dict(labels).get(label)
            if value is not None and value not in out:
                out.append(value)
        return out


def _parse_value(text: str) -> float:
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    return float(text)  # ValueError on anything else ("1e3", "-0.5" and "17" are fine)


def _parse_labels(line: str, i: int) -> Tuple[Labels, int]:
    """The label set starting at line[i] == '{'; returns it and the index after '}'."""
    labels = []
    i += 1
    n = len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == "}":
            return tuple(sorted(labels)), i + 1
        m = _LABEL_NAME.match(line, i)
        if not m:
            raise ValueError("expected a label name at column %d" % (i + 1))
        name = m.group(0)
        i = m.end()
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != "=":
            raise ValueError("expected '=' after label %r" % name)
        i += 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise ValueError("expected '\"' to open the value of label %r" % name)
        i += 1
        value = []
        while True:
            if i >= n:
                raise ValueError("unterminated value of label %r" % name)
            c = line[i]
            if c == "\\":
                if i + 1 >= n:
                    raise ValueError("unterminated escape in label %r" % name)
                nxt = line[i + 1]
                value.append(_UNESCAPE.get(nxt, "\\" + nxt))  # unknown escapes kept as written
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                value.append(c)
                i += 1
        labels.append((name, "".join(value)))
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == ",":
            i += 1
        elif i < n and line[i] != "}":
            raise ValueError("expected ',' or '}' after label %r" % name)


def _parse_sample(line: str) -> Tuple[str, Labels, float]:
    m = _NAME.match(line)
    if not m:
        raise ValueError("expected a metric name")
    name, i = m.group(0), m.end()
    labels: Labels = ()
    j = i
    while j < len(line) and line[j] in " \t":
        j += 1
    if j < len(line) and line[j] == "{":
        i = j
        labels, i = _parse_labels(line, i)
    rest = line[i:].split()
    if not rest or len(rest) > 2 or (i < len(line) and line[i] not in " \t"):
        raise ValueError("expected a value (and an optional timestamp) after %s" % name)
    try:
        value = _parse_value(rest[0])
        if len(rest) == 2:
            int(rest[1])  # a timestamp in ms: must be an integer, else ignored
    except ValueError:
        raise ValueError("bad value %r of %s" % (" ".join(rest), name)) from None
    return name, labels, value


def parse(text: str) -> Scrape:
    """The samples of an exposition. Raises ValueError("line N: ...") on a malformed line."""
    families: Dict[str, List[Tuple[Labels, float]]] = {}
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, labels, value = _parse_sample(line)
        except ValueError as e:
            raise ValueError("line %d: %s" % (number, e)) from None
        families.setdefault(name, []).append((labels, value))
    return Scrape(families)
