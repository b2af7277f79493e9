"""Pacing pieces the governor is built from: token bucket, slow start and AIMD, Retry-After.

Send gates are in :mod:`actors.pacing.send_gate`, the provider circuit in :mod:`actors.pacing.circuit`.

Plain classes, time passed in as a value (seconds), so they are tested with a fake
clock.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import attrs

from actors.pacing.learner import SLOW_START_DOUBLING_S, LimitLearner

__all__ = [
    "AIMD_CUT_COOLDOWN_S",
    "AIMD_DECREASE",
    "AIMD_INCREASE_FRACTION",
    "AIMD_MIN_RPS",
    "INITIAL_WINDOW",
    "PACE_MARGIN",
    "SLOW_START_DOUBLING_S",
    "SLOW_START_EXIT_DECREASE",
    "SLOW_START_RPS",
    "ProviderBucket",
    "pacing_report",
    "parse_retry_after",
    "plain_retry_after",
]

AIMD_DECREASE = 0.8
"""Multiplicative decrease: a 429 cuts the rate to 80% of what it was."""
AIMD_INCREASE_FRACTION = 0.1
"""Additive increase: while the rate is what holds calls back, it grows by 10% of its
reference (the rate just before the last cut) per second of successful calls. After a
cut to 80% it is back at the reference in about 2 s; a provider at a fixed limit sees
one congestion event every few seconds (one or two 429s each) and gets about 90-95% of
its limit."""
AIMD_MAX_STEP_PER_CALL = 0.002
"""...but near the reference (within :data:`AIMD_CAREFUL_FROM` of it, either way) by at
most 0.2% per successful call, so that at low rates (below about 50 requests/s) probing
around the last limit spans a hundred calls or more and only a small share of them meet
a 429."""
AIMD_CAREFUL_FROM = 0.9
"""The careful band is [0.9, 1/0.9] times the reference. Below it the rate climbs back
at the full additive step; above it (no 429 came: the limit moved, or the last 429 was
a fluke) it grows at the full step again (the shape of CUBIC, RFC 9438: fast far from
the last limit, slow near it)."""
AIMD_CUT_COOLDOWN_S = 1.0
"""A 429 for a request sent before the last cut belongs to the congestion event that
cut (it was in flight, or waiting to go, when the first 429 came back): it pauses the
gate but does not cut again (as TCP NewReno cuts once per window, RFC 6582). When the
send time is unknown, 429s within this many seconds of a cut count as the same event."""
AIMD_MIN_RPS = 0.1
"""The rate is never cut below this (requests per second)."""
PACE_MARGIN = 0.98
"""A stated rate is paced at 98% of itself. Send times jitter (thread wake-ups, GC,
the network); at exactly the provider's rate every late request permanently eats into
the provider's burst allowance and the bunches add up to a 429. At 98% the provider's
bucket refills by 2% of its rate per second and absorbs them."""
INITIAL_WINDOW = 10
"""Requests slow start sends in its first doubling period: RFC 6928's initial window of
ten segments per round trip."""
SLOW_START_RPS = INITIAL_WINDOW / SLOW_START_DOUBLING_S
"""Default start of slow start (20 requests per second) for remote APIs of unknown
rate: :data:`INITIAL_WINDOW` per doubling period, low enough that the first burst costs a
429 or two, not one per concurrent call; the lowest rate an unpaced provider restarts
at. (From 10/s, slow start took 0.5 s longer to reach 200/s: 1.5% of a 30 s run.)"""
SLOW_START_EXIT_DECREASE = 0.5
"""The first congestion event of an unknown rate halves it (as TCP leaves slow start,
RFC 5681): doubling overshoots the provider's limit by up to a third before its 429
comes back, and 80% of that would still be over it."""
USE_WINDOW_S = 0.5
"""Time constant (seconds) of the moving average of grants that tells how fast a
provider's calls are being admitted. It starts, at a provider's first grant, at the
rate itself (in use)."""
IN_USE_FRACTION = 0.5
"""The rate grows only while calls are admitted at no less than this share of it: a
rate nobody uses is not raised (RFC 7661's rule for an unused congestion window)."""
KEPT_PAUSES = 5
"""How many of the last pauses a bucket keeps for :func:`pacing_report`."""
TOKEN_EPSILON = 1e-9
"""Float slack when counting whole tokens (a refill may land at 0.99999999999994)."""
MIN_WAKE_S = 1e-3
"""Shortest wait :meth:`ProviderBucket.ready_at` announces, so a wake-up is never lost."""


def parse_retry_after(
    value: str | float | None, now: float, *, default_s: float, max_s: float, min_s: float
) -> float:
    """Seconds to pause for a ``Retry-After`` value (RFC 9110 section 10.2.3).

    Args:
        value: delay-seconds (``"120"``; a non-negative decimal such as ``"1.5"`` is
            accepted too) or an HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``), or None.
        now: current time, epoch seconds (for HTTP-dates).
        default_s: pause for a missing or unparseable value (garbage, negative numbers).
        max_s: the cap for any value.
        min_s: the pause for a date already in the past (or a zero delay).

    Returns:
        The pause in seconds, within [min_s, max_s].
    """
    if value is None:
        return min(default_s, max_s)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            delta = _http_date_delta(text, now)
            if delta is None:
                return min(default_s, max_s)
            return min(max(delta, min_s), max_s)
    if not math.isfinite(seconds) or seconds < 0:
        return min(default_s, max_s)
    return min(max(seconds, min_s), max_s)


def plain_retry_after(value: Any) -> str | float | None:
    """A tool's ``RateLimitedError.retry_after`` as text or a float, before it reaches the
    governor (whose thread must not run a provider's objects): an int past a float's
    range, or a value whose ``str()`` raises, is None (the default pause). The one way
    in: :func:`parse_retry_after` and the governors then see only these forms."""
    if value is None or type(value) is str or type(value) is float:
        return value
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return str(value)
    except BaseException:  # OverflowError, or a __str__ raising anything
        return None


def _http_date_delta(text: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):  # garbage; Python 3.10 raises TypeError here
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp() - datetime.fromtimestamp(now, timezone.utc).timestamp()


@attrs.define
class ProviderBucket:
    """Pacing state of one (org, provider): token bucket, concurrency, pause, rate.

    :class:`~actors.tool.Pacing` chooses how the rate is set:

    * stated (``ceiling_rps``): paced at :data:`PACE_MARGIN` of it and never above; each
      congestion event (a 429 for a request sent after the last cut; see
      :data:`AIMD_CUT_COOLDOWN_S`) cuts the rate to :data:`AIMD_DECREASE` of itself and
      it grows back by :data:`AIMD_INCREASE_FRACTION` of its reference per second (AIMD).
    * unknown, with ``start_rps``: learnt by a :class:`~actors.pacing.learner.LimitLearner`:
      slow start, then a plateau just under the limit estimated from the responses the
      provider accepted, probed rarely and gently.
    * unknown, without ``start_rps`` (unpaced): no rate until the first 429, which starts
      slow start from half the rate calls were granted at (never under
      :data:`SLOW_START_RPS`).

    Every 429 also closes the gate for its Retry-After.

    Attributes:
        ceiling_rps: the stated rate (requests per second), or None when unknown.
        burst: token bucket size (default: one call plus 10 ms worth of the rate, so calls
            are spread smoothly; a provider that allows bursts can be given more).
        max_concurrency: provider calls in flight at once, or None.
        start_rps: where slow start begins when the rate is unknown (None: unpaced).
        rate: the current pacing rate, requests per second (None: unpaced).
        slow_start: whether the rate is in slow start.
        learner: the unknown limit's state (None when the rate is stated).
        admission_wait_s: seconds waiters (tool queues) waited for this bucket's grants
            (pacing, pauses), each wait counted once when granted, added up over the
            waiters.
        cuts: congestion events this process's 429s cut the rate for (a shared
            pacer's cuts made by other workers, or in earlier runs, are not counted).
        pauses: the last Retry-After pauses, ``(at, pause_s, raw Retry-After)``, newest last.
    """

    ceiling_rps: float | None
    burst: float | None
    max_concurrency: int | None
    start_rps: float | None = None
    rate: float | None = None
    reference_rps: float | None = None
    slow_start: bool = False
    tokens: float = 0.0
    refilled_at: float = 0.0
    in_flight: int = 0
    nested_out: int = 0  # slots granted to nested calls (outside the ceiling), not yet back
    gate_until: float = 0.0
    backpressure_events: int = 0
    last_cut_at: float = -math.inf
    learner: LimitLearner | None = None
    admission_wait_s: float = 0.0
    cuts: int = 0
    pauses: list[tuple[float, float, str | None]] = attrs.field(factory=list)
    _used: float = 0.0
    _used_at: float = -math.inf

    def __attrs_post_init__(self) -> None:
        if self.ceiling_rps is not None:
            self.rate = self.ceiling_rps * PACE_MARGIN
        else:
            self.learner = LimitLearner(rate=self.start_rps)
            self.rate, self.slow_start = self.start_rps, self.start_rps is not None
        self.reference_rps = self.rate
        self.tokens = self._burst()

    def _burst(self) -> float:
        if self.rate is None:
            return math.inf
        if self.burst is not None:
            return self.burst
        return 1.0 + self.rate / 100.0

    def refill(self, now: float) -> None:
        """Add tokens for the time since the last refill."""
        if self.rate is None:
            self.tokens = math.inf
        elif now > self.refilled_at:
            self.tokens = min(self._burst(), self.tokens + (now - self.refilled_at) * self.rate)
        self.refilled_at = max(self.refilled_at, now)

    def available(self, now: float) -> int:
        """How many slots this bucket could grant at ``now`` (before the global ceiling)."""
        if now < self.gate_until:
            return 0
        self.refill(now)
        free = math.inf if self.max_concurrency is None else self.max_concurrency - self.in_flight
        if self.rate is None:
            return int(free) if free != math.inf else 1 << 30
        return int(min(free, math.floor(self.tokens + TOKEN_EPSILON)))

    def take(self, n: int, now: float) -> None:
        """Record ``n`` grants at ``now``."""
        if self.rate is not None:
            self.tokens -= n
        self.in_flight += n
        if self._used_at == -math.inf and self.rate is not None:
            # the first grant: no history is no evidence of an idle provider (RFC 7661's
            # rule is for a sender with nothing to send); an average starting at zero
            # would hold slow start back for a time constant (~0.3 s of its ramp)
            self._used, self._used_at = self.rate * USE_WINDOW_S, now
        self._used = self._decayed(now) + n
        self._used_at = max(self._used_at, now)

    def ready_at(self, now: float, concurrency: bool = True) -> float | None:
        """When a waiter could next be granted, or None if only a release can help.
        ``concurrency=False``: a nested call's waiter, which max_concurrency does not hold."""
        if now < self.gate_until:
            return self.gate_until
        if concurrency and self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            return None
        if self.rate is not None and self.tokens + TOKEN_EPSILON < 1:
            # at least MIN_WAKE_S ahead: a wait that rounds to ``now`` would never wake
            return now + max((1 - self.tokens) / self.rate, MIN_WAKE_S)
        return now

    def _decayed(self, now: float) -> float:
        return self._used * math.exp(-max(0.0, now - self._used_at) / USE_WINDOW_S)

    def used_rps(self, now: float) -> float:
        """Grants per second: an exponential moving average, time constant
        :data:`USE_WINDOW_S`."""
        return self._decayed(now) / USE_WINDOW_S

    def on_success(self, now: float, sent_at: float | None = None) -> None:
        """One successful call (its request sent at ``sent_at``, where known): grow the
        rate, if calls are admitted at a good share of it."""
        learner = self.learner
        if learner is not None:
            in_use = self.rate is not None and self.used_rps(now) >= IN_USE_FRACTION * self.rate
            learner.on_accepted(1, now, in_use, sent_at)
            self.rate, self.slow_start = learner.rate, learner.phase == "slow_start"
            return
        if self.rate is None or self.used_rps(now) < IN_USE_FRACTION * self.rate:
            return
        if self.slow_start:
            self.rate *= 2.0 ** (1.0 / (max(self.rate, AIMD_MIN_RPS) * SLOW_START_DOUBLING_S))
        else:
            reference = self.reference_rps or self.rate
            step = AIMD_INCREASE_FRACTION * reference / max(self.rate, AIMD_MIN_RPS)
            near_last_limit = AIMD_CAREFUL_FROM * reference <= self.rate <= reference / AIMD_CAREFUL_FROM
            if near_last_limit:
                step = min(step, AIMD_MAX_STEP_PER_CALL * self.rate)
            self.rate += step
        if self.ceiling_rps is not None:
            self.rate = min(self.rate, self.ceiling_rps * PACE_MARGIN)

    def on_backpressure(
        self,
        pause_s: float,
        jitter_s: float,
        now: float,
        sent_at: float | None = None,
        retry_after: str | float | None = None,
    ) -> None:
        """Close the gate for ``pause_s`` (+ jitter); cut the rate once per congestion event.

        ``sent_at``: when the 429'd request was sent (same clock as ``now``); one sent
        after the last cut is a new event. ``retry_after``: the raw header, kept with the
        pause for :func:`pacing_report`.
        """
        self.backpressure_events += 1
        self.gate_until = max(self.gate_until, now + pause_s + jitter_s)
        self.pauses.append((now, pause_s + jitter_s, None if retry_after is None else str(retry_after)))
        del self.pauses[:-KEPT_PAUSES]
        learner = self.learner
        if learner is not None:
            if learner.rate is None:
                learner.start_slow(max(SLOW_START_RPS, self.used_rps(now) * SLOW_START_EXIT_DECREASE), now)
                learner.last_cut_at, learner.measure_from = now, self.gate_until
            elif learner.on_congestion(now, self.gate_until, sent_at):
                self.cuts += 1
            if learner.last_cut_at == now:
                self.last_cut_at = now
            self.rate, self.slow_start = learner.rate, learner.phase == "slow_start"
            self.tokens = 0.0
            self.refilled_at = self.gate_until
            return
        new_event = (
            now >= self.last_cut_at + AIMD_CUT_COOLDOWN_S if sent_at is None else sent_at > self.last_cut_at
        )
        if new_event:
            if self.rate is None:
                self.rate = max(SLOW_START_RPS, self.used_rps(now) * SLOW_START_EXIT_DECREASE)
                self.slow_start = True
            else:
                decrease = SLOW_START_EXIT_DECREASE if self.slow_start else AIMD_DECREASE
                self.slow_start = False
                self.reference_rps = self.rate
                self.rate = max(AIMD_MIN_RPS, self.rate * decrease)
                self.cuts += 1
            self.last_cut_at = now
        self.tokens = 0.0
        self.refilled_at = self.gate_until


def how_learnt(bucket: ProviderBucket) -> str:
    """How the bucket's rate was set: ``stated``, ``aimd`` (a stated rate cut by 429s and
    growing back), ``unpaced``, ``slow_start``, ``plateau`` or ``probe``."""
    if bucket.learner is not None:
        return bucket.learner.phase
    assert bucket.ceiling_rps is not None and bucket.rate is not None
    return "stated" if bucket.rate >= bucket.ceiling_rps * PACE_MARGIN * (1 - 1e-9) else "aimd"


def pacing_report(
    buckets: Mapping[tuple[str, str], ProviderBucket],
    circuits: Mapping[tuple[str, str], Any],
    now: float,
    gate_waits: Mapping[tuple[str, str], float] | None = None,
    held: Mapping[tuple[str, str], float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Pacing per (org, provider), keyed ``"org/provider"`` (a pure snapshot).

    Args:
        buckets / circuits: the governor's state, keyed (org, provider).
        now: the governor's clock (monotonic seconds).
        gate_waits: (org, provider) -> seconds senders waited at its send gate.
        held: (org, provider) -> seconds its calls were held back (see
            :class:`~actors.pacing.held.HeldClock`).

    Returns:
        For each (org, provider), counted in this process since it started:
        ``rate_rps`` (pacing rate now, None: unpaced), ``learnt``
        (:func:`how_learnt`), ``limit_rps`` (stated, or the estimate; None before the
        first 429), ``rate_limited`` (429s), ``cuts`` (congestion events this
        process's 429s cut the rate for), ``learner_cuts`` (an unknown limit's
        learner: every cut it made, with a shared pacer those of every worker while
        the pacer keeps its state; None for a stated rate), ``paused_for_s`` (seconds
        of pause left), ``pauses`` (the last few: ``{"ago_s", "pause_s",
        "retry_after"}``, newest last), ``circuit`` (``closed``, ``open``,
        ``half_open``), ``circuit_opened`` (times), ``held_s`` (wall time during which
        at least one of its calls waited for pacing: for a slot, through a pause, or
        for its turn at the send gate; never more than the time elapsed), ``waited_s``
        (the waits added up: each tool queue's wait for grants, counted once whatever
        the calls it held, plus each sender's wait at the send gate; waits that overlap
        add up, so it can exceed the time elapsed).
    """
    out: dict[str, dict[str, Any]] = {}
    for key, bucket in buckets.items():
        learner = bucket.learner
        circuit = circuits.get(key)
        out[f"{key[0]}/{key[1]}"] = {
            "rate_rps": bucket.rate,
            "learnt": how_learnt(bucket),
            "limit_rps": bucket.ceiling_rps if learner is None else learner.limit_rps,
            "rate_limited": bucket.backpressure_events,
            "cuts": bucket.cuts,
            "learner_cuts": learner.cuts if learner is not None else None,
            "paused_for_s": max(0.0, bucket.gate_until - now),
            "pauses": [
                {"ago_s": now - at, "pause_s": pause, "retry_after": raw} for at, pause, raw in bucket.pauses
            ],
            "circuit": getattr(circuit, "state", "closed"),
            "circuit_opened": getattr(circuit, "opened", 0),
            "held_s": (held or {}).get(key, 0.0),
            "waited_s": bucket.admission_wait_s + (gate_waits or {}).get(key, 0.0),
        }
    return out
