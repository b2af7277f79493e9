"""Leases handed to the heartbeat only once they have been held a little while.

Most calls finish in milliseconds, far inside their lease's TTL: registering each
claimed lease with the heartbeat at once, and unregistering it a millisecond later, cost
every such call four thread wake-ups (the heartbeat actor and its renewer thread, twice)
on a path where each hand-off costs more than the SQL. :class:`DeferredBeats` holds new
leases back for ``delay_s`` (at most a quarter of the renewal interval, and at most
:data:`MAX_DEFER_S`): a lease let go of before then never reaches the heartbeat; the
rest are registered together when one timer fires.

Safety: the renewer renews a registration one interval after it gets it, so a lease
claimed at ``t`` is first renewed by ``t + delay_s + interval`` <= ``t + 1.25 *
interval``, inside its TTL (the interval is a third of the TTL by default), with room
for the renewer's retries of a failed renewal (a quarter interval apart).

Threads only. Under gevent the registration must leave before the tool runs: a tool
that never yields to the hub would keep the timer's greenlet (and the tool queue
actor's) from ever running, and its lease would lapse unrenewed (the heartbeat's
renewer is an OS thread precisely so that such a tool cannot starve it). There
``defer=False``: every lease is registered at once, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from stores.types import LeaseRef

__all__ = ["MAX_DEFER_S", "DeferredBeats"]

MAX_DEFER_S = 1.0
"""Longest a new lease waits before it is registered with the heartbeat (seconds)."""


class DeferredBeats:
    """New leases not yet registered with the heartbeat (a plain state machine; its
    actor arms the timer and sends the registration).

    Args:
        interval_s: seconds between renewals of these leases.
        defer: False: nothing is held back (``delay_s`` 0: register at once).
    """

    def __init__(self, interval_s: float, defer: bool = True) -> None:
        self.delay_s = max(0.0, min(MAX_DEFER_S, interval_s / 4.0)) if defer else 0.0
        self.pending: dict[str, LeaseRef] = {}
        self.armed = False

    def add(self, leases: Iterable[LeaseRef]) -> bool:
        """Hold ``leases`` back; True when the actor must arm the timer (``delay_s``)."""
        for lease in leases:
            self.pending[lease.key] = lease
        if self.pending and not self.armed:
            self.armed = True
            return True
        return False

    def drop(self, keys: Iterable[str]) -> list[str]:
        """Let go of ``keys``: those still held back are forgotten; returns the others
        (registered, or never held here), which the heartbeat must unregister."""
        registered = []
        for key in keys:
            if self.pending.pop(key, None) is None:
                registered.append(key)
        return registered

    def due(self) -> list[LeaseRef]:
        """The timer fired: every lease still held back, to register now."""
        self.armed = False
        leases, self.pending = list(self.pending.values()), {}
        return leases
