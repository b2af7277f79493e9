"""Pacers: the pacing state of each (org, provider), in this process or shared through Redis.

A :class:`Pacer` keeps, per (org, provider): a GCRA token bucket (take ``n`` tokens at the
current rate and burst, ITU-T I.371's Generic Cell Rate Algorithm with a burst
tolerance), the current AIMD rate (set, cut once per congestion event, grown), a
Retry-After pause, and the provider's circuit (open until, one half-open probe at a
time). Two pacers have the same semantics (one conformance suite runs on both):

* :class:`LocalPacer`: in this process (thread-safe; a plain lock, gevent's when patched);
* :class:`~actors.pacing.redis_pacer.RedisPacer` (made by
  :func:`~actors.pacing.pacer_url.open_pacer`): shared by
  every worker process pointed at the same Redis, so N workers together stay within a
  provider's limit and one worker's 429 pauses them all. Each call is one round trip
  (EVALSHA of one Lua script), atomic, timed by Redis's clock, and leaves every key with
  a TTL. When Redis is unreachable, calls fail over at once (short timeouts) to a local
  share of the rate (see :class:`~actors.pacing.redis_pacer.RedisPacer`) and rejoin when it is
  back.

All times are float seconds, relative to the moment of the call (``wait_s``), so pacers
never mix their clocks with the caller's.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from actors.checks import check_weight
from actors.pacing.announced import Announcement
from actors.pacing.pacer_state import BucketState
from actors.pacing.quotas import (
    Announce,
    Correct,
    GiveBack,
    QuotaOp,
    QuotaRead,
    QuotaState,
    TakeUnits,
    UnitsTaken,
)
from actors.pacing.values import (
    PHASES,
    CircuitRecorded,
    Grant,
    Grow,
    Grown,
    Learn,
    Learnt,
    PacerOp,
    PacerSettings,
    PacerState,
    Pause,
    Paused,
    ProviderLimits,
    ReadState,
    Record,
    SetRate,
    Take,
)
from actors.stats import Outages
from actors.tool import Limit

__all__ = [
    "CircuitRecorded",
    "Grant",
    "Grown",
    "Learnt",
    "LocalPacer",
    "Pacer",
    "PacerSettings",
    "PacerState",
    "Paused",
    "ProviderLimits",
]

R = TypeVar("R", bound=PacerState)


class Pacer(abc.ABC):
    """Pacing state of every (org, provider), kept atomically per call.

    Subclasses implement :meth:`apply` (one atomic step of the rules of
    :class:`~actors.pacing.pacer_state.BucketState` on one bucket); the verbs below make
    the operation and type its reply. Every method may be called from any thread or
    greenlet.

    Args:
        limits: provider name -> how its bucket starts (others start unpaced).
        settings: the shared rules.
    """

    backend = "abstract"

    def __init__(
        self, limits: Mapping[str, ProviderLimits] | None = None, settings: PacerSettings | None = None
    ) -> None:
        self.limits = dict(limits or {})
        self.settings = settings or PacerSettings()
        self.unit_limits: dict[str, tuple[Limit, ...]] = {}
        """Provider name -> the limits its quota state keeps: those stated
        (``Pacing.unit_limits``; of every system sharing this pacer, each limit once), then
        those its provider announced (:attr:`announced_limits`)."""
        self.announced_limits: dict[str, tuple[Limit, ...]] = {}
        """Provider name -> the limits of :attr:`unit_limits` its provider announced (not stated)."""
        self.outage_log = Outages()
        """Outages of the service holding a shared pacer's state, as this process's calls
        saw them (service ``"pacer"``; a pacer in this process has none)."""

    def limits_of(self, provider: str) -> ProviderLimits:
        """How ``provider``'s bucket starts (unpaced when it has no limits)."""
        return self.limits.get(provider) or ProviderLimits()

    @abc.abstractmethod
    def apply(self, org_id: str, provider: str, op: PacerOp) -> PacerState:
        """Apply ``op`` to (org, provider)'s bucket atomically; the reply of ``op``'s kind
        (see :meth:`~actors.pacing.pacer_state.BucketState.handle`)."""

    def _apply(self, org_id: str, provider: str, op: PacerOp, kind: type[R]) -> R:
        reply = self.apply(org_id, provider, op)
        if not isinstance(reply, kind):
            raise TypeError(f"{type(self).__name__}.apply({op!r}) answered {reply!r}")
        return reply

    def take(
        self, org_id: str, provider: str, n: int = 1, *, partial: bool = False, nested: bool = False,
        key: str | None = None, weight: float = 1.0,
    ) -> Grant:  # fmt: skip
        """Take ``n`` tokens of (org, provider)'s bucket, all or none (``partial``: as many
        as there are, up to ``n``), unless it is paused or its circuit refuses (``nested``:
        for a nested call, which a half-open circuit's probe out does not hold back).

        ``key`` (a run, a customer) takes a fair share: while other keys that took within
        ``fair_window_s`` want more than they were granted, its takes also keep to the
        rate times ``weight`` over its weight plus theirs; alone, it may use the whole
        rate (see :class:`~actors.pacing.pacer_state.BucketState`). None: the rate alone.

        Raises:
            ValueError: ``n`` < 1, or ``weight`` out of :func:`~actors.checks.check_weight`'s range.
        """
        if n < 1:
            raise ValueError(f"take needs n >= 1, got {n}")
        op = Take(n=n, partial=partial, nested=nested, key=key, weight=check_weight("weight", weight))
        return self._apply(org_id, provider, op, Grant)

    def pause(self, org_id: str, provider: str, pause_s: float, *, cut_version: int | None = None) -> Paused:
        """Pause (org, provider) for ``pause_s`` seconds (for every worker), its bucket left
        empty; with ``cut_version``, also cut the rate if no cut or set happened since that
        version (once per congestion event, as TCP NewReno cuts once per window, RFC 6582):
        an unpaced provider starts slow start, slow start ends at
        ``slow_start_decrease``, else the rate drops to ``decrease`` of itself."""
        op = Pause(pause_s=max(0.0, float(pause_s)), cut_version=cut_version)
        return self._apply(org_id, provider, op, Paused)

    def grow(self, org_id: str, provider: str, *, add_rps: float = 0.0, mul: float = 1.0) -> Grown:
        """Grow the rate to ``rate * mul + add_rps`` (capped at the provider's ``max_rps``),
        only while grants (every worker's) run at ``in_use_fraction`` of it or more
        (RFC 7661's rule for an unused window). Additive increase per successful call:
        summed over workers it grows as one process serving all their calls would."""
        return self._apply(org_id, provider, Grow(add_rps=float(add_rps), mul=float(mul)), Grown)

    def set_rate(
        self, org_id: str, provider: str, rate_rps: float | None, *, slow_start: bool = False
    ) -> PacerState:
        """Set the rate (None: unpaced) and its reference; bumps the version."""
        return self._apply(org_id, provider, SetRate(rate_rps=rate_rps, slow_start=slow_start), PacerState)

    def record(self, org_id: str, provider: str, *, answered: int, unavailable: int) -> CircuitRecorded:
        """Outcomes of calls that ended, for the circuit (Nygard, *Release It!*): any
        ``answered`` closes it; ``unavailable`` ones (connection errors, 5xx, timeouts)
        open it after ``circuit_failures`` in a row, or again (for twice as long, up to
        ``circuit_open_max_s``) when the half-open probe fails; neither releases the
        probe claim (the probe was not sent)."""
        op = Record(answered=answered, unavailable=unavailable)
        return self._apply(org_id, provider, op, CircuitRecorded)

    def learn(
        self,
        org_id: str,
        provider: str,
        accepted: int,
        holder: str,
        publish: tuple[float, bool, float | None, str, int] | None = None,
    ) -> Learnt:
        """Add ``accepted`` responses to the shared count; renew (or take, when free or
        lapsed) the learner lease for ``holder`` (``""``: only read); and, when the
        caller holds it, ``publish`` = (rate, slow start, limit estimate, phase, cuts):
        the rate every worker paces at from now on (no version bump: only a congestion
        event makes one, see :meth:`pause`). One round trip.

        Raises:
            ValueError: ``accepted`` < 0 or an unknown phase.
        """
        if accepted < 0:
            raise ValueError(f"learn needs accepted >= 0, got {accepted}")
        if publish is not None and publish[3] not in PHASES:
            raise ValueError(f"unknown learner phase {publish[3]!r}")
        return self._apply(org_id, provider, Learn(accepted=accepted, holder=holder, publish=publish), Learnt)

    def apply_quota(self, org_id: str, provider: str, op: QuotaOp) -> QuotaRead:
        """Apply ``op`` to (org, provider)'s quota state atomically (see
        :class:`~actors.pacing.quotas.QuotaState`)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no quota state")

    def take_units(self, org_id: str, provider: str, requests: Sequence[Mapping[str, float]]) -> UnitsTaken:
        """Take the units of up to ``len(requests)`` requests (each: unit -> estimate) from
        every limit of ``provider`` (all or none per request; as many requests as fit, from
        the first). Take these before the request rate's tokens, and give back with
        :meth:`give_back_units` those of requests the rate did not grant, so neither
        overshoots."""
        reply = self.apply_quota(org_id, provider, TakeUnits(requests=tuple(requests)))
        assert isinstance(reply, UnitsTaken)
        return reply

    def give_back_units(
        self, org_id: str, provider: str, units: Mapping[str, float], age_s: float = 0.0
    ) -> QuotaRead:
        """Give back ``units`` (summed; ``"requests"``: how many) of requests granted
        ``age_s`` seconds ago and never sent."""
        return self.apply_quota(org_id, provider, GiveBack(units=dict(units), age_s=age_s))

    def correct_units(
        self, org_id: str, provider: str, delta: Mapping[str, float], age_s: float = 0.0
    ) -> QuotaRead:
        """Correct the units of answered requests granted ``age_s`` seconds ago by
        ``delta`` (real use less the estimate, per unit)."""
        return self.apply_quota(org_id, provider, Correct(delta=dict(delta), age_s=age_s))

    def announce(
        self, org_id: str, provider: str, announcement: Announcement, sent_ago_s: float = 0.0
    ) -> QuotaRead | None:
        """Set a quota's remaining units and reset from a provider's ``announcement`` made
        in its answer to a request sent ``sent_ago_s`` seconds ago (units granted since
        are taken from it); None when it states no remaining count and reset."""
        a = announcement
        if a.remaining is None or a.reset_s is None:
            return None
        op = Announce(
            unit=a.unit, remaining=a.remaining, reset_s=a.reset_s, sent_ago_s=sent_ago_s, window_s=a.window_s
        )
        return self.apply_quota(org_id, provider, op)

    def state(self, org_id: str, provider: str) -> PacerState:
        """The bucket's state (creates it if absent)."""
        return self._apply(org_id, provider, ReadState(), PacerState)

    def snapshot(self) -> dict[str, Any]:
        """What the pacer is (for stats): ``backend``, ``degraded``."""
        return {"backend": self.backend, "degraded": False}

    def wall_time(self, fallback: float) -> float:
        """The clock every worker sharing this pacer agrees on, epoch seconds (an HTTP-date
        Retry-After is read against it, so one worker's clock does not set the pause for
        all); ``fallback`` (this host's) when the pacer has none or cannot answer."""
        return fallback

    def close(self) -> None:  # noqa: B027 - a hook: only pacers with connections need it
        """Release connections (idempotent)."""


