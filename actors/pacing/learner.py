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
* **Plateau** (CUBIC's concave region around W_max, RFC 9438 section 4.2; BBR's cruise
  phase of ProbeBW, at 1.0 of its estimate): the rate is held at :data:`HOLD_FRACTION`
  of the estimate for :data:`HOLD_S` (:data:`FIRST_HOLD_S` after slow start) of use.
  The margin absorbs the estimate's error (high by up to burst / span) and send-time
  jitter: the provider's bucket refills while we send under it.
* **Probe** (CUBIC's convex region; BBR's ProbeBW_UP): then the rate grows by
  :data:`PROBE_SLOPE` of the estimate per second of use, faster far under the rate of
  the last cut (:data:`FAR_BELOW`); past the estimate without a 429 the slope doubles
  every :data:`PROBE_ACCEL_S` (up to :data:`PROBE_SLOPE_MAX`), so a limit that rose is
  found within tens of seconds. A 429 past the estimate places the limit between the
  plateau held without one and the rate of that 429: the new estimate is their middle.
  Against an unchanged limit the provider's burst drains before that 429, so a probe
  costs one pause (one Retry-After) every 16 to 21 s, 17.5 s typically: the 1 s pause,
  :data:`HOLD_S` on the plateau, then about 6.5 s of probing (docs/pacing.md, What you
  state; measured against a provider whose burst is at most 0.2 s of its rate).
* **429**: one cut per congestion event (a 429 for a request sent after the last cut:
  RFC 6582's one reduction per window), never below :data:`MAX_CUT` of the rate, and to
  that when fewer than :data:`MIN_SENT_ANSWERS` were accepted since the last pause (so few
  measure the provider's burst, not its rate: without this rule a limit of 1/s found
  from slow start's 20/s cost 26 of the first 57 requests); the
  Retry-After pause itself is the caller's (:class:`actors.pacing.bucket.ProviderBucket`),
  and measuring restarts when it ends.

Known weak spot: a provider with no burst at all (nginx ``burst=0``) refuses the first
request over its rate, so slow start ends before it has seen the limit and the first
estimate is about half of it; the probe then takes 10-20 s to climb back.

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
HOLD_FRACTION = 0.96
"""The plateau is this share of the limit estimate. BBR cruises at a pacing gain of 1.0
of its delivery-rate estimate (ProbeBW_CRUISE); ours err high by up to a provider's
burst / the measured span (they converge from above), and a plateau above the limit
costs a pause (a Retry-After) when the burst runs out: 4% covers both. At 0.95 the
margin alone cost 5% of the limit between probes."""
HOLD_S = 10.0
"""Seconds of use the plateau is held before probing."""
PROBE_SLOPE = 0.01
"""Probe: the rate grows by this share of the estimate per second of use."""
FAR_BELOW = 0.2
"""...times ((rate at the last cut / rate - 1) / FAR_BELOW) ** 2 when that is more than one."""
EXIT_WINDOW_S = 1.0
"""At the end of slow start the limit is estimated from the last this many seconds."""
FIRST_HOLD_FRACTION = 0.85
"""The plateau after slow start is this share of its estimate: what a provider's burst let
through during the ramp inflates it by up to burst / :data:`EXIT_WINDOW_S`."""
FIRST_HOLD_S = 6.0
"""The plateau after slow start (a rougher estimate) is held this long before probing."""
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
SENT_KEPT_S = 10.0
"""Send times of accepted requests are kept this long (seconds) after their answer."""
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
            if now - self.phase_since < (HOLD_S if self.cuts > 1 else FIRST_HOLD_S):
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
        if self.phase == "slow_start":
            # everything was accepted until now: the last doubling's accepted rate is a
            # floor for the limit that the average over the whole cycle is not
            recent = self._accepted_since(now - EXIT_WINDOW_S)
            estimate = max(self._estimate(now), min(self.rate, recent / EXIT_WINDOW_S))
        elif self.phase == "probe" and self.rate > (self.limit_rps or math.inf):
            # the probe crossed the estimate: the limit is between the plateau held
            # without a 429 and the rate of this one
            estimate = (self.held_rps + self.rate) / 2.0
            self._estimate(now)  # keeps the cycle for a later fit
        else:
            estimate = self._estimate(now)
            if self._cycle_count < MIN_SENT_ANSWERS or self.accepted_rps(now) is None:
                # refused within a few answers of resuming: the provider's bucket, refilled
                # by the pause, ran out at once (the rate is well over the limit), and so
                # few answers measure mostly that bucket: halve, the most one cut may (TCP
                # Reno's decrease, RFC 5681), as slow start's exit does
                estimate = min(estimate, MAX_CUT * self.rate / HOLD_FRACTION)
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
