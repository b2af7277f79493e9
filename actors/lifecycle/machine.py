"""The life of a call group, as a plain state machine: messages in, effects out, time passed in.

One :class:`Lifecycle` per tool, owned by that tool's queue actor. Each group moves
through the states of :mod:`actors.lifecycle.states` (the table of legal moves)::

    queued -> claiming -> reused | waiting | claimed -> admitted -> running -> persisting -> settled

:meth:`Lifecycle.handle` is the one entry point for facts: it takes a message of
:mod:`actors.messages` and ``now`` (``time.monotonic()`` seconds). Nothing here blocks
or sleeps: a request to another actor, the store or the worker pool is an effect
(:class:`~actors.lifecycle.effects.Effects`), and its answer comes back as another
message. A wait on another owner's receipt is a timer plus a plain read.

``Lifecycle`` composes collaborators that share one :class:`~actors.lifecycle.shared.Shared`
state: :class:`~actors.lifecycle.exits.Exits` (what a group or unit holds, released in
one place whichever way it leaves), :class:`~actors.lifecycle.claiming.Claims` (claims
and waits on other owners), :class:`~actors.lifecycle.reconciling.Waits` (callers'
timeouts during waits, the reconcile hook), :class:`~actors.lifecycle.admission.Admission`
(slots, sends, lease loss, cancellation, stop), :class:`~actors.lifecycle.finishing.Finisher`
(a provider call returned: retries, re-admission, deadlines),
:class:`~actors.lifecycle.persisting.Persister` (outputs and failures written) and
:class:`~actors.lifecycle.cleanup.Cleanup` (leases a failed write left held).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection
from typing import Any

from actors.lifecycle.admission import Admission
from actors.lifecycle.calls import Call, Group, Unit
from actors.lifecycle.claiming import Claims
from actors.lifecycle.cleanup import Cleanup
from actors.lifecycle.effects import Effects
from actors.lifecycle.exits import PERSIST_BATCH, Exits
from actors.lifecycle.finishing import Finisher
from actors.lifecycle.persisting import Persister
from actors.lifecycle.reconciling import Waits
from actors.lifecycle.shared import Parts, Shared
from actors.messages import (
    CallCancelled,
    ClaimHeld,
    CleanupDue,
    CompletionsPersisted,
    DeadlineDue,
    FailuresRecorded,
    LatchTripped,
    LeasesLost,
    PollDue,
    ReceiptsChanged,
    ReceiptsClaimed,
    ReceiptsRead,
    ReceiptsReleased,
    Reconciled,
    Resolved,
    RetryCharged,
    RetryDue,
    RunningMarked,
    SlotsGranted,
    UnitFinished,
    WaitDue,
)
from actors.tool import Policy, Tool
from stores.codec import EncodedOutput
from stores.types import Completion, Owner

__all__ = ["EVENTS", "Effects", "Lifecycle"]


class Assembled(Parts):
    """The parts as :class:`Lifecycle` builds them: their own classes, for the event table
    (each part sees the others only through :class:`~actors.lifecycle.shared.Parts`)."""

    exits: Exits
    claims: Claims
    waits: Waits
    admission: Admission
    finisher: Finisher
    persister: Persister
    cleanup: Cleanup


class Lifecycle:
    """Every call group of one tool past its batch grace window (see the module doc).

    Args:
        tool: the tool.
        policy: timeouts, retries, receipt waits.
        org_id / scope: the run's org and scope (claim requests).
        fx: the effects port (the actor, or a recorder in tests).
        width: most units of this tool holding slots at once (suggested parallelism).
        owner: this process's lease owner (for the leases a failed claim may leave).

    Every method runs on the owning tool queue actor's thread (or a test's).
    """

    def __init__(
        self,
        tool: Tool,
        policy: Policy,
        org_id: str,
        scope: str,
        fx: Effects,
        width: int,
        owner: Owner | None = None,
    ) -> None:
        self.state = s = Shared(tool, policy, org_id, scope, fx, width, owner)
        self.parts = p = Assembled()
        p.exits = Exits(s, p)
        p.claims = Claims(s, p)
        p.waits = Waits(s, p)
        p.admission = Admission(s, p)
        p.finisher = Finisher(s, p)
        p.persister = Persister(s, p)
        p.cleanup = Cleanup(s, p)

    # -- facts ---------------------------------------------------------------------------

    def handle(self, event: Any, now: float) -> None:
        """Take one fact (an answer to one of its effects, a timer, a cancel) and move the
        groups it concerns; the requests it makes go out through the effects port.

        Args:
            event: one of :data:`EVENTS` (typed messages of :mod:`actors.messages`).
            now: ``time.monotonic()`` seconds.

        Raises:
            TypeError: ``event`` is not one of :data:`EVENTS`.

        Call :meth:`pump` and :meth:`flush` after it, as the actor does at the end of
        each message.
        """
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"the call lifecycle takes no {type(event).__name__} message")
        handler(self.parts, event, now)

    # -- commands from the owning actor ------------------------------------------------

    def drained(self, groups: list[Group], now: float) -> None:
        """Groups leave the batch grace window: claim (durable) or run (not durable)."""
        self.parts.claims.drained(groups, now)

    def joined(self, call: Call, now: float) -> None:
        """A call joined its key's execution (see :meth:`actors.lifecycle.admission.Admission.joined`)."""
        self.parts.admission.joined(call, now)

    def nested_joined(self, key: str) -> None:
        """A nested call joined (or waits behind) the group of ``key``: it borrows a slot."""
        self.parts.admission.nested_joined(key)

    def cancel(self, call: Call, now: float) -> bool:
        """The caller gave up. Returns True when the call was removed (answered cancelled)."""
        return self.parts.admission.cancel(call, now)

    def stop(self, now: float) -> int:
        """Refuse everything not yet sent; running calls go on. Returns the calls refused."""
        return self.parts.admission.stop(now)

    def abandon(self, error: BaseException, kept: Collection[str] = ()) -> None:
        """The actor is gone: answer every caller still waiting with ``error`` (or
        ``ResultSalvagedError``: its paid output is salvaged; ``kept``: keys whose late
        answer was salvaged)."""
        self.parts.admission.abandon(error, kept)

    def pump(self, now: float) -> None:
        """Ask the governor for slots for what waits (one request out at a time)."""
        self.parts.admission.pump(now)

    def flush(self, idle: bool = True) -> None:
        """End of a message: arm the timers and send the outputs and releases gathered,
        one request each.

        Args:
            idle: no other message is waiting. Outputs wait for the next message while
                more are coming (up to ``PERSIST_BATCH`` members), so units finishing
                together are written together.
        """
        s, fx = self.state, self.state.fx
        if s.wait_dues:
            dues, s.wait_dues = s.wait_dues, {}
            for delay_s, keys in dues.items():
                fx.later(delay_s, WaitDue(keys=tuple(keys)))
        if s.deadlines:
            deadlines, s.deadlines = s.deadlines, {}
            for timeout_s, units in deadlines.items():
                fx.later(timeout_s, DeadlineDue(units=tuple(units)))
        if s.persisting and (idle or len(s.persisting) >= PERSIST_BATCH):
            values, s.persisting = s.persisting, []
            batch = next(s.ids)
            s.batches[batch] = values
            entries = [
                Completion(
                    g.key,
                    g.receipt.lease_id or "",
                    EncodedOutput(t),
                    g.receipt.generation,
                    g.receipt.completed_at,
                    cost=g.cost,
                )
                for g, t in values
                if g.receipt
            ]
            s.asked_at[batch] = s.clock()
            fx.persist(batch, entries, {g.key: g.input_hash for g, _ in values})
        if s.unwatching:
            keys, s.unwatching = s.unwatching, []
            fx.unwatch(keys)
        if s.releasing:
            items, s.releasing = s.releasing, []
            batch = next(s.ids)
            s.batches[batch] = items
            fx.release_receipts(batch, [lease for _, _, lease in items])

    # -- what the actor and tests read ----------------------------------------------------

    @property
    def groups(self) -> dict[str, Group]:
        """Receipt key -> group past its queue and not settled (the actor attaches calls)."""
        return self.state.groups

    @property
    def units(self) -> dict[int, Unit]:
        """Unit id -> unit not yet left."""
        return self.state.units

    @property
    def pending(self) -> collections.deque[Unit]:
        """Units waiting for a slot."""
        return self.state.pending

    @property
    def pending_exempt(self) -> collections.deque[Unit]:
        """Nested calls' units waiting for a borrowed slot."""
        return self.state.pending_exempt

    @property
    def holding(self) -> int:
        """Units holding a non-exempt slot."""
        return self.state.holding

    @property
    def stopping(self) -> bool:
        """The dispatcher is stopping: nothing new is sent."""
        return self.state.stopping

    @property
    def idle(self) -> bool:
        """Nothing running, persisting or held."""
        return not self.state.groups and not self.state.units


