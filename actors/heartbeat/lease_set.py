"""Which leases to renew, and when: the heartbeat's plain state machine.

:class:`LeaseSet` holds the registrations, when each is due, and which are past their
hard deadline; it never reads a clock or touches a store (tests drive it with a fake
clock). The :class:`~actors.heartbeat.renewer.Renewer` owns one, under its lock.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from actors.messages import RegisterLeases
from stores.types import LeaseRef, Owner

__all__ = ["LeaseSet", "Renewal"]


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
