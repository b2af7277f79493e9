"""Learning a provider's unknown rate limit from what it accepted (a plain state machine).

A provider whose limit is not stated is found by slow start, then held on a *plateau*
just under the limit, estimated from the responses it **accepted** per second, not from
the rate calls were asked for; the plateau is probed rarely and gently. The rules, and
where they come from:

* **Slow start** (RFC 5681 section 3.1, in rate form): from ``start_rps`` the rate
  doubles every :data:`SLOW_START_DOUBLING_S` worth of accepted calls, until the first
  429. Its limit estimate is what was accepted over the last :data:`EXIT_WINDOW_S`; a
  provider's burst, drained during the ramp, inflates it (by up to burst / window), so
  the first plateau is only :data:`FIRST_HOLD_FRACTION` of it, and never under half
  the rate the provider saw (the rate calls were delivered at, which lags the rate
  asked for by the way from grant to provider: RFC 5681 halves FlightSize, not cwnd).
* **Estimate from delivery, not from the send rate** (BBR: Cardwell et al., "BBR:
  Congestion-Based Congestion Control", ACM Queue 2016; draft-ietf-ccwg-bbr: the
  bottleneck rate is the *delivery* rate over a window). Later 429s are estimated from
  the responses accepted since the last pause ended, never above the rate asked for.
  Before a provider's first 429 everything sent was accepted, so one cycle alone only
  says "at most this"; but a token-bucket limiter (nginx ``limit_req``, most APIs)
  starting each cycle full accepts ``limit x span + burst`` per cycle, so two cycles
  sent at steady rates with different spans give the limit itself (the slope of that
  line; :data:`FIT_SPREAD`). Each estimate is at most the plateau it was measured at,
  so estimates converge from above.
* **Fit of two cycles** (a token bucket's two unknowns, its rate R and burst B, from two
  equations): a cycle between pauses starts with the provider's bucket full and ends with
  a refusal, so for each candidate R it says which burst the provider must have: the most
  it accepted in any window before the refusal, less R x that window (:func:`_excess_hull`).
  Two cycles of different shapes (slow start's ramp, a steady plateau over the limit, a
  probe's slow climb) agree on one R, the provider's (:func:`_fit_curves`), and so on its
  burst; from then on each cycle alone gives R at that burst (:func:`_solve_rate`), a
  limit that rose or fell included. Against a simulated nginx ``limit_req`` it is found
  within 0.1-2%. The fit is made once the pause after a cycle's 429 has ended (the
  cycle's answers are in) and sets the plateau at :data:`HOLD_FRACTION` of it;
  without it (cycles of one shape, a provider with no burst) the rules below estimate
  from the accepted rate.
* **Plateau** (CUBIC's concave region around W_max, RFC 9438 section 4.2; BBR's cruise
  phase of ProbeBW, at 1.0 of its estimate): the rate is held at :data:`HOLD_FRACTION`
  of the estimate, fitted or not, for ``hold_s`` of use
  (:data:`FIRST_HOLD_S` after slow start). The margin absorbs the estimate's error and
  send-time jitter: the provider's bucket refills while we send under it.
* **Probe** (CUBIC's convex region; BBR's ProbeBW_UP): then the rate grows by
  :data:`PROBE_SLOPE` of the estimate per second of use, faster far under the rate of
  the last cut (:data:`FAR_BELOW`); past the estimate without a 429 the slope doubles
  every :data:`PROBE_ACCEL_S` (up to :data:`PROBE_SLOPE_MAX`), so a limit that rose is
  found within tens of seconds. A 429 past the estimate places the limit between the
  plateau held without one and the rate of that 429: the new estimate is their middle,
  or the fitted limit when it lies between them. Against an unchanged limit the
  provider's burst drains before that 429, so a probe costs one pause, a whole second
  of ``Retry-After``: at a probe every 17.5 s that was 5.7% of the limit. So each probe
  that finds the limit where it was (within :data:`PROBE_SAME`) holds the next plateau
  :data:`HOLD_GROWTH` times longer, from :data:`HOLD_S` up to :data:`HOLD_MAX_S` (an
  exponential backoff of probing, as of retries in RFC 6298's timer); any other cut
  starts again from :data:`HOLD_S`. The first probe after slow start waits
  :data:`FIRST_HOLD_S`: slow start's estimate is off by up to the provider's burst per
  second (one cycle, two unknowns), but its plateau is measured at 97% of R against a
  burst of 0.2 s, and an early probe costs a pause in the first half minute.
* **429**: one cut per congestion event (a 429 for a request sent after the last cut:
  RFC 6582's one reduction per window), never below :data:`MAX_CUT` of the rate, and to
  that when fewer than :data:`MIN_SENT_ANSWERS` were accepted since the last pause (so few
  measure the provider's burst, not its rate: without this rule a limit of 1/s found
  from slow start's 20/s cost 26 of the first 57 requests); the
  Retry-After pause itself is the caller's (:class:`actors.pacing.bucket.ProviderBucket`),
  and measuring restarts when it ends.

Known weak spot: a provider with little or no burst (nginx ``burst=0``) refuses the first
request over its rate, so slow start ends before it has seen the limit and the first
estimate is 60-85% of it, held :data:`FIRST_HOLD_S` before the probe climbs back (a
burst of 0.05 s of R: 68-74% of R over 30 s in simulation, 84-86% over 120 s); with no
burst the fit has nothing to measure (:data:`FIT_MIN_BURST`).

Times are seconds on one clock, passed in as values; rates are requests per second.
"""

