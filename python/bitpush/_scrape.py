"""One round of `GET /metrics` to every endpoint of a cluster, bounded in time (`bitpush top`).

    scraper = Scraper(targets, timeout_s=0.5)
    results = scraper.scrape()        # [Result] in the targets' order, within ~timeout_s
    scraper.close()

Each endpoint is fetched on a thread of a small pool, all at once, with one deadline for the
whole exchange (connect, request, every read): a node that does not answer, answers slowly or
sends too much is reported down with the reason ("connection refused", "timed out after
0.5 s", "HTTP 404", "malformed metrics: line 3: ...") instead of holding up the others. The
HTTP is the little the exporter speaks (docs/metrics.md): an HTTP/1.0 GET, the body read to
the end of the connection (or its Content-Length; chunked bodies are decoded too).

Thread-safety: a Scraper is used by one thread at a time; scrape() itself runs the fetches on
the pool's threads, which share nothing.
"""
import concurrent.futures
import errno
import socket
import time
from typing import List, NamedTuple, Optional

from . import _prom
from ._metrics_targets import Target

__all__ = ["Result", "Scraper", "fetch"]

_MAX_BYTES = 8 << 20  # an exposition of ours is a few KiB; anything this big is not ours
_MAX_THREADS = 32


class Result(NamedTuple):
    target: Target
    time: float                    # time.monotonic() when the answer was complete
    scrape: Optional[_prom.Scrape]  # None when down
    error: str                     # why it is down ("" when up)


def _reason(e: BaseException, timeout_s: float) -> str:
    if isinstance(e, socket.timeout):
        return "timed out after %g s" % timeout_s
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, ConnectionResetError):
        return "connection reset"
    if isinstance(e, socket.gaierror):
        return "cannot resolve host: %s" % (e.strerror or e)
    if isinstance(e, OSError) and e.errno is not None:
        return (e.strerror or errno.errorcode.get(e.errno, str(e))).lower()
    return str(e) or type(e).__name__


def _decode_chunked(body: bytes) -> Optional[bytes]:
    """The body of a chunked transfer, or None while its last chunk has not arrived; raises
    ValueError on a malformed one."""
    out, i = [], 0
    while True:
        end = body.find(b"\r\n", i)
        if end < 0:
            return None
        try:
            size = int(body[i:end].split(b";")[0], 16)
        except ValueError:
            raise ValueError("malformed chunked body") from None
        if size == 0:
            return b"".join(out)
        if len(body) < end + 2 + size + 2:
            return None
        out.append(body[end + 2:end + 2 + size])
        i = end + 2 + size + 2


def fetch(target: Target, timeout_s: float) -> str:
    """The body of GET target.url, all of it within timeout_s; raises OSError (socket.timeout
    when the deadline passed) or ValueError (not a 200 with a body we can read)."""
    deadline = time.monotonic() + timeout_s
    host = "[%s]" % target.host if ":" in target.host else target.host
    with socket.create_connection((target.host, target.port), timeout=timeout_s) as s:
        request = ("GET /metrics HTTP/1.0\r\nHost: %s:%d\r\nUser-Agent: bitpush-top\r\n"
                   "Accept: text/plain\r\nConnection: close\r\n\r\n" % (host, target.port))
        s.settimeout(max(0.001, deadline - time.monotonic()))
        s.sendall(request.encode("ascii"))
        data = bytearray()
        header_end = length = None
        chunked = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            s.settimeout(left)
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > _MAX_BYTES:
                raise ValueError("answer larger than %d MiB" % (_MAX_BYTES >> 20))
            if header_end is None:
                header_end = data.find(b"\r\n\r\n")
                if header_end < 0:
                    header_end = None
                else:
                    length, chunked = _framing(bytes(data[:header_end]))
            if length is not None and len(data) >= header_end + 4 + length:
                break
            if chunked and _decode_chunked(bytes(data[header_end + 4:])) is not None:
                break
    if header_end is None:
        raise ValueError("no HTTP answer" if not data else "truncated HTTP answer")
    head = bytes(data[:header_end]).decode("latin-1").split("\r\n")
    status = head[0].split(None, 2)
    if len(status) < 2 or not status[0].startswith("HTTP/"):
        raise ValueError("not an HTTP answer")
    if status[1] != "200":
        raise ValueError("HTTP %s" % " ".join(status[1:]))
    body = bytes(data[header_end + 4:])
    if length is not None:
        body = body[:length]
    elif chunked:
        body = _decode_chunked(body)
        if body is None:
            raise ValueError("truncated chunked body")
    return body.decode("utf-8", "replace")


def _framing(head: bytes):
    """(Content-Length or None, whether the body is chunked) of a response's head."""
    length, chunked = None, False
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length" and value.isdigit():
            length = int(value)
        elif name == "transfer-encoding" and value == "chunked":
            chunked = True
    return (None if chunked else length), chunked


def _scrape_one(target: Target, timeout_s: float) -> Result:
    try:
        text = fetch(target, timeout_s)
    except (OSError, ValueError) as e:
        return Result(target, time.monotonic(), None, _reason(e, timeout_s))
    now = time.monotonic()
    try:
        return Result(target, now, _prom.parse(text), "")
    except ValueError as e:
        return Result(target, now, None, "malformed metrics: %s" % e)


class Scraper:
    """Scrapes a fixed list of endpoints, all in parallel, each within timeout_s."""

    def __init__(self, targets: List[Target], timeout_s: float = 0.5):
        self.targets = list(targets)
        self.timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, min(_MAX_THREADS, len(self.targets))),
            thread_name_prefix="bitpush-top-scrape")
        self._busy = {}  # target index -> its latest fetch (a Future)

    def scrape(self) -> List[Result]:
        """A Result per target, in order, within about timeout_s (each fetch bounds its own
        time; with more endpoints than threads, ceil(n / 32) times that). A fetch that overran
        even so (a host name whose lookup hangs: the resolver is not bounded by our deadline)
        is reported timed out, and its target is not fetched again until it has ended."""
        batches = -(-len(self.targets) // _MAX_THREADS) if self.targets else 1
        deadline = time.monotonic() + batches * self.timeout_s + 0.25
        fresh = set()  # the targets fetched in this round
        for i, t in enumerate(self.targets):
            busy = self._busy.get(i)
            if busy is None or busy.done():
                self._busy[i] = self._pool.submit(_scrape_one, t, self.timeout_s)
                fresh.add(i)
        concurrent.futures.wait([self._busy[i] for i in fresh],
                                timeout=max(0.0, deadline - time.monotonic()))
        out = []
        for i, t in enumerate(self.targets):
            f = self._busy[i]
            if i in fresh and f.done():
                out.append(f.result())
            else:
                out.append(Result(t, time.monotonic(), None,
                                  "timed out after %g s" % self.timeout_s))
        return out

    def close(self):
        self._pool.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
