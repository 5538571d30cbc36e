"""Which spans of a merged trace answer which (bitpush/trace.py): a worker's `push` and the
server's `push_received`, the server's `reply_sent` and the end of the worker's `network` span,
for the flow arrows of the Chrome trace and for bitpush.trace.causal_violations.

Spans are matched on (key, round, worker rank, server rank): the worker rank is the rank of the
worker file's process record, the server rank the server file's; a worker span's `server` and
a server span's `worker` field name the other side. Works on a bitpush.trace.Trace (its spans
carry `at`, the time on the scheduler's clock, and their file's residual).
"""


def fmt_ns(ns):
    """A duration in ns for people: '50.0 µs', '1.985 ms'; None: 'unknown'."""
    if ns is None:
        return "unknown"
    if abs(ns) >= 1e6:
        return "%.3f ms" % (ns / 1e6)
    return "%.1f µs" % (ns / 1e3)


def _worker_rank(f):
    return f.rank if f.role != "server" else None


def _server_rank(f):
    return f.rank if f.role == "server" else None


def _index(trace):
    """The spans that flows and the causal check match: {span name: {(key, round, worker rank,
    server rank): [spans in time order]}}; the server rank is None where a worker span names
    none. Also, under (name, 3): the same grouped by (key, round, worker rank) alone."""
    idx = {"push": {}, "network": {}, "push_received": {}, "reply_sent": {}}
    for s in trace.spans:
        g = idx.get(s.name)
        if g is None or s.key is None or s.round is None:
            continue
        if s.file.role == "server":
            if s.name not in ("push_received", "reply_sent") or s.worker is None:
                continue
            k = (s.key, s.round, s.worker, _server_rank(s.file))
        else:
            if s.name not in ("push", "network") or _worker_rank(s.file) is None:
                continue
            k = (s.key, s.round, _worker_rank(s.file), s.server)
        g.setdefault(k, []).append(s)
    for name in list(idx):
        by3 = {}
        for k, spans in idx[name].items():
            by3.setdefault(k[:3], []).extend(spans)
        idx[(name, 3)] = {k: sorted(v, key=lambda s: s.at) for k, v in by3.items()}
    return idx


def _counterparts(idx, name, k):
    """The `name` spans for k = (key, round, worker, server); server None: of any server. A
    worker span without a server matches any."""
    if k[3] is None:
        return idx[(name, 3)].get(k[:3], [])
    return idx[name].get(k) or idx[name].get(k[:3] + (None,), [])


def flow_pairs(trace):
    """(flow name, source span, destination span, destination time) for the arrows: each
    push to its push_received, each reply_sent to the end of its network span."""
    idx = _index(trace)
    out = []
    for k, pushes in idx["push"].items():
        for p, r in zip(pushes, _counterparts(idx, "push_received", k)):
            out.append(("push", p, r, r.at))
    for k, replies in idx["reply_sent"].items():
        for r, n in zip(replies, _counterparts(idx, "network", k)):
            out.append(("reply", r, n, n.end - min(n.dur, 1)))  # just inside its end
    return out


def causal_violations(trace, slack_ns=0):
    """bitpush.trace.causal_violations on a Trace."""
    idx = _index(trace)
    out = []
    unchecked = set()

    def tol(a, b):
        if a.file.residual_ns is None or b.file.residual_ns is None:
            unchecked.update(f for f in (a.file, b.file) if f.residual_ns is None)
            return None
        return a.file.residual_ns + b.file.residual_ns + slack_ns

    def ms(at):
        return "%.3f ms" % ((at - trace.base_ns) / 1e6)

    def what(s):
        t = trace.tensor_of(s)
        return "key %d%s round %d" % (s.key, " (%s partition %d)" % t if t else "", s.round)

    def gaps(*files):
        notes = ["%s dropped %d spans" % (f.label, f.dropped) for f in files if f.dropped]
        notes += ["%s is partial" % f.label for f in files if f.partial]
        return " [%s: the match may be among what is missing]" % "; ".join(notes) if notes \
            else ""

    server_files = [f for f in trace.files if f.role == "server"]
    for k, pushes in sorted(idx["push"].items(), key=lambda kv: kv[1][0].at):
        key, rnd, w, srv = k
        p0 = pushes[0]
        dest = "server %s" % srv if srv is not None else "a server"
        maybe = [f for f in server_files if srv is None or f.rank == srv]
        head = "worker %d push %s to %s at %s" % (w, what(p0), dest, ms(p0.at))
        if len(pushes) > 1:
            out.append("%s: pushed %d times" % (head, len(pushes)))
        recvs = _counterparts(idx, "push_received", k)
        if len(recvs) != len(pushes):
            out.append("%s: %d push_received on %s, expected %d%s" % (
                head, len(recvs), dest, len(pushes), gaps(p0.file, *maybe)))
        for p, r in zip(pushes, recvs):
            t = tol(p, r)
            if t is not None and r.at < p.at - t:
                out.append("worker %d push %s at %s: %s received it at %s, %s before it was "
                           "pushed (tolerance %s)" % (w, what(p), ms(p.at), r.file.node,
                                                      ms(r.at), fmt_ns(p.at - r.at),
                                                      fmt_ns(t)))
        replies = _counterparts(idx, "reply_sent", k)
        if len(replies) != len(pushes):
            out.append("%s: %d reply_sent for it on %s, expected %d%s" % (
                head, len(replies), dest, len(pushes), gaps(*maybe)))
        for r in replies[:len(pushes)]:
            nets = _counterparts(idx, "network", (key, rnd, w, _server_rank(r.file)))
            if not nets:
                out.append("worker %d %s: %s sent a reply at %s, and the worker has no network "
                           "span for it%s" % (w, what(r), r.file.node, ms(r.at),
                                              gaps(p0.file)))
                continue
            n = nets[0] if len(nets) == 1 else min(nets, key=lambda n: abs(n.end - r.at))
            t = tol(n, r)
            if t is not None and n.end < r.at - t:
                out.append("worker %d %s: the reply arrived (network ends) at %s, %s before %s "
                           "sent it at %s (tolerance %s)" % (
                               w, what(r), ms(n.end), fmt_ns(r.at - n.end), r.file.node,
                               ms(r.at), fmt_ns(t)))
    for k, recvs in sorted(idx["push_received"].items(), key=lambda kv: kv[1][0].at):
        key, rnd, w, srv = k
        if not idx["push"].get(k) and not idx["push"].get((key, rnd, w, None)):
            r = recvs[0]
            workers = [f for f in trace.files if _worker_rank(f) == w]
            out.append("%s push_received %s from worker %d at %s: worker %d has no such "
                       "push%s" % (r.file.node, what(r), w, ms(r.at), w, gaps(*workers)))
    for f in sorted(unchecked, key=lambda f: f.name):
        out.append("%s: no clock exchange with the scheduler, so its spans' times were not "
                   "checked" % f.label)
    return out