from __future__ import annotations

import collections
import math

import attrs

__all__ = [
    "ACCEPT_WINDOW_S",
    "CUT_COOLDOWN_S",
    "EXIT_WINDOW_S",
    "FAR_BELOW",
    "FIRST_HOLD_FRACTION",
    "FIRST_HOLD_S",
    "FIT_SPREAD",
    "HOLD_FRACTION",
    "HOLD_S",
    "MAX_CUT",
    "MIN_RPS",
    "PROBE_ACCEL_S",
    "PROBE_SLOPE",
    "PROBE_SLOPE_MAX",
    "SLOW_START_DOUBLING_S",
    "LimitLearner",
]

SLOW_START_DOUBLING_S = 0.5
"""Slow start doubles the rate every this many seconds' worth of accepted calls (RFC
5681's slow start in rate form: the doubling period stands in for TCP's round trip)."""
ACCEPT_WINDOW_S = 1.5
"""Window (seconds) of the accepted-rate measure at a 429."""
MIN_MEASURE_S = 0.25
"""A window shorter than this (just after a pause) measures nothing."""
HOLD_FRACTION = 0.97
"""The plateau is this share of the limit estimate. BBR cruises at a pacing gain of 1.0
of its delivery-rate estimate (ProbeBW_CRUISE); ours err high by up to a provider's
burst / the measured span (they converge from above; a fitted one is within 0.1-2% in
simulation), and a plateau above the limit costs a pause (a Retry-After) when the burst
runs out: 3% covers both. At 0.95 the margin alone cost 5% of the limit between probes;
0.96 -> 0.97 (issue 29) changed nothing in simulation but the share (+1%)."""
HOLD_S = 10.0
"""Seconds of use the plateau is held before probing."""
HOLD_GROWTH = 2.0
"""After a probe that found the limit where it was, the plateau is held this many times longer
(exponential backoff: each probe against an unchanged limit costs a whole Retry-After)."""
HOLD_MAX_S = 80.0
"""...up to this many seconds of use: a probe every ~90 s costs about 1.1% of the limit in
pauses; a limit that rose is found at most that late."""
PROBE_SAME = 0.05
"""A probe's estimate at most this share above the last one found the limit where it was."""
PROBE_SLOPE = 0.01
"""Probe: the rate grows by this share of the estimate per second of use."""
FAR_BELOW = 0.2
"""...times ((rate at the last cut / rate - 1) / FAR_BELOW) ** 2 when that is more than one."""
EXIT_WINDOW_S = 1.0
"""At the end of slow start the limit is estimated from the last this many seconds."""
FIRST_HOLD_FRACTION = 0.95
"""The plateau after slow start is this share of its estimate: what a provider's burst let
through during the ramp inflates it by up to burst / :data:`EXIT_WINDOW_S` (1.05-1.14 of
R against a burst of 0.2 s), a small burst deflates it. A plateau over the limit costs one
pause, after which the two cycles are fitted; one under it loses the gap for
:data:`FIRST_HOLD_S`: the margin is the smaller loss (0.85 held 0.89-0.97 of R)."""
FIRST_HOLD_S = 20.0
"""The plateau after slow start (a rougher estimate), or after a fit, is held at least this
long before probing: a
probe costs a pause (1 s of Retry-After), so an early one cost 3-4% of a 30 s run at
R = 200 (6 s: 88% of R against nginx, 20 s: 91-92%); a provider whose burst is small
(slow start's estimate then low) waits longer for its first probe."""
PROBE_ACCEL_S = 2.0
"""Past the estimate without a 429, the probe's slope doubles every this many seconds."""
PROBE_SLOPE_MAX = 0.25
"""...up to this share of the estimate per second."""
MAX_CUT = 0.5
"""One cut never takes the rate below this share of what it was (a noisy measure, or
a window that saw few answers, never collapses the rate)."""
CUT_COOLDOWN_S = 1.0
"""When a 429's send time is unknown, 429s within this many seconds of a cut belong to
the cut's congestion event."""
MIN_RPS = 0.1
"""The rate is never below this."""
MIN_SENT_ANSWERS = 8
"""Slow start's send rate is measured from at least this many answers (else its rate);
a later 429 after fewer answers than this since the last pause halves the rate."""
KEPT_CYCLES = 3
"""Cycles kept for the fit (the one whose span differs most is used)."""
SENT_KEPT_S = 30.0
"""Send times of accepted requests are kept this long (seconds) after their answer: a cycle's
fit reads the windows its burst drained in, the last seconds before its 429."""
ASSUMED_BURST_S = 0.2
"""Before a fit has found the provider's burst, a plateau refused ``span`` seconds after
resuming is taken to have run over the limit by a burst of this many seconds of the limit
(the bench's nginx, ``burst`` = 0.2 s of R; never below :data:`MAX_CUT` of the rate). At
R = 20 a plateau 36% over the limit, refused within 0.55 s, was cut by 4% a time, a pause
each (4 pauses in 30 s). A burst assumed too large costs the gap until the next probe, one
too small another pause, after which the cycles are fitted."""
FIT_STEPS = 200
"""The crossing is looked for in this many steps from the top down to 5% of it."""
FIT_ERROR = 0.04
"""Two curves are fitted only when one request more or less in either moves the crossing
by at most this share of it."""
FIT_MIN_BURST = 2.0
"""Two cycles' excess curves are trusted to cross at a burst of at least this many requests."""
FIT_SPREAD = 0.15
"""Two cycles are fitted only when their spans differ by this share of the longer."""


