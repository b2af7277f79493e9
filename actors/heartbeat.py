"""The heartbeat ticker: renews the leases of running receipts.

:class:`LeaseSet` is the plain state machine (registrations, when each is due, which
are past their hard deadline); :class:`HeartbeatActor` ticks it on a timer and performs
the renewals through the receipt store actor. A renewal refused by fencing means the
lease is lost (expired and taken): the registration's ``lost`` event is set, so its
owner refuses to complete and its callers get :class:`LeaseLostError`.

Threads: every method runs on the heartbeat actor's thread (a greenlet under gevent);
a tool blocking its own worker never delays the ticks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import pykka

from stores.types import LeaseRef, Owner

from ._runtime import Timers, guarded, log
from .messages import HeartbeatTick, RegisterLeases, UnregisterLeases

__all__ = ["HeartbeatActor", "LeaseSet", "Renewal"]


@attrs.define
class _Entry:
    reg: RegisterLeases
    interval_s: float
    next_due: float
    leases: dict[str, LeaseRef]
    """Receipt key -> lease, still renewed."""


@attrs.frozen
class Renewal:
    """One bulk renewal to perform."""

    token: int
    org_id: str
    owner: Owner
    leases: tuple[LeaseRef, ...]
    lease_ttl_s: float


class LeaseSet:
    """Which leases to renew, and when.

    Args:
        interval_for: ``interval_for(lease_ttl_s) -> seconds`` between renewals.
    """

    def __init__(self, interval_for: Callable[[float], float]) -> None:
        self.interval_for = interval_for
        self.entries: dict[int, _Entry] = {}
        self.token_of: dict[str, int] = {}
        """Receipt key -> the registration that renews it."""
        self.renewals = 0
        self.lost_keys: list[str] = []

    def register(self, reg: RegisterLeases, now: float) -> None:
        """Start renewing ``reg.leases`` one interval from ``now``."""
        interval = self.interval_for(reg.lease_ttl_s)
        self.entries[reg.token] = _Entry(
            reg, interval, now + interval, {lease.key: lease for lease in reg.leases}
        )
        for lease in reg.leases:
            self.token_of[lease.key] = reg.token

    def unregister(self, token: int, keys: tuple[str, ...] | None = None) -> None:
        """Stop renewing a registration (its call ended), or only ``keys`` of any registration."""
        if keys is None:
            entry = self.entries.pop(token, None)
            for key in entry.leases if entry is not None else ():
                self.token_of.pop(key, None)
            return
        for key in keys:  # O(1) a key: the index says which registration holds it
            found = self.entries.get(self.token_of.pop(key, -1))
            if found is not None:
                found.leases.pop(key, None)
                if not found.leases:
                    del self.entries[found.reg.token]

    def retry_soon(self, token: int, now: float) -> None:
        """A renewal failed (a store hiccup): try again in a quarter interval, well before
        the lease lapses (renewals run every third of the TTL)."""
        entry = self.entries.get(token)
        if entry is not None:
            entry.next_due = min(entry.next_due, now + entry.interval_s / 4.0)

    def due(self, now: float) -> list[Renewal]:
        """Renewals due at ``now``; registrations past their deadline are dropped."""
        out = []
        for token, entry in list(self.entries.items()):
            if now >= entry.reg.deadline:
                del self.entries[token]
                continue
            if now >= entry.next_due:
                entry.next_due = now + entry.interval_s
                reg = entry.reg
                out.append(
                    Renewal(token, reg.org_id, reg.owner, tuple(entry.leases.values()), reg.lease_ttl_s)
                )
        return out

    def refused(self, token: int, keys: set[str]) -> RegisterLeases | None:
        """Drop lost leases from a registration; returns the registration (or None)."""
        entry = self.entries.get(token)
        if entry is None or not keys:
            return None
        for key in keys:
            entry.leases.pop(key, None)
            self.token_of.pop(key, None)
        self.lost_keys.extend(sorted(keys))
        if not entry.leases:
            del self.entries[token]
        return entry.reg

    def next_tick(self, now: float) -> float | None:
        """When to tick next (None when nothing is registered)."""
        if not self.entries:
            return None
        return min(min(e.next_due, e.reg.deadline) for e in self.entries.values())


class HeartbeatActor(pykka.ThreadingActor):
    """Ticks a :class:`LeaseSet` and renews through the receipt store actor.

    Args:
        store: proxy of the :class:`~actors.receipt_store.ReceiptStoreActor` (which
            never waits on this actor, so waiting on its futures here is safe).
        interval_for: seconds between renewals for a lease TTL.
        timers: the system's timer thread.
    """

    def __init__(
        self,
        store: Any,
        interval_for: Callable[[float], float],
        timers: Timers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.store = store
        self.leases = LeaseSet(interval_for)
        self.timers = timers
        self.clock = clock
        self._armed: float | None = None
        self.failures = 0
        """Renewals that raised (each retried)."""

    @guarded
    def on_receive(self, message: Any) -> Any:
        now = self.clock()
        if isinstance(message, RegisterLeases):
            self.leases.register(message, now)
        elif isinstance(message, UnregisterLeases):
            self.leases.unregister(message.token, message.keys)
        elif isinstance(message, HeartbeatTick):
            self._armed = None
            self._renew(now)
        self._arm(now)
        return None

    def _renew(self, now: float) -> None:
        for renewal in self.leases.due(now):
            try:
                report = self.store.renew_leases(
                    renewal.org_id, list(renewal.leases), renewal.owner, lease_ttl_s=renewal.lease_ttl_s
                ).get()
            except Exception as exc:  # a store hiccup: retried well before the lease lapses
                self.failures += 1
                log.warning(
                    "lease renewal of %d receipts failed (retrying soon): %s", len(renewal.leases), exc
                )
                self.leases.retry_soon(renewal.token, now)
                continue
            self.leases.renewals += 1
            keys = set(report.refused)
            reg = self.leases.refused(renewal.token, keys)
            if reg is not None:
                if reg.lost is not None:
                    reg.lost.set()
                if reg.on_lost is not None:
                    reg.on_lost(tuple(sorted(keys)))

    def _arm(self, now: float) -> None:
        at = self.leases.next_tick(now)
        if at is None or (self._armed is not None and self._armed <= at):
            return
        self._armed = at
        ref = self.actor_ref
        self.timers.call_later(at - now, lambda: ref.tell(HeartbeatTick()))

    def lost_keys(self) -> list[str]:
        """Receipt keys whose lease renewal found them lost (for stats and tests)."""
        return list(self.leases.lost_keys)

    def renewals(self) -> int:
        """How many bulk renewals succeeded."""
        return self.leases.renewals
