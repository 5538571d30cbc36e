"""A span file's clock against the scheduler's (bitpush/trace.py, docs/observability.md
"Merging and reading a trace", Clocks): a model fitted to the file's heartbeat exchanges.

Each `clock` record (t0, t3 on the file's clock, t1, t2 on the scheduler's) is one sample of
the offset (scheduler time - local time) at the local time (t0 + t3) / 2:

    offset = ((t1 - t0) + (t2 - t3)) / 2,    round trip = (t3 - t0) - (t2 - t1)

and the true offset there is within ± half the round trip of it. Kept doubled (offset2,
x2 = t0 + t3) so that everything is an integer.

The model: offset(t) = a + b (t - t_ref), t the file's local time (ns).
  - The valid exchanges (round trip >= 0) are cut into windows of equal local time (at most
    MAX_WINDOWS, none shorter than MIN_WINDOW_NS); each window's exchange with the smallest
    round trip is its sample (the others waited in a queue somewhere: their offsets are off
    by up to half their round trip). A sample whose round trip exceeds OUTLIER_RTT times the
    median of the samples' (+ RTT_FLOOR_NS) is left out: a window where every exchange was
    slow says little.
  - A least-squares line through the samples' offsets, each weighted 1 / (round trip +
    RTT_FLOOR_NS)^2 (a sample's error is within ± half its round trip), computed exactly
    (fractions), then held as 48-bit fixed point: an aligned time is the span's local time
    plus the line's offset there, rounded to the half ns (an int, or x.5).
  - Residual: the largest |sample offset - line| + half that sample's round trip over the
    samples, rounded up to the half ns. Where the drift is constant the error of the line is
    linear in time, so it is within that bound everywhere between the first and last sample.
  - Constant model, as with no drift (the exchange with the smallest round trip of all; half
    of that is the residual), when there are fewer than 2 samples or they span less than
    MIN_SPAN_NS, and, with a warning, when the line's drift exceeds MAX_DRIFT_PPM (no steady
    clock drifts that much: the exchanges are wrong).
drift_ppm: how much faster (> 0) or slower the file's clock runs than the scheduler's,
-b / (1 + b) in parts per million.
"""
import math
from fractions import Fraction

MAX_WINDOWS = 32
MIN_WINDOW_NS = 2 * 10 ** 9     # a window holds about 2 heartbeats or more (default 1 s apart)
MIN_SPAN_NS = 5 * 10 ** 9       # samples closer together than this: the constant model
MAX_DRIFT_PPM = 500
OUTLIER_RTT = 4
RTT_FLOOR_NS = 1000
_SHIFT = 48                     # fixed-point bits of the line (2^-48 x 10^13 ns << 1 ns)
_ROUND = 1 << (_SHIFT - 1)


def half(x):
    """x / 2, an int when it is one (offsets and residuals stay exact)."""
    return x // 2 if x % 2 == 0 else x / 2


def _exchanges(clocks):
    """[(x2, offset2, round trip)] of the valid exchanges, in file order."""
    out = []
    for t0, t1, t2, t3 in clocks:
        rtt = (t3 - t0) - (t2 - t1)
        if rtt >= 0:  # else not a possible exchange (a clock stepped, or a bad record)
            out.append((t0 + t3, (t1 - t0) + (t2 - t3), rtt))
    return out


def best_exchange(clocks):
    """(offset2, round trip) of the exchange with the smallest round trip (the first of
    equals), or None."""
    best = None
    for _, offset2, rtt in _exchanges(clocks):
        if best is None or rtt < best[1]:
            best = (offset2, rtt)
    return best


