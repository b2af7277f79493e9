"""The constants of the pacing rules, Retry-After, and what a governor keeps per provider.

The rules themselves (GCRA take, pause and cut, growth, circuit) are
:class:`~actors.pacing.pacer_state.BucketState`, the one engine of every pacer; send gates
are in :mod:`actors.pacing.send_gate`. :class:`ProviderBucket` is a governor's bookkeeping
beside its pacer (concurrency, the pacer's last rate, the report's counters).
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
KEPT_PAUSES = 5
"""How many of the last pauses a bucket keeps for :func:`pacing_report`."""
MIN_WAKE_S = 1e-3
"""Shortest wait a governor announces, so a wake-up is never lost."""


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
    """What a governor keeps of one (org, provider) beside its pacer: its concurrency, the
    pacer's last word on the rate, and the counters of :func:`pacing_report`.

    The rules (rate, pauses, cuts, growth, circuit) are the pacer's
    (:class:`~actors.pacing.pacer_state.BucketState`); :class:`~actors.tool.Pacing`
    chooses how its rate starts:

    * stated (``ceiling_rps``): paced at :data:`PACE_MARGIN` of it and never above; each
      congestion event cuts it to :data:`AIMD_DECREASE` of itself and it grows back by
      :data:`AIMD_INCREASE_FRACTION` of its reference per second (AIMD).
    * unknown, with ``start_rps``: learnt by a :class:`~actors.pacing.learner.LimitLearner`:
      slow start, then a plateau just under the limit estimated from the responses the
      provider accepted, probed rarely and gently.
    * unknown, without ``start_rps`` (unpaced): no rate until the first 429, which starts
      slow start from half the rate calls were granted at (never under
      :data:`SLOW_START_RPS`).

    Attributes:
        ceiling_rps: the stated rate (requests per second), or None when unknown.
        burst: the stated burst (None: one call plus 10 ms worth of the rate).
        max_concurrency: provider calls in flight at once, or None.
        start_rps: where slow start begins when the rate is unknown (None: unpaced).
        rate: the pacing rate as the pacer last said, requests per second (None: unpaced).
        slow_start: whether that rate is in slow start.
        in_flight: slots granted and not yet given back (nested calls' aside).
        nested_out: slots granted to nested calls (outside the ceiling), not yet back.
        gate_until: no send before this (governor clock, seconds): the last pause's end.
        backpressure_events: 429s reported.
        learner: the unknown limit's state (None when the rate is stated or announced).
        announced: the rate is the provider's, as its answers announce it
            (:meth:`~actors.governor.decisions.GovernorPacing.announced`): ``ceiling_rps``
            is the announced limit, and the learner is gone.
        admission_wait_s: seconds waiters (tool queues) waited for this bucket's grants
            (pacing, pauses), each wait counted once when granted, added up over the
            waiters.
        cuts: congestion events this process's 429s cut the rate for (a shared
            pacer's cuts made by other workers, or in earlier runs, are not counted).
        pauses: the last Retry-After pauses, ``(at, pause_s, raw Retry-After)``, newest last.
        circuit_opened: times the circuit opened on this process's outcomes.
        circuit_until: the circuit is open until this (governor clock; then half-open),
            or None: closed.
    """

    ceiling_rps: float | None
    burst: float | None
    max_concurrency: int | None
    start_rps: float | None = None
    rate: float | None = None
    slow_start: bool = False
    in_flight: int = 0
    nested_out: int = 0
    gate_until: float = 0.0
    backpressure_events: int = 0
    learner: LimitLearner | None = None
    admission_wait_s: float = 0.0
    cuts: int = 0
    pauses: list[tuple[float, float, str | None]] = attrs.field(factory=list)
    circuit_opened: int = 0
    circuit_until: float | None = None
    announced: bool = False

    def __attrs_post_init__(self) -> None:
        if self.ceiling_rps is not None:
            self.rate = self.ceiling_rps * PACE_MARGIN
        else:
            self.learner = LimitLearner(rate=self.start_rps)
            self.rate, self.slow_start = self.start_rps, self.start_rps is not None

    def paused(self, now: float, pause_s: float, retry_after: str | float | None) -> None:
        """A 429 at ``now`` paused sends for ``pause_s`` seconds (``retry_after``: the raw
        header, kept for :func:`pacing_report`)."""
        self.backpressure_events += 1
        self.gate_until = max(self.gate_until, now + pause_s)
        self.pauses.append((now, pause_s, None if retry_after is None else str(retry_after)))
        del self.pauses[:-KEPT_PAUSES]

    def circuit(self, now: float) -> str:
        """The circuit as this process last heard of it: ``closed``, ``open`` or ``half_open``."""
        if self.circuit_until is None:
            return "closed"
        return "open" if now < self.circuit_until else "half_open"


def how_learnt(bucket: ProviderBucket) -> str:
    """How the bucket's rate was set: ``stated``, ``announced`` (by the provider's answers),
    ``aimd`` (a stated rate cut by 429s and growing back), ``unpaced``, ``slow_start``,
    ``plateau`` or ``probe``."""
    if bucket.announced:
        return "announced"
    if bucket.learner is not None:
        return bucket.learner.phase
    assert bucket.ceiling_rps is not None and bucket.rate is not None
    return "stated" if bucket.rate >= bucket.ceiling_rps * PACE_MARGIN * (1 - 1e-9) else "aimd"


def pacing_report(
    buckets: Mapping[tuple[str, str], ProviderBucket],
    now: float,
    gate_waits: Mapping[tuple[str, str], float] | None = None,
    held: Mapping[tuple[str, str], float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Pacing per (org, provider), keyed ``"org/provider"`` (a pure snapshot).

    Args:
        buckets: the governor's state, keyed (org, provider).
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
        add up, so it can exceed the time elapsed), ``in_flight`` (its calls holding a slot
        now: sent, or about to be).
    """
    out: dict[str, dict[str, Any]] = {}
    for key, bucket in buckets.items():
        learner = bucket.learner
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
            "circuit": bucket.circuit(now),
            "circuit_opened": bucket.circuit_opened,
            "held_s": (held or {}).get(key, 0.0),
            "waited_s": bucket.admission_wait_s + (gate_waits or {}).get(key, 0.0),
            "in_flight": bucket.in_flight,
        }
    return out
