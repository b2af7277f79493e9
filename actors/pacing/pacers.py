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
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.pacing.pacer_state import BucketState
from actors.pacing.values import (
    PHASES,
    CircuitRecorded,
    Grant,
    Grown,
    Learnt,
    PacerSettings,
    PacerState,
    Paused,
    ProviderLimits,
)

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


def _num(x: float | None) -> str:
    return "0" if x is None else repr(float(x))


class Pacer(abc.ABC):
    """Pacing state of every (org, provider), kept atomically per call.

    Subclasses implement :meth:`_run` (one atomic step of the rules in
    :class:`~actors.pacing.pacer_state.BucketState`); the verbs below build its arguments and
    read its reply. Every method may be called from any thread or greenlet.

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

    @abc.abstractmethod
    def _run(self, org_id: str, provider: str, argv: list[str]) -> list[str]:
        """Apply one operation to (org, provider) atomically; the reply list."""

    def _argv(self, provider: str, op: str, *args: str) -> list[str]:
        lim = self.limits.get(provider) or ProviderLimits()
        burst = -1.0 if lim.burst is None else lim.burst
        ttl_ms = math.ceil(self.settings.state_ttl_s * 1000)
        head = [op, _num(lim.rate_rps), str(int(lim.slow_start)), repr(float(burst)), str(ttl_ms)]
        return [*head, repr(self.settings.use_window_s), *args]

    def _state(self, reply: Sequence[str], degraded: bool = False) -> dict[str, Any]:
        rate, ref = float(reply[1]), float(reply[2])
        return {
            "rate_rps": rate if rate > 0 else None,
            "reference_rps": ref if ref > 0 else None,
            "version": int(float(reply[3])),
            "slow_start": reply[4] == "1",
            "degraded": degraded,
        }

    def _reply(self, org_id: str, provider: str, argv: list[str]) -> tuple[list[str], bool]:
        return self._run(org_id, provider, argv), False

    def take(self, org_id: str, provider: str, n: int = 1, *, partial: bool = False) -> Grant:
        """Take ``n`` tokens of (org, provider)'s bucket, all or none (``partial``: as many
        as there are, up to ``n``), unless it is paused or its circuit refuses.

        Raises:
            ValueError: ``n`` < 1.
        """
        if n < 1:
            raise ValueError(f"take needs n >= 1, got {n}")
        s = self.settings
        argv = self._argv(provider, "take", str(n), "1" if partial else "0", "", repr(s.presence_s))
        argv.append(repr(s.probe_lease_s))
        reply, degraded = self._reply(org_id, provider, argv)
        wait = float(reply[6])
        return Grant(
            **self._state(reply, degraded),
            granted=int(float(reply[5])),
            wait_s=wait,
            verdict=reply[7],
            workers=int(reply[8]),
        )

    def pause(self, org_id: str, provider: str, pause_s: float, *, cut_version: int | None = None) -> Paused:
        """Pause (org, provider) for ``pause_s`` seconds (for every worker), its bucket left
        empty; with ``cut_version``, also cut the rate if no cut or set happened since that
        version (once per congestion event, as TCP NewReno cuts once per window, RFC 6582):
        an unpaced provider starts slow start, slow start ends at
        ``slow_start_decrease``, else the rate drops to ``decrease`` of itself."""
        s = self.settings
        cut = -1 if cut_version is None else cut_version
        argv = self._argv(provider, "pause", repr(max(0.0, float(pause_s))), str(cut), repr(s.decrease))
        argv += [repr(s.slow_start_decrease), repr(s.min_rps), repr(s.unpaced_start_rps)]
        reply, degraded = self._reply(org_id, provider, argv)
        return Paused(**self._state(reply, degraded), cut=reply[5] == "1", pause_s=float(reply[6]))

    def grow(self, org_id: str, provider: str, *, add_rps: float = 0.0, mul: float = 1.0) -> Grown:
        """Grow the rate to ``rate * mul + add_rps`` (capped at the provider's ``max_rps``),
        only while grants (every worker's) run at ``in_use_fraction`` of it or more
        (RFC 7661's rule for an unused window). Additive increase per successful call:
        summed over workers it grows as one process serving all their calls would."""
        lim = self.limits.get(provider) or ProviderLimits()
        argv = self._argv(provider, "grow", repr(float(add_rps)), repr(float(mul)), _num(lim.max_rps))
        argv.append(repr(self.settings.in_use_fraction))
        reply, degraded = self._reply(org_id, provider, argv)
        return Grown(**self._state(reply, degraded), grown=reply[5] == "1")

    def set_rate(
        self, org_id: str, provider: str, rate_rps: float | None, *, slow_start: bool = False
    ) -> PacerState:
        """Set the rate (None: unpaced) and its reference; bumps the version."""
        reply, degraded = self._reply(
            org_id, provider, self._argv(provider, "set", _num(rate_rps), str(int(slow_start)))
        )
        return PacerState(**self._state(reply, degraded))

    def record(self, org_id: str, provider: str, *, answered: int, unavailable: int) -> CircuitRecorded:
        """Outcomes of calls that ended, for the circuit (Nygard, *Release It!*): any
        ``answered`` closes it; ``unavailable`` ones (connection errors, 5xx, timeouts)
        open it after ``circuit_failures`` in a row, or again (for twice as long, up to
        ``circuit_open_max_s``) when the half-open probe fails; neither releases the
        probe claim (the probe was not sent)."""
        s = self.settings
        argv = self._argv(provider, "record", str(answered), str(unavailable), str(s.circuit_failures or 0))
        argv += [repr(s.circuit_open_s), repr(s.circuit_open_max_s)]
        reply, degraded = self._reply(org_id, provider, argv)
        return CircuitRecorded(**self._state(reply, degraded), opened=reply[5] == "1", open_s=float(reply[6]))

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
        lease_ms = str(math.ceil(self.settings.learner_lease_s * 1000))
        rate, slow, limit, phase, cuts = publish or (-1.0, False, None, "unpaced", 0)
        if phase not in PHASES:
            raise ValueError(f"unknown learner phase {phase!r}")
        argv = self._argv(
            provider, "learn", str(accepted), holder, lease_ms, repr(float(rate)), str(int(slow))
        )
        argv += [_num(limit), str(PHASES.index(phase)), str(cuts), repr(self.settings.in_use_fraction)]
        reply, degraded = self._reply(org_id, provider, argv)
        limit_rps = float(reply[12])
        return Learnt(
            **self._state(reply, degraded),
            leader=reply[5] == "1",
            accepted=round(float(reply[6])),
            events=int(float(reply[7])),
            event_ago_s=float(reply[8]),
            event_accepted=round(float(reply[9])),
            pause_in_s=float(reply[10]),
            in_use=reply[11] == "1",
            limit_rps=limit_rps if limit_rps > 0 else None,
            phase=PHASES[min(len(PHASES) - 1, max(0, int(float(reply[13]))))],
            cuts=int(float(reply[14])),
        )

    def state(self, org_id: str, provider: str) -> PacerState:
        """The bucket's state (creates it if absent)."""
        reply, degraded = self._reply(org_id, provider, self._argv(provider, "state"))
        return PacerState(**self._state(reply, degraded))

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

    def _run(self, org_id: str, provider: str, argv: list[str]) -> list[str]:
        with self._lock:
            state = self._states.get((org_id, provider))
            if state is None:
                state = self._states[(org_id, provider)] = BucketState()
            return state.run(argv, self.clock())

    def seed(
        self, org_id: str, provider: str, rate_rps: float | None, version: int,
        pause_s: float = 0.0, open_s: float = 0.0,
    ) -> None:  # fmt: skip
        """Start (org, provider) at ``rate_rps`` and ``version`` (a fallback taking over),
        paused for ``pause_s`` more seconds and with its circuit open ``open_s`` more
        (what the shared state said last: a pause or an open circuit outlives the outage)."""
        with self._lock:
            now = self.clock()
            rate = 0.0 if rate_rps is None else rate_rps
            self._states[(org_id, provider)] = BucketState(
                rate=rate, ref=rate, ver=version, used_at=now, fresh=False,
                pause=now + pause_s if pause_s > 0 else 0.0,
                c_open=now + open_s if open_s > 0 else 0.0, c_period=max(0.0, open_s),
            )  # fmt: skip

    def pending_pauses(self) -> list[tuple[tuple[str, str], float]]:
        """(org, provider) -> seconds left, for each bucket paused now."""
        with self._lock:
            now = self.clock()
            return [(key, st.pause - now) for key, st in self._states.items() if st.pause > now]

    def forget(self) -> None:
        """Drop every bucket."""
        with self._lock:
            self._states.clear()
