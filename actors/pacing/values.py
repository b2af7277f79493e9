"""Value classes of the pacers (see :mod:`actors.pacing.pacers`): limits, settings, the
operations a pacer applies to one bucket, and its replies."""

from __future__ import annotations

from typing import Any

import attrs

from actors.pacing.bucket import (
    AIMD_DECREASE,
    AIMD_MIN_RPS,
    PACE_MARGIN,
    SLOW_START_EXIT_DECREASE,
    SLOW_START_RPS,
)
from actors.tool import Pacing, Policy

__all__ = [
    "PHASES",
    "CircuitRecorded",
    "Grant",
    "Grow",
    "Grown",
    "Learn",
    "Learnt",
    "PacerOp",
    "PacerSettings",
    "PacerState",
    "Pause",
    "Paused",
    "ProviderLimits",
    "ReadState",
    "Record",
    "Rejoin",
    "SetRate",
    "Take",
]


@attrs.frozen(kw_only=True)
class ProviderLimits:
    """How a provider's bucket starts; the state then lives in the pacer.

    Attributes:
        rate_rps: initial pacing rate, requests per second (None: unpaced until a 429).
        burst: tokens the bucket holds (None: one call plus 10 ms worth of the rate).
        max_rps: growth never passes this (None: no cap).
        slow_start: whether the initial rate is in slow start (an unknown rate).
    """

    rate_rps: float | None = None
    burst: float | None = None
    max_rps: float | None = None
    slow_start: bool = False

    @classmethod
    def from_pacing(cls, pacing: Pacing) -> ProviderLimits:
        """How a provider's :class:`~actors.tool.Pacing` starts: a stated rate paced at
        :data:`~actors.pacing.bucket.PACE_MARGIN` of itself and never above, else slow start
        from ``start_rps``, else unpaced."""
        if pacing.rps is not None:
            rate = pacing.rps * PACE_MARGIN
            return cls(rate_rps=rate, burst=pacing.burst, max_rps=rate)
        if pacing.start_rps is not None:
            return cls(rate_rps=pacing.start_rps, burst=pacing.burst, slow_start=True)
        return cls(burst=pacing.burst)


@attrs.frozen(kw_only=True)
class PacerSettings:
    """Rules shared by every bucket of a pacer (defaults: the constants of
    :mod:`actors.pacing.bucket`; the circuit's from :class:`~actors.tool.Policy`)."""

    decrease: float = AIMD_DECREASE
    """A congestion event cuts the rate to this share of itself."""
    slow_start_decrease: float = SLOW_START_EXIT_DECREASE
    """...or to this share when it ends slow start."""
    min_rps: float = AIMD_MIN_RPS
    """The rate is never cut below this."""
    unpaced_start_rps: float = SLOW_START_RPS
    """An unpaced provider's first 429 starts slow start from max(this, half its use)."""
    use_window_s: float = 0.5
    """Time constant of the moving average of grants (all workers' grants when shared)."""
    in_use_fraction: float = 0.5
    """The rate grows only while grants run at no less than this share of it."""
    circuit_failures: int | None = 5
    """Consecutive unavailable outcomes that open a circuit (None: never)."""
    circuit_open_s: float = 5.0
    circuit_open_max_s: float = 60.0
    probe_lease_s: float = 30.0
    """A half-open probe claim lapses after this, so a worker that died while probing does
    not keep the circuit half-open forever."""
    state_ttl_s: float = 3600.0
    """Idle buckets are forgotten (Redis keys expire) this long after their last write."""
    presence_s: float = 10.0
    """A worker counts as sharing a bucket for this long after its last take."""
    away_s: float = 3.0
    """When a worker rejoins the shared state after pacing locally, the workers it saw
    before are presumed still local (each at its share of the rate) for at most this long
    after the first of them rejoins, or until each rejoins: meanwhile the workers on
    Redis take only the rest of the rate."""
    learner_lease_s: float = 3.0
    """The learner lease of a provider whose limit is unknown lapses this long after its
    holder's last :meth:`~actors.pacing.pacers.Pacer.learn` (a dead or idle holder is
    replaced by the next worker that learns)."""
    fair_window_s: float = 1.0
    """A fairness key (:attr:`Take.key`) counts as contending for its share of the rate for
    this long after its last take; an idle key's share is lent to the others after it."""

    @classmethod
    def from_policy(cls, policy: Policy, **overrides: Any) -> PacerSettings:
        """The circuit settings of a dispatcher's :class:`~actors.tool.Policy`, the rest default."""
        return cls(
            circuit_failures=policy.circuit_failures,
            circuit_open_s=policy.circuit_open_s,
            circuit_open_max_s=policy.circuit_open_max_s,
            **overrides,
        )


