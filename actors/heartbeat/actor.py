"""The heartbeat: renews the leases of running receipts, whatever the tools do.

:class:`HeartbeatActor` takes registrations (:class:`~actors.messages.RegisterLeases`,
:class:`~actors.messages.UnregisterLeases`) and hands them to a
:class:`~actors.heartbeat.renewer.Renewer`: a native OS thread with its own store handle that
renews on a timer by itself, so a tool that never yields to the gevent hub (or holds a
worker thread) cannot starve the renewals. :class:`LeaseSet` is the state machine they
share (when each registration is due, which are past their hard deadline).

A renewal refused by fencing means the lease is lost (expired and taken): the renewer
tells this actor, which sets the registration's ``lost`` event and calls its ``on_lost``
(its owner then refuses to complete, and its callers get
:class:`~actors.errors.LeaseLostError`). A renewal that raised is retried a quarter
interval later (well before the lease lapses), counted and logged here.

Threads: the actor's methods run on its own thread (a greenlet under gevent); the
renewer's on its OS thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pykka

from actors.heartbeat.lease_set import LeaseSet, Renewal
from actors.heartbeat.renewer import LeasesRefused, RenewalFailed, Renewer, hub_caller
from actors.messages import RegisterLeases, UnregisterLeases
from actors.runtime.actor import InboxActor, guarded, log
from stores.base import ReceiptStore

__all__ = ["HeartbeatActor", "LeaseSet", "Renewal"]


class HeartbeatActor(InboxActor):
    """Registers leases with the renewer thread; acts on what it reports.

    Args:
        store: the system's receipt store; the renewer renews through
            ``store.renewal_handle()`` on its own thread (not through the store actor,
            which lives on the hub a tool may starve).
        interval_for: seconds between renewals for a lease TTL.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        store: ReceiptStore,
        interval_for: Callable[[float], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        ref = self.actor_ref
        call = hub_caller()

        def report(message: Any) -> None:
            call(_tell_quietly, ref, message)

        self.renewer = Renewer(store, interval_for, report, clock)

    @guarded
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, RegisterLeases):
            self.renewer.register(message)
        elif isinstance(message, UnregisterLeases):
            self.renewer.unregister(message.token, message.keys)
        elif isinstance(message, LeasesRefused):
            reg = message.reg
            if reg.lost is not None:
                reg.lost.set()
            if reg.on_lost is not None:
                reg.on_lost(message.keys)
        elif isinstance(message, RenewalFailed):
            log.warning(
                "lease renewal of %d receipts failed (retrying soon): %s", message.count, message.error
            )
        return None

    def on_stop(self) -> None:
        if not self.renewer.stop():
            log.warning("the lease renewer thread did not end in time (a store call hangs)")

    @property
    def failures(self) -> int:
        """Renewals that raised (each retried)."""
        return self.renewer.failures

    def lost_keys(self) -> list[str]:
        """Receipt keys whose lease renewal found them lost (for stats and tests)."""
        return list(self.renewer.leases.lost_keys)

    def renewals(self) -> int:
        """How many bulk renewals succeeded."""
        return self.renewer.leases.renewals


def _tell_quietly(ref: Any, message: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):  # the system stopped meanwhile
        ref.tell(message)