@attrs.define
class LimitLearner:
    """The rate of one provider whose limit is unknown (see the module doc).

    Attributes:
        rate: the pacing rate now, requests per second (None: unpaced until a 429).
        phase: ``"unpaced"``, ``"slow_start"``, ``"plateau"`` or ``"probe"``.
        limit_rps: the limit estimate, requests per second (None before the first 429).
        cuts: congestion events so far.
    """

    rate: float | None = None
    phase: str = "unpaced"
    limit_rps: float | None = None
    cuts: int = 0
    last_cut_at: float = -math.inf
    phase_since: float = 0.0
    measure_from: float = -math.inf
    above_since: float | None = None
    cut_from_rps: float = 0.0
    """The rate at the last cut (CUBIC's W_max)."""
    hold_s: float = HOLD_S
    """Seconds of use the plateau is held before the next probe (see :data:`HOLD_GROWTH`)."""
    burst: float | None = None
    """The provider's burst (requests), as the last fit of two cycles found it."""
    held_rps: float = 0.0
    """The plateau last held without a 429 (a lower bound of the limit)."""
    cycles: collections.deque[tuple[int, float]] = attrs.field(
        factory=lambda: collections.deque(maxlen=KEPT_CYCLES)
    )
    """The last cycles between pauses: (responses accepted, seconds), for the fit."""
    _accepted: collections.deque[float] = attrs.field(factory=collections.deque)
    sent: collections.deque[float] = attrs.field(factory=collections.deque)
    """Send times of the requests accepted in the last :data:`SENT_KEPT_S` (their
    answer's time when unknown), oldest first."""
    _exit: tuple[float, float] | None = None
    """(send time of the 429 that ended slow start, the rate it was sent at) until the
    estimate from everything sent before it is made (see :meth:`_settle_exit`)."""
    _cycle_count: int = 0
    _cycle_from: float | None = None
    curves: collections.deque[tuple[tuple[float, float], ...]] = attrs.field(
        factory=lambda: collections.deque(maxlen=KEPT_CYCLES)
    )
    """The last cycles that ended in a 429, as the upper hull of their excess lines (see
    :func:`_excess_hull`), for :meth:`_settle_fit`."""
    _fit_due: tuple[float, float, float | None, float] | None = None
    """(start of the cycle a 429 ended, send time of the refused request, the estimate a
    probe crossed or None, the plateau's hold before) until the pause it began has ended
    and the cycle's answers are in."""

    def __attrs_post_init__(self) -> None:
        if self.rate is not None and self.phase == "unpaced":
            self.phase = "slow_start"

    def start_slow(self, rate: float, now: float) -> None:
        """Begin slow start at ``rate`` (an unpaced provider's first 429)."""
        self.rate, self.phase, self.phase_since = max(MIN_RPS, rate), "slow_start", now

    def accepted_rps(self, now: float) -> float | None:
        """Accepted responses per second over the last :data:`ACCEPT_WINDOW_S` (or since
        the last pause ended); None when that span is under :data:`MIN_MEASURE_S`."""
        start = max(now - ACCEPT_WINDOW_S, self.measure_from)
        while self._accepted and self._accepted[0] < now - ACCEPT_WINDOW_S:
            self._accepted.popleft()
        if now - start < MIN_MEASURE_S:
            return None
        count = sum(1 for t in self._accepted if t >= start)
        return count / (now - start)

    def on_accepted(self, n: int, now: float, in_use: bool = True, sent_at: float | None = None) -> None:
        """``n`` responses accepted at ``now``, sent at ``sent_at`` (same clock; None:
        unknown); grows the rate when ``in_use`` (calls are admitted at a good share of
        it: a rate nobody uses is not raised, RFC 7661)."""
        self._accepted.extend([now] * n)
        self.sent.extend([now if sent_at is None else sent_at] * n)
        while self.sent and self.sent[0] < now - SENT_KEPT_S:
            self.sent.popleft()
        if self._exit is not None and now >= self.measure_from:
            self._settle_exit()
        if self._fit_due is not None and now >= self.measure_from:
            self._settle_fit()
        if now >= self.measure_from:
            self._cycle_count += n
            if self._cycle_from is None:
                self._cycle_from = now
        if self.rate is None or not in_use or n < 1:
            return
        if self.phase == "slow_start":
            self.rate *= 2.0 ** (n / (max(self.rate, MIN_RPS) * SLOW_START_DOUBLING_S))
            return
        limit = self.limit_rps or self.rate
        if self.phase == "plateau":
            if now - self.phase_since < (self.hold_s if self.cuts > 1 else FIRST_HOLD_S):
                return
            self.phase, self.phase_since, self.above_since = "probe", now, None
            self.held_rps = self.rate
        # far under the rate of the last 429 (an estimate from slow start, or one that
        # met a 429 too early), grow faster: CUBIC's growth is fast far from W_max
        slope = PROBE_SLOPE * max(1.0, ((self.cut_from_rps / self.rate - 1.0) / FAR_BELOW) ** 2)
        if self.rate > limit:
            if self.above_since is None:
                self.above_since = now
            slope = min(PROBE_SLOPE_MAX, PROBE_SLOPE * 2.0 ** ((now - self.above_since) / PROBE_ACCEL_S))
        self.rate += n * slope * limit / max(self.rate, MIN_RPS)

    def on_congestion(self, now: float, resume_at: float, sent_at: float | None = None) -> bool:
        """A 429 at ``now``; sending resumes at ``resume_at`` (after its Retry-After).

        ``sent_at``: when the refused request was sent; one sent before the last cut
        belongs to that cut's event. Returns True when this was a new event (the rate
        was cut and the limit re-estimated).
        """
        new_event = (
            sent_at > self.last_cut_at if sent_at is not None else now >= self.last_cut_at + CUT_COOLDOWN_S
        )
        if not new_event or self.rate is None:
            return False
        sent_rps = self._sent_rps(now) if self.phase == "slow_start" else self.rate
        probed = self.phase == "probe" and self.rate > (self.limit_rps or math.inf)
        if self.phase == "slow_start":
            # everything was accepted until now: the last doubling's accepted rate is a
            # floor for the limit that the average over the whole cycle is not
            recent = self._accepted_since(now - EXIT_WINDOW_S)
            estimate = max(self._estimate(now), min(self.rate, recent / EXIT_WINDOW_S))
        elif probed:
            # the probe crossed the estimate: the limit is between the plateau held
            # without a 429 and the rate of this one
            estimate = (self.held_rps + self.rate) / 2.0
            self._estimate(now)  # keeps the cycle for a later fit
        else:
            estimate = self._estimate(now)
            span = None if self._cycle_from is None else now - self._cycle_from
            if self.burst is None and span is not None and span >= MIN_MEASURE_S:
                # a plateau refused within seconds of resuming ran over the limit by what
                # the provider's burst lets through in that time (rate = limit + burst /
                # span): with the burst not yet known, assume :data:`ASSUMED_BURST_S`
                estimate = min(estimate, self.rate / (1.0 + ASSUMED_BURST_S / span))
            if self._cycle_count < MIN_SENT_ANSWERS or self.accepted_rps(now) is None:
                # refused within a few answers of resuming: the provider's bucket, refilled
                # by the pause, ran out at once (the rate is well over the limit), and so
                # few answers measure mostly that bucket: halve, the most one cut may (TCP
                # Reno's decrease, RFC 5681), as slow start's exit does
                estimate = min(estimate, MAX_CUT * self.rate / HOLD_FRACTION)
        probed_from = self.limit_rps if probed else None
        self._fit_due = (self.measure_from, now if sent_at is None else sent_at, probed_from, self.hold_s)
        self._hold_after(estimate, probed_from, self.hold_s)
        hold = FIRST_HOLD_FRACTION if self.phase == "slow_start" else HOLD_FRACTION
        estimate = max(estimate, sent_rps * MAX_CUT / hold, MIN_RPS)
        self._exit = (sent_at, sent_rps) if self.phase == "slow_start" and sent_at is not None else None
        self.limit_rps = estimate
        # the rate it was cut from (CUBIC's W_max), but never above the estimate: slow
        # start overshoots by up to twice the limit before its 429 comes back
        self.cut_from_rps = min(sent_rps, estimate)
        self.rate = max(MIN_RPS, hold * estimate)
        self.phase, self.phase_since, self.above_since = "plateau", resume_at, None
        self.measure_from = resume_at
        self._cycle_count, self._cycle_from = 0, None
        self.last_cut_at = now
        self.cuts += 1
        return True

    def _settle_exit(self) -> None:
        """Slow start's estimate, made again once the pause its 429 began has ended: from
        the requests *sent* in the :data:`EXIT_WINDOW_S` before the refused one. At the
        429 itself the answers of the last of them may not be back: a limiter in front of
        a slow provider refuses at once while the provider takes its time, so answers
        counted by arrival miss the top of the ramp (300 ms of latency: 84.8/s estimated
        for a limit of 100/s). Only raises the estimate (the first was a floor)."""
        assert self._exit is not None
        refused_at, sent_rps = self._exit
        self._exit = None
        before = sum(1 for t in self.sent if refused_at - EXIT_WINDOW_S <= t <= refused_at)
        estimate = min(before / EXIT_WINDOW_S, sent_rps)
        if self.limit_rps is None or estimate <= self.limit_rps or self.phase != "plateau" or self.cuts != 1:
            return
        self.limit_rps = estimate
        self.cut_from_rps = estimate
        self.rate = max(MIN_RPS, FIRST_HOLD_FRACTION * estimate)

    def _hold_after(self, estimate: float, probed_from: float | None, hold_s: float) -> None:
        """How long the next plateau is held (``hold_s``: the last one's): longer after a probe
        that found the limit where it was (:data:`HOLD_GROWTH`), :data:`HOLD_S` after one
        that found it higher, :data:`FIRST_HOLD_S` after a plateau was refused."""
        if probed_from is None:  # a plateau refused: the estimate is a fresh measure
            self.hold_s = FIRST_HOLD_S
        elif estimate <= probed_from * (1.0 + PROBE_SAME):
            self.hold_s = min(HOLD_MAX_S, hold_s * HOLD_GROWTH)
        else:  # the limit rose: it may rise further
            self.hold_s = HOLD_S

    def _settle_fit(self) -> None:
        """The limit from the cycle a 429 ended, once the pause after it has ended (its
        answers are in): once the provider's burst is known, the rate at which this cycle
        needed that burst (:func:`_solve_rate`); before, where its excess curve crosses
        an earlier cycle's (:func:`_fit_curves`), which gives the burst. The plateau is
        set under it."""
        assert self._fit_due is not None
        start, refused_at, probed_from, hold_s = self._fit_due
        self._fit_due = None
        sends = sorted(t for t in self.sent if start <= t <= refused_at)
        if len(sends) < MIN_SENT_ANSWERS or self.phase != "plateau" or self.rate is None:
            return
        newest = _excess_hull(sends, refused_at)
        if self.burst is not None:  # known: this cycle alone says the rate
            fitted = _solve_rate(newest, self.burst)
        else:
            fits = (_fit_curves(older, newest) for older in reversed(self.curves))
            fitted = next((f for f in fits if f is not None), None)
            if fitted is not None:
                self.burst = _excess(newest, fitted)
        self.curves.append(newest)
        # a probe's plateau, held without a 429, says the limit is at least that (a
        # crossing at or under it is two plateaus' steady stretches meeting)
        floor = max(self.held_rps if probed_from is not None else 0.0, MAX_CUT * (self.limit_rps or 0.0))
        if fitted is None or fitted <= floor:
            return
        self.limit_rps = fitted
        self.cut_from_rps = min(self.cut_from_rps, fitted) if self.cut_from_rps else fitted
        self.rate = max(MIN_RPS, HOLD_FRACTION * fitted)
        self._hold_after(fitted, probed_from, hold_s)
        self.hold_s = max(self.hold_s, FIRST_HOLD_S)  # a fitted limit needs no early probe

    def _sent_rps(self, now: float) -> float:
        """Slow start's rate as the provider saw it at ``now``: the rate calls were
        delivered at over the last doubling period, carried to its end (over one doubling
        an exponential ramp averages ``1 / (2 ln 2)`` of its last value), never above the
        rate asked for. Until the first 429 everything sent was accepted, so this is the
        send rate, lagging the rate asked for by the way from grant to provider (RFC 5681
        halves FlightSize, what is in flight, not cwnd)."""
        assert self.rate is not None
        span = min(SLOW_START_DOUBLING_S, now - self.phase_since)
        if span < MIN_MEASURE_S:
            return self.rate
        answers = self._accepted_since(now - span)
        if answers < MIN_SENT_ANSWERS:
            return self.rate  # too few to say: a thin measure never collapses the rate
        delivered = answers / span
        doublings = span / SLOW_START_DOUBLING_S
        carried: float = delivered * doublings * math.log(2.0) / (1.0 - 0.5**doublings)
        return min(self.rate, carried)

    def _accepted_since(self, start: float) -> int:
        return sum(1 for t in self._accepted if t >= start)

    def _estimate(self, now: float) -> float:
        """The limit, from what was accepted since the last pause (see the module doc)."""
        assert self.rate is not None
        measured = self.accepted_rps(now)
        estimate = self.rate if measured is None else min(measured, self.rate)
        if measured is None and self.limit_rps is not None:
            estimate = min(estimate, self.limit_rps)
        span = None if self._cycle_from is None else now - self._cycle_from
        if span is None or span < MIN_MEASURE_S:
            return estimate
        count = self._cycle_count
        estimate = min(estimate, count / span)
        if self.phase != "plateau":  # only cycles sent at one steady rate fit the model
            self.cycles.clear()
            return estimate
        earlier = sorted(self.cycles, key=lambda c: -abs(span - c[1]))
        self.cycles.append((count, span))
        for accepted, seconds in earlier:
            if abs(span - seconds) < FIT_SPREAD * max(span, seconds):
                break
            # each cycle from a full provider bucket: accepted = limit x span + burst
            fitted = (count - accepted) / (span - seconds)
            if MAX_CUT * estimate <= fitted <= estimate:
                return fitted
        return estimate