def _samples(ex):
    """The exchanges the line goes through: each window's best, less the outliers."""
    lo, hi = min(e[0] for e in ex), max(e[0] for e in ex)
    width2 = max(-(-(hi - lo) // MAX_WINDOWS), 2 * MIN_WINDOW_NS)  # doubled, like x2
    best = {}
    for e in ex:
        w = min((e[0] - lo) // width2, MAX_WINDOWS - 1)  # hi itself: the last window
        if w not in best or e[2] < best[w][2]:
            best[w] = e
    picked = [best[w] for w in sorted(best)]
    rtts = sorted(e[2] for e in picked)
    median = Fraction(rtts[(len(rtts) - 1) // 2] + rtts[len(rtts) // 2], 2)
    return [e for e in picked if e[2] <= OUTLIER_RTT * median + RTT_FLOOR_NS]


class ClockModel:
    """How one file's local times map to the scheduler's.

    kind:        "constant" (offset2 everywhere) or "linear"
    offset2:     2 x the offset (ns) at t_ref (the constant one's: everywhere)
    t_ref:       the local time (ns) where offset2 holds (None: constant)
    residual_ns: the error bound of an aligned time (int, or x.5)
    drift_ppm:   the drift applied (0 for the constant model)
    fit_samples: the exchanges the model rests on
    """

    def __init__(self, offset2, rtt):
        self.kind = "constant"
        self.offset2 = offset2
        self.t_ref = None
        self.residual_ns = half(rtt)
        self.drift_ppm = 0
        self.fit_samples = 1
        self._a = self._s = 0

    @classmethod
    def linear(cls, t_ref, a2, slope2, residual2, samples):
        """offset2(t) = a2 + slope2 (t - t_ref), a2 and slope2 Fractions."""
        m = cls(0, 0)
        m.kind, m.t_ref, m.fit_samples = "linear", t_ref, samples
        m._a = round(a2 * (1 << _SHIFT))
        m._s = round(slope2 * (1 << _SHIFT))
        m.offset2 = m.offset2_at(t_ref)
        m.residual_ns = half(residual2)
        b = Fraction(m._s, 1 << (_SHIFT + 1))
        m.drift_ppm = round(float(-b / (1 + b) * 10 ** 6), 3)
        return m

    def offset2_at(self, t):
        """2 x the offset (ns) at local time t (an int), rounded to an int."""
        if self.kind == "constant":
            return self.offset2
        return (self._a + self._s * (t - self.t_ref) + _ROUND) >> _SHIFT

    def at(self, ts):
        """Local time ts (ns) on the scheduler's clock."""
        if self.kind == "constant":
            return ts + half(self.offset2)
        if isinstance(ts, int):
            return ts + half(self.offset2_at(ts))
        whole = int(ts // 1)
        return ts + (self.offset2_at(whole) + (ts - whole) * self._s / (1 << _SHIFT)) / 2


def fit(clocks):
    """(ClockModel or None when no exchange is valid, warning or None)."""
    best = best_exchange(clocks)
    if best is None:
        return None, None
    constant = ClockModel(*best)
    samples = _samples(_exchanges(clocks))
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < 2 * MIN_SPAN_NS:
        return constant, None
    w = [Fraction(1, (rtt + RTT_FLOOR_NS) ** 2) for _, _, rtt in samples]
    xs = [Fraction(x2, 2) for x2, _, _ in samples]
    ys = [y2 for _, y2, _ in samples]
    sw = sum(w)
    xm = sum(wi * x for wi, x in zip(w, xs)) / sw
    ym = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - xm) ** 2 for wi, x in zip(w, xs))
    slope2 = sum(wi * (x - xm) * (y - ym) for wi, x, y in zip(w, xs, ys)) / sxx
    t_ref = round(xm)
    a2 = ym + slope2 * (t_ref - xm)
    worst = max(abs(y - a2 - slope2 * (x - t_ref)) + rtt
                for x, y, (_, _, rtt) in zip(xs, ys, samples))
    model = ClockModel.linear(t_ref, a2, slope2, math.ceil(worst), len(samples))
    if abs(model.drift_ppm) > MAX_DRIFT_PPM:
        return constant, ("its exchanges put its clock's drift at %+.1f ppm against the "
                          "scheduler's, beyond ±%d ppm (no steady clock drifts that much): "
                          "aligned with one constant offset instead"
                          % (model.drift_ppm, MAX_DRIFT_PPM))
    return model, None