@attrs.frozen(kw_only=True)
class PacerState:
    """A bucket's shared state as of a call.

    Attributes:
        rate_rps: the current rate, requests per second (None: unpaced).
        reference_rps: the rate just before the last cut (the last known limit).
        version: bumped by every cut and every :meth:`Pacer.set_rate`; pass the version a
            429'd request was granted under to :meth:`Pacer.pause` so that several 429s of
            one congestion event (from any worker) cut once.
        slow_start: whether the rate is in slow start.
        degraded: the answer came from the local fallback (Redis unreachable).
    """

    rate_rps: float | None
    reference_rps: float | None
    version: int
    slow_start: bool
    degraded: bool = False


@attrs.frozen(kw_only=True)
class Grant(PacerState):
    """Reply to :meth:`Pacer.take`.

    Attributes:
        granted: tokens taken (0: none; then ``wait_s`` says when to try again).
        wait_s: seconds until a take could succeed (when refused: a lower bound; infinity
            when ``n`` exceeds the burst); after a grant, until the next token.
        verdict: ``"go"``; ``"probe"`` (granted 1 token as the circuit's half-open probe:
            report its outcome with :meth:`Pacer.record`); ``"wait"`` (no token yet, or
            another worker's probe is out); ``"paused"`` (a Retry-After pause);
            ``"refuse"`` (the circuit is open for ``wait_s`` more seconds).
        workers: workers seen taking from this bucket in the last ``presence_s``.
        owed_s: seconds of the rate the bucket's grants are ahead of now (its theoretical
            arrival time less now; 0 when it is unpaced or has tokens to spare): what a
            worker that falls back to a local share of the rate starts from.
        rank: this worker's place among those workers by name (0-based), so that their
            local shares can be paced out of phase.
    """

    granted: int
    wait_s: float
    verdict: str
    workers: int = 1
    owed_s: float = 0.0
    rank: int = 0


@attrs.frozen(kw_only=True)
class Paused(PacerState):
    """Reply to :meth:`Pacer.pause`: ``cut`` (this call cut the rate), ``pause_s`` (left)."""

    cut: bool
    pause_s: float


@attrs.frozen(kw_only=True)
class Grown(PacerState):
    """Reply to :meth:`Pacer.grow`: ``grown`` (the rate changed)."""

    grown: bool


@attrs.frozen(kw_only=True)
class CircuitRecorded(PacerState):
    """Reply to :meth:`Pacer.record`: ``opened`` (this call opened the circuit; exactly
    one caller per opening sees it), ``open_s`` (seconds it stays open, 0 if closed)."""

    opened: bool
    open_s: float


PHASES = ("unpaced", "slow_start", "plateau", "probe")
"""The phases of :class:`~actors.pacing.learner.LimitLearner`, by their number in the pacer."""


@attrs.frozen(kw_only=True)
class Learnt(PacerState):
    """Reply to :meth:`Pacer.learn`: what an unknown limit is learnt from, every worker's.

    Attributes:
        leader: the caller holds the learner lease (it learns and publishes the rate).
        accepted: responses accepted so far, every worker's (a running count).
        events: congestion events so far (pauses that cut the rate).
        event_ago_s: seconds since the last event (meaningless while ``events`` is 0).
        event_accepted: ``accepted`` when the last event happened.
        pause_in_s: seconds until the shared pause ends (negative: it ended that long ago).
        in_use: grants (every worker's) run at ``in_use_fraction`` of the rate or more.
        limit_rps: the limit estimate the learner published (None: none yet).
        phase: the learner's phase as published (one of :data:`PHASES`).
        cuts: congestion events the learner cut for, as published.
    """

    leader: bool
    accepted: int
    events: int
    event_ago_s: float
    event_accepted: int
    pause_in_s: float
    in_use: bool
    limit_rps: float | None
    phase: str
    cuts: int