def _excess_hull(sends: list[float], refused_at: float) -> tuple[tuple[float, float], ...]:
    """A cycle's excess over a token bucket of rate R, as the lines it is the maximum of.

    ``sends``: the send times of the requests a cycle had accepted, sorted, the cycle
    started with the provider's bucket full (after a pause, or idle) and ended with the
    request refused at ``refused_at``. A token bucket of rate R (GCRA, nginx ``limit_req``)
    refuses a request when what was sent in some window before it, less R x the window,
    exceeds its burst: ``excess(R) = max over i of (n - i) - R x (refused_at - sends[i])``,
    the burst the provider must have for that R. Returns the upper hull of those lines as
    (window seconds, requests), ``excess(R) = max(requests - R x window)``."""
    n = len(sends)
    points = sorted((refused_at - t, float(n - i)) for i, t in enumerate(sends))
    hull: list[tuple[float, float]] = []
    for b, a in points:  # Andrew's monotone chain, upper hull of (window, requests)
        while len(hull) >= 2:
            (b1, a1), (b2, a2) = hull[-2], hull[-1]
            if (b2 - b1) * (a - a1) - (a2 - a1) * (b - b1) >= 0:
                hull.pop()
            else:
                break
        hull.append((b, a))
    return tuple(hull)


def _excess(hull: tuple[tuple[float, float], ...], rps: float) -> float:
    return max(a - rps * b for b, a in hull)