_HANDLERS: dict[type, Callable[[Assembled, Any, float], object]] = {
    UnitFinished: lambda p, m, now: p.finisher.on_finished(m, now),
    ReceiptsClaimed: lambda p, m, now: p.claims.on_claimed(m.batch, m.value, m.error, now),
    ClaimHeld: lambda p, m, now: p.claims.on_claim_held(m.batch, now, m.cause),
    CompletionsPersisted: lambda p, m, now: p.persister.on_persisted(m.batch, m.value, m.error, now),
    RunningMarked: lambda p, m, now: p.admission.on_marked(m.batch, m.value, m.error, now),
    FailuresRecorded: lambda p, m, now: p.persister.on_failures_recorded(m.batch, m.value, m.error, now),
    LatchTripped: lambda p, m, now: p.persister.on_latch_tripped(m.batch, now),
    ReceiptsReleased: lambda p, m, now: p.cleanup.on_released(m.batch, now, m.error),
    CleanupDue: lambda p, m, now: p.cleanup.on_cleanup_due(m.keys, m.leases, m.attempt, now),
    Reconciled: lambda p, m, now: p.waits.on_reconciled(m.batch, m.value, m.error, now),
    Resolved: lambda p, m, now: p.waits.on_resolved(m.batch, m.error, now),
    ReceiptsRead: lambda p, m, now: p.cleanup.on_read(m.batch, m.value, m.error, now),
    PollDue: lambda p, m, now: p.claims.on_poll(m.keys, now),
    DeadlineDue: lambda p, m, now: p.finisher.on_deadlines(m.units, now),
    RetryCharged: lambda p, m, now: p.finisher.on_retry_charged(m.unit, m.error, now),
    RetryDue: lambda p, m, now: p.finisher.on_retry_due(m.unit, now),
    WaitDue: lambda p, m, now: p.waits.on_wait_due(m.keys, now),
    SlotsGranted: lambda p, m, now: p.admission.on_granted(m.value, m.error, now, exempt=m.exempt),
    LeasesLost: lambda p, m, now: p.admission.on_leases_lost(m.keys, now),
    ReceiptsChanged: lambda p, m, now: p.claims.on_changed(m.keys, now),
    CallCancelled: lambda p, m, now: p.admission.cancel(m.call, now),
}
"""Fact message type -> the part and transition it drives."""

EVENTS: frozenset[type] = frozenset(_HANDLERS)
"""The message types :meth:`Lifecycle.handle` takes."""