# --- operations: what a pacer applies to one (org, provider) bucket, atomically -------------


@attrs.frozen(kw_only=True)
class Take:
    """Take ``n`` tokens, all or none (``partial``: as many as there are, up to ``n``);
    replied with a :class:`Grant`."""

    n: int
    """Tokens wanted (at least 1)."""
    partial: bool = False
    """Grant fewer than ``n`` when fewer are there."""
    nested: bool = False
    """A nested call's take: not held back by a half-open circuit's probe out (the probe
    may be its parent, waiting on it); it may be the probe itself."""
    key: str | None = None
    """The fairness key taking (a run, a customer): while other keys want more than they
    are granted, its takes also keep to its weighted share of the rate (None: no share,
    only the bucket's rate; see :class:`~actors.pacing.pacer_state.BucketState`)."""
    weight: float = 1.0
    """``key``'s weight among the keys contending (> 0, finite)."""


@attrs.frozen(kw_only=True)
class Pause:
    """Pause the bucket for ``pause_s`` seconds, its tokens spent; cut the rate once per
    congestion event; replied with :class:`Paused`."""

    pause_s: float
    """Seconds, at least 0."""
    cut_version: int | None = None
    """The rate version the 429'd request was granted under (None: pause only)."""


@attrs.frozen(kw_only=True)
class Grow:
    """Grow the rate to ``rate * mul + add_rps`` (capped at the provider's ``max_rps``) while
    grants run at ``in_use_fraction`` of it; replied with :class:`Grown`."""

    add_rps: float = 0.0
    """Requests per second added."""
    mul: float = 1.0
    """Factor the rate is multiplied by first."""


@attrs.frozen(kw_only=True)
class SetRate:
    """Set the rate and its reference, bump the version; replied with :class:`PacerState`."""

    rate_rps: float | None
    """Requests per second (None: unpaced)."""
    slow_start: bool = False
    """Whether the new rate is in slow start."""


@attrs.frozen(kw_only=True)
class Record:
    """Outcomes of calls that ended, for the circuit; replied with :class:`CircuitRecorded`."""

    answered: int
    """Calls the provider answered (any answer closes the circuit)."""
    unavailable: int
    """Calls that found it unavailable (connection errors, 5xx, timeouts)."""


@attrs.frozen(kw_only=True)
class Learn:
    """Count accepted responses, renew or take the learner lease, publish what the learner
    learnt; replied with :class:`Learnt`."""

    accepted: int
    """Responses accepted since the last call (at least 0)."""
    holder: str
    """Who asks for the learner lease (``""``: nobody, only read)."""
    publish: tuple[float, bool, float | None, str, int] | None = None
    """(rate, slow start, limit estimate, phase, cuts) to publish when ``holder`` holds the
    lease (None: publish nothing)."""


@attrs.frozen(kw_only=True)
class Rejoin:
    """A worker that paced locally while the shared state was away hands over what it did
    meanwhile; replied with :class:`PacerState`."""

    spent: float = 0.0
    """Tokens its local bucket still owed (granted ahead of its local rate): the shared
    bucket's grants move that far ahead too."""
    pause_s: float = 0.0
    """Seconds left of a pause it took locally (0: none)."""
    rate_rps: float | None = None
    """The rate it learnt locally (cut by a 429), scaled to every worker's: the shared
    rate drops to it when higher (None: nothing learnt)."""
    away: int = 0
    """Other workers it saw before, presumed still pacing locally."""
    share: float = 1.0
    """The share of the rate each worker paced at locally."""
    since_s: float = 0.0
    """How long it paced locally (seconds before now): a worker that went local before
    the first one back came back is counted among those presumed local."""


@attrs.frozen(kw_only=True)
class ReadState:
    """Read the bucket (creating it if absent); replied with :class:`PacerState`."""


PacerOp = Take | Pause | Grow | SetRate | Record | Learn | Rejoin | ReadState
"""Any operation a :class:`~actors.pacing.pacers.Pacer` applies to a bucket."""