def _top(hull: tuple[tuple[float, float], ...]) -> float:
    """The fastest a cycle sent over :data:`MIN_SENT_ANSWERS` requests or more (a bunch of a
    few, sent together, says nothing of a rate)."""
    return max((a / b for b, a in hull if b > 0 and a >= MIN_SENT_ANSWERS), default=0.0)


def _solve_rate(hull: tuple[tuple[float, float], ...], burst: float) -> float | None:
    """The rate R at which a cycle's excess (:func:`_excess_hull`) is ``burst``: the limit,
    when the provider's burst is known. None when no rate under the cycle's fastest
    needed that much."""
    lo, hi = 0.0, _top(hull)
    if hi <= 0.0 or _excess(hull, hi) > burst or _excess(hull, lo) < burst:
        return None
    for _ in range(40):  # the excess falls as R grows
        mid = (lo + hi) / 2.0
        if _excess(hull, mid) > burst:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def _window(hull: tuple[tuple[float, float], ...], rps: float) -> float:
    """The window (seconds) whose line gives the excess at ``rps``."""
    return max(hull, key=lambda line: line[1] - rps * line[0])[0]


def _fit_curves(
    first: tuple[tuple[float, float], ...], second: tuple[tuple[float, float], ...]
) -> float | None:
    """The rate R of a token bucket that ended two cycles (:func:`_excess_hull`) with the same
    burst: where their excess curves cross (one cycle gives one equation in R and the burst,
    two give both; for two cycles sent at steady rates this is the slope of
    ``accepted = R x span + burst``). None when they do not cross at a burst of at least
    :data:`FIT_MIN_BURST` requests (a provider with no burst: the curves meet only where
    both are ~1) or cross only where one cycle never sent that fast.

    Searched from the top: from the slower cycle's fastest sending down to 5% of it."""

    def gap(rps: float) -> float:
        return _excess(first, rps) - _excess(second, rps)

    top = min(_top(first), _top(second))
    hi = top
    for k in range(1, FIT_STEPS + 1):
        lo = top * (1.0 - 0.95 * k / FIT_STEPS)
        if (gap(lo) > 0) != (gap(hi) > 0):
            for _ in range(30):
                mid = (lo + hi) / 2.0
                if (gap(mid) > 0) == (gap(hi) > 0):
                    hi = mid
                else:
                    lo = mid
            rps = (lo + hi) / 2.0
            if min(_excess(first, rps), _excess(second, rps)) < FIT_MIN_BURST:
                return None
            # one request of noise moves the crossing by 1 / (the windows' difference)
            spread = abs(_window(first, rps) - _window(second, rps))
            return rps if spread * rps * FIT_ERROR >= 1.0 else None
        hi = lo
    return None
