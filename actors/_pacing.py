"""Pacing pieces the governor is built from: token bucket, AIMD rate, Retry-After.

Plain classes, time passed in as a value (seconds), so they are tested with a fake
clock.
"""

from __future__ import annotations

import collections
import email.utils
import math
import threading
from datetime import datetime, timezone

import attrs

__all__ = [
    "AIMD_CUT_COOLDOWN_S",
    "AIMD_DECREASE",
    "AIMD_INCREASE_FRACTION",
    "AIMD_MIN_RPS",
    "ProviderBucket",
    "SendGate",
    "parse_retry_after",
]

AIMD_DECREASE = 0.8
"""Multiplicative decrease: a 429 cuts the rate to 80% of what it was."""
AIMD_INCREASE_FRACTION = 0.02
"""Additive increase: the rate grows by 2% of its reference (the rate just before the
last cut, or the pacing rps before any cut) per second of successful calls. With
the 0.8 cut, a provider at a fixed limit sees one 429 about every 10 s and gets about
90% of its limit on average."""
AIMD_CUT_COOLDOWN_S = 1.0
"""429s within this many seconds of a cut belong to the same congestion event (calls
already in flight when the first 429 came back): they pause the gate but do not cut
the rate again."""
AIMD_MIN_RPS = 0.1
"""The rate is never cut below this (requests per second)."""
OBSERVE_WINDOW_S = 2.0
"""Window over which admissions are counted to measure a provider's achieved rate."""
TOKEN_EPSILON = 1e-9
"""Float slack when counting whole tokens (a refill may land at 0.99999999999994)."""
MIN_WAKE_S = 1e-3
"""Shortest wait :meth:`ProviderBucket.ready_at` announces, so a wake-up is never lost."""


def parse_retry_after(
    value: str | float | None,
    now: float,
    *,
    default_s: float,
    max_s: float,
    min_s: float,
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
    """Spaces the actual sends to one provider at its stated rate (thread-safe).

    The governor's token bucket decides admission; between a grant and the request
    leaving (marking receipts running, thread hand-offs) delays vary, so admitted calls
    can reach the provider in bunches larger than its burst. The gate, taken right
    before the request, spaces sends at least ``1 / rps`` apart; it waits only for that
    spacing (milliseconds at steady state).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0

    def turn_in(self, rps: float, now: float) -> float:
        """Book the next send slot at ``rps``; returns seconds to wait before sending."""
        with self._lock:
            at = max(now, self._next)
            self._next = at + 1.0 / rps
        return at - now


@attrs.define
class ProviderBucket:
    """Pacing state of one (org, provider): token bucket, concurrency, gate, AIMD.

    Attributes:
        ceiling_rps: the configured rate, or None when unknown.
        burst: token bucket size (default: one call plus 10 ms worth of the rate, so calls
            are spread smoothly; a provider that allows bursts can be given more).
        max_concurrency: provider calls in flight at once, or None.
    """

    ceiling_rps: float | None
    burst: float | None
    max_concurrency: int | None
    rate: float | None = None
    reference_rps: float | None = None
    tokens: float = 0.0
    refilled_at: float = 0.0
    in_flight: int = 0
    gate_until: float = 0.0
    backpressure_events: int = 0
    last_cut_at: float = -math.inf
    _grants: collections.deque[float] = attrs.field(factory=collections.deque)

    def __attrs_post_init__(self) -> None:
        self.rate = self.ceiling_rps
        self.reference_rps = self.ceiling_rps
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
        n = min(free, math.floor(self.tokens + TOKEN_EPSILON) if self.rate is not None else math.inf)
        return int(n) if n != math.inf else 1 << 30

    def take(self, n: int, now: float) -> None:
        """Record ``n`` grants at ``now``."""
        if self.rate is not None:
            self.tokens -= n
        self.in_flight += n
        self._grants.extend([now] * n)
        while self._grants and self._grants[0] < now - OBSERVE_WINDOW_S:
            self._grants.popleft()

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

    def observed_rps(self, now: float) -> float:
        """Admissions per second over the last :data:`OBSERVE_WINDOW_S`."""
        while self._grants and self._grants[0] < now - OBSERVE_WINDOW_S:
            self._grants.popleft()
        return len(self._grants) / OBSERVE_WINDOW_S

    def on_success(self, now: float) -> None:
        """Additive increase, never past the ceiling."""
        if self.rate is None or self.reference_rps is None:
            return
        step = AIMD_INCREASE_FRACTION * self.reference_rps / max(self.rate, AIMD_MIN_RPS)
        new = self.rate + step
        self.rate = min(new, self.ceiling_rps) if self.ceiling_rps is not None else new

    def on_backpressure(self, pause_s: float, jitter_s: float, now: float) -> None:
        """Close the gate for ``pause_s`` (+ jitter) and cut the rate multiplicatively."""
        self.backpressure_events += 1
        self.gate_until = max(self.gate_until, now + pause_s + jitter_s)
        if self.rate is not None and now < self.last_cut_at + AIMD_CUT_COOLDOWN_S:
            pass  # same congestion event: no second cut
        elif self.rate is None:
            measured = self.observed_rps(now)
            self.reference_rps = max(measured, AIMD_MIN_RPS * 10)
            self.rate = max(AIMD_MIN_RPS, self.reference_rps * AIMD_DECREASE)
            self.last_cut_at = now
        else:
            self.reference_rps = self.rate
            self.rate = max(AIMD_MIN_RPS, self.rate * AIMD_DECREASE)
            self.last_cut_at = now
        self.tokens = 0.0
        self.refilled_at = self.gate_until