class LocalPacer(Pacer):
    """The pacer of one process.

    Args:
        clock: seconds, monotonic (fake clocks welcome in tests).
    """

    backend = "local"

    def __init__(
        self,
        limits: Mapping[str, ProviderLimits] | None = None,
        settings: PacerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(limits, settings)
        self.clock = clock
        self._lock = threading.Lock()
        self._states: dict[tuple[str, str], BucketState] = {}
        self._quotas: dict[tuple[str, str], QuotaState] = {}

    def apply_quota(self, org_id: str, provider: str, op: QuotaOp) -> QuotaRead:
        """Apply ``op`` to (org, provider)'s :class:`~actors.pacing.quotas.QuotaState`
        under this pacer's lock, at its clock's now."""
        with self._lock:
            limits = self.unit_limits.get(provider, ())
            state = self._quotas.get((org_id, provider))
            if state is None:  # (kept per limit: limits added later find theirs, or start)
                state = self._quotas[(org_id, provider)] = QuotaState()
            return state.handle(op, self.clock(), limits)

    def apply(self, org_id: str, provider: str, op: PacerOp) -> PacerState:
        """Apply ``op`` to (org, provider)'s :class:`~actors.pacing.pacer_state.BucketState`
        under this pacer's lock, at its clock's now."""
        with self._lock:
            state = self._states.get((org_id, provider))
            if state is None:
                state = self._states[(org_id, provider)] = BucketState()
            return state.handle(op, self.clock(), self.limits_of(provider), self.settings)

    def seed(
        self, org_id: str, provider: str, rate_rps: float | None, version: int,
        pause_s: float = 0.0, open_s: float = 0.0, first_s: float | None = None,
        phase: float | None = None,
    ) -> None:  # fmt: skip
        """Start (org, provider) at ``rate_rps`` and ``version`` (a fallback taking over),
        paused for ``pause_s`` more seconds and with its circuit open ``open_s`` more
        (what the shared state said last: a pause or an open circuit outlives the outage).

        ``first_s``: the bucket starts empty, its first token ``first_s`` seconds from now
        (None: full). ``phase``: grants keep to the points ``phase + j / rate`` of this
        pacer's clock (see :attr:`BucketState.phase`)."""
        with self._lock:
            now = self.clock()
            rate = 0.0 if rate_rps is None else rate_rps
            tat = 0.0
            if first_s is not None and rate > 0:
                lim = self.limits_of(provider)
                burst = max(1.0, lim.burst if lim.burst is not None else 1 + rate / 100)
                tat = now + max(0.0, first_s) + (burst - 1) / rate
            self._states[(org_id, provider)] = BucketState(
                tat=tat, rate=rate, ref=rate, ver=version, used=0.0, used_at=now, fresh=False,
                pause=now + pause_s if pause_s > 0 else 0.0,
                c_open=now + open_s if open_s > 0 else 0.0, c_period=max(0.0, open_s),
                phase=phase if rate > 0 else None,
            )  # fmt: skip

    def bucket_state(self, org_id: str, provider: str) -> BucketState | None:
        """A copy of (org, provider)'s state (None: no bucket)."""
        with self._lock:
            state = self._states.get((org_id, provider))
            return None if state is None else attrs.evolve(state)

    def forget(self) -> None:
        """Drop every bucket."""
        with self._lock:
            self._states.clear()
            self._quotas.clear()
