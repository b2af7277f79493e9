"""Pacing pieces the governor is built from: token bucket, AIMD rate, Retry-After.

Plain classes, time passed in as a value (seconds), so they are tested with a fake
clock.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

import attrs

__all__ = [
    "AIMD_CUT_COOLDOWN_S",
    "AIMD_DECREASE",
    "AIMD_INCREASE_FRACTION",
    "AIMD_MIN_RPS",
    "PACE_MARGIN",
    "SLOW_START_DOUBLING_S",
    "SLOW_START_EXIT_DECREASE",
    "SLOW_START_RPS",
    "Circuit",
    "ProviderBucket",
    "SendGate",
    "SendGates",
    "parse_retry_after",
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
SLOW_START_RPS = 10.0
"""Default start of slow start (requests per second) for remote APIs of unknown rate,
like TCP's initial window (RFC 6928): low enough that the first burst costs a 429 or
two, not one per concurrent call; the lowest rate an unpaced provider restarts at."""
SLOW_START_DOUBLING_S = 0.5
"""Slow start: until the first 429, an unknown provider's rate doubles every this many
seconds while it is what holds calls back (RFC 5681's slow start, in rate form)."""
SLOW_START_EXIT_DECREASE = 0.5
"""The first congestion event of an unknown rate halves it (as TCP leaves slow start,
RFC 5681): doubling overshoots the provider's limit by up to a third before its 429
comes back, and 80% of that would still be over it."""
USE_WINDOW_S = 0.5
"""Time constant (seconds) of the moving average of grants that tells how fast a
provider's calls are being admitted."""
IN_USE_FRACTION = 0.5
"""The rate grows only while calls are admitted at no less than this share of it: a
rate nobody uses is not raised (RFC 7661's rule for an unused congestion window)."""
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


def _http_date_delta(text: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):  # garbage; Python 3.10 raises TypeError here
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp() - datetime.fromtimestamp(now, timezone.utc).timestamp()


class SendGate:
    """Spaces the requests actually sent to one (org, provider) at its current rate.

    The governor's token bucket decides admission; between a grant and the request
    leaving (marking receipts running, thread hand-offs) delays vary, so admitted calls
    could reach the provider in bunches larger than its burst. A sender calls
    :meth:`wait_turn` right before each request. Two rules, both at ``rps``:

    * booking: each sender books the next slot, ``1 / rps`` after the previous one, and
      sleeps until it (this keeps the senders in order);
    * passing: when it wakes, its send must also conform to the Generic Cell Rate
      Algorithm (ITU-T I.371) over the sends that actually passed, with a tolerance of
      one spacing: a sender woken late (a busy event loop, a GC pause) together with
      others goes at most two back-to-back; the rest wait their spacing again.

    The governor keeps the rate current (:meth:`set_rate`) and, on a 429,
    :meth:`pause_until` re-books every sender still waiting, so requests granted before
    the 429 do not go out into the pause.

    Thread-safe (one lock; under gevent a patched, cooperative one). Time is
    ``time.monotonic`` seconds unless a clock is given.
    """

    def __init__(self, rps: float | None = None) -> None:
        self._lock = threading.Lock()
        self._rps = rps
        self._next = 0.0
        self._tat = 0.0
        """GCRA's theoretical arrival time of the next send."""
        self._epoch = 0
        self._closed_until = -math.inf

    @property
    def rps(self) -> float | None:
        """The spacing rate, requests per second (None: no spacing)."""
        return self._rps

    def set_rate(self, rps: float | None) -> None:
        """Space later bookings at ``rps`` (None: no spacing)."""
        with self._lock:
            self._rps = rps

    def pause_until(self, until: float, rps: float | None) -> None:
        """No send before ``until``; senders already waiting book again from there."""
        with self._lock:
            self._epoch += 1
            self._next = until
            self._tat = until + (1.0 / rps if rps else 0.0)
            self._rps = rps

    def close(self, until: float) -> None:
        """Send nothing before ``until`` (the provider's circuit opened): senders waiting
        now, and any that come before then, give up their turn (:meth:`wait_turn` returns
        False) instead of waiting for it."""
        with self._lock:
            self._epoch += 1
            self._closed_until = until

    def book(self, now: float) -> tuple[float, int]:
        """Book the next send slot; returns (seconds to wait, booking epoch); the wait is
        infinite while the gate is closed (nothing is booked then)."""
        with self._lock:
            if now < self._closed_until:
                return math.inf, self._epoch
            at = max(now, self._next)
            if self._rps is not None:
                self._next = at + 1.0 / self._rps
            return at - now, self._epoch

    def try_pass(self, now: float, epoch: int) -> float | None:
        """Pass a sender whose booking (made in ``epoch``) is due.

        Returns:
            0.0 when it may send now (the send is counted); seconds to wait before trying
            again when sends already went closer than the rate allows (infinity while the
            gate is closed); None when a pause since the booking voided it (book again).
        """
        with self._lock:
            if epoch != self._epoch:
                return None
            if now < self._closed_until:
                return math.inf
            if self._rps is None:
                return 0.0
            spacing = 1.0 / self._rps
            if now < self._tat - spacing:
                return self._tat - spacing - now
            self._tat = max(now, self._tat) + spacing
            return 0.0

    def wait_turn(
        self,
        latest: float = math.inf,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> bool:
        """Block until this sender may send.

        Args:
            latest: the last moment (clock seconds) worth sending at; a turn that would
                come later is given up without waiting for it.
            stop: when set, the wait ends at once (waits on it instead of sleeping).

        Returns:
            True when it is this sender's turn; False when the turn would come after
            ``latest``, the gate is closed, or ``stop`` was set (then nothing may be sent).
        """

        def wait(seconds: float) -> bool:
            if stop is not None:
                return not stop.wait(seconds) if seconds > 0 else not stop.is_set()
            if seconds > 0:
                sleep(seconds)
            return True

        while True:
            now = clock()
            delay, epoch = self.book(now)
            if delay == math.inf or now + delay > latest or not wait(delay):
                return False
            while True:
                now = clock()
                extra = self.try_pass(now, epoch)
                if extra is None:
                    break  # a pause voided the booking: book again
                if extra <= 0:
                    return True
                if extra == math.inf or now + extra > latest or not wait(extra):
                    return False


class SendGates:
    """(org, provider) -> :class:`SendGate`, created on first use (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[tuple[str, str], SendGate] = {}

    def get(self, org_id: str, provider: str) -> SendGate:
        """The gate of (org, provider)."""
        key = (org_id, provider)
        gate = self._gates.get(key)
        if gate is None:
            with self._lock:
                gate = self._gates.setdefault(key, SendGate())
        return gate


@attrs.define
class ProviderBucket:
    """Pacing state of one (org, provider): token bucket, concurrency, pause, AIMD.

    Three phases (:class:`~actors.tool.Pacing` chooses where it starts):

    * unpaced (``rate`` None): no rate is known or assumed; only concurrency limits.
      The first 429 starts slow start from half the rate calls were granted at
      (never under :data:`SLOW_START_RPS`).
    * slow start: the rate doubles every :data:`SLOW_START_DOUBLING_S` while it is what
      holds calls back; the next congestion event cuts it to
      :data:`SLOW_START_EXIT_DECREASE` of itself and ends slow start.
    * congestion avoidance (from the start when the rate is stated, paced at
      :data:`PACE_MARGIN` of it and never above): each congestion event (a 429 for a
      request sent after the last cut; see :data:`AIMD_CUT_COOLDOWN_S`) cuts the rate to
      :data:`AIMD_DECREASE` of itself; between events it grows by
      :data:`AIMD_INCREASE_FRACTION` of its reference per second.

    Every 429 also closes the gate for its Retry-After.

    Attributes:
        ceiling_rps: the stated rate (requests per second), or None when unknown.
        burst: token bucket size (default: one call plus 10 ms worth of the rate, so calls
            are spread smoothly; a provider that allows bursts can be given more).
        max_concurrency: provider calls in flight at once, or None.
        start_rps: where slow start begins when the rate is unknown (None: unpaced).
        rate: the current pacing rate, requests per second (None: unpaced).
        slow_start: whether the rate is in slow start.
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
    gate_until: float = 0.0
    backpressure_events: int = 0
    last_cut_at: float = -math.inf
    _used: float = 0.0
    _used_at: float = -math.inf

    def __attrs_post_init__(self) -> None:
        if self.ceiling_rps is not None:
            self.rate = self.ceiling_rps * PACE_MARGIN
        elif self.start_rps is not None:
            self.rate, self.slow_start = self.start_rps, True
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
        self._used = self._decayed(now) + n
        self._used_at = max(self._used_at, now)

    def ready_at(self, now: float) -> float | None:
        """When a waiter could next be granted, or None if only a release can help."""
        if now < self.gate_until:
            return self.gate_until
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
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

    def on_success(self, now: float) -> None:
        """One successful call: grow the rate, if calls are admitted at a good share of it."""
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
        self, pause_s: float, jitter_s: float, now: float, sent_at: float | None = None
    ) -> None:
        """Close the gate for ``pause_s`` (+ jitter); cut the rate once per congestion event.

        ``sent_at``: when the 429'd request was sent (same clock as ``now``); one sent
        after the last cut is a new event.
        """
        self.backpressure_events += 1
        self.gate_until = max(self.gate_until, now + pause_s + jitter_s)
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
            self.last_cut_at = now
        self.tokens = 0.0
        self.refilled_at = self.gate_until


@attrs.define
class Circuit:
    """Circuit breaker of one (org, provider) (M. Nygard, *Release It!*, "Circuit Breaker").

    *closed*: calls go. After ``threshold`` consecutive unavailable outcomes (connection
    errors, 5xx, timeouts; a provider that answers anything else is up) it *opens*:
    calls are refused at once for ``open_s``. Then *half-open*: one probe call may go;
    the others wait for it. The probe answered: closed again. The probe unavailable:
    open again for twice as long, up to ``open_max_s``.

    Attributes:
        threshold: consecutive unavailable outcomes that open it (None: never opens).
        open_s / open_max_s: first and longest open period, seconds.
        opened: how many times it opened (for stats).
    """

    threshold: int | None
    open_s: float
    open_max_s: float
    state: str = "closed"
    failures: int = 0
    open_until: float = 0.0
    period_s: float = 0.0
    probing: bool = False
    opened: int = 0

    def admits(self, now: float) -> str:
        """``"go"``, ``"probe"`` (grant one call, the probe), ``"wait"`` (a probe is out),
        or ``"refuse"`` (open)."""
        if self.state == "open":
            if now < self.open_until:
                return "refuse"
            self.state, self.probing = "half_open", False
        if self.state == "half_open":
            return "wait" if self.probing else "probe"
        return "go"

    def probe_sent(self) -> None:
        """The half-open probe was granted."""
        self.probing = True

    def record(self, answered: int, unavailable: int, now: float) -> bool:
        """Outcomes of calls that ended: ``answered`` by the provider (successes, 4xx,
        429s), ``unavailable``. Returns True when this opened the circuit."""
        if answered:
            self.state, self.failures, self.probing, self.period_s = "closed", 0, False, 0.0
            return False
        if not unavailable:
            self.probing = False  # nothing was learnt (the probe was not sent): probe again
            return False
        self.failures += unavailable
        if self.state == "half_open":
            self.period_s = min(self.open_max_s, max(self.open_s, 2 * self.period_s))
        elif self.state == "closed" and self.threshold is not None and self.failures >= self.threshold:
            self.period_s = self.open_s
        else:
            return False
        self.state, self.open_until, self.probing = "open", now + self.period_s, False
        self.opened += 1
        return True
