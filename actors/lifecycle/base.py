"""What every part of the call lifecycle shares: the state and the exits (the effects
port it drives is :class:`actors.lifecycle.effects.Effects`).

:class:`LifecycleBase` holds the state of one tool's groups and units, and the exit
actions every path ends in (:meth:`~LifecycleBase._settle` for a group: heartbeat off,
out of the in-flight map, callers answered; :meth:`~LifecycleBase._leave` for a unit:
its slot back). The transitions live in :mod:`actors.lifecycle.claiming` (claims and waits),
:mod:`actors.lifecycle.finishing` (attempts returned, persistence) and :mod:`actors.lifecycle.machine`
(admission, sending, cancellation, stop).
"""

from __future__ import annotations

import abc
import collections
import itertools
import math
from collections.abc import Iterable
from typing import Any

from actors.errors import (
    AuthScopeChangedError,
    BudgetExceededError,
    CallCancelledError,
    NotSentError,
    PersistenceCircuitOpenError,
    RecordedFailureError,
    SuspendedError,
    is_a,
)
from actors.lifecycle.calls import Call, Group, GroupState, Role, Unit
from actors.lifecycle.effects import Effects
from actors.messages import DeadlineDue
from actors.results import ToolResult
from actors.tool import Policy, Tool
from stores.codec import EncodedOutput, decode_output
from stores.types import (
    Completion,
    FailureKind,
    LeaseRef,
    Owner,
)

__all__ = ["FLUSHER_FAILED", "MISSING", "RELEASE_ON", "Done", "Effects", "LifecycleBase", "TooLarge"]

RELEASE_ON = (
    SuspendedError,
    AuthScopeChangedError,
    BudgetExceededError,
    NotSentError,
)
"""Errors after which a receipt is given back (pending), not failed: none of them
follows a provider call that was paid for."""


PERSIST_BATCH = 500
"""Most outputs held back for one flusher request while more messages are waiting."""


class LifecycleBase(abc.ABC):
    """The state of one tool's call groups and units, and their exit actions.

    Args:
        tool: the tool.
        policy: timeouts, retries, receipt waits.
        org_id / scope: the run's org and scope (claim requests).
        fx: the effects port (the actor, or a recorder in tests).
        width: most units of this tool holding slots at once (suggested parallelism).
        owner: this process's lease owner (for the leases a failed claim may leave).
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
        self.tool = tool
        self.owner = owner
        """This process's lease owner (None: leases left by a failed claim are not looked for)."""
        self.policy = policy
        self.org_id = org_id
        self.scope = scope
        self.fx = fx
        self.width = max(1, width)
        self.groups: dict[str, Group] = {}
        """Receipt key -> group past its queue and not settled (calls of that key attach)."""
        self.pending: collections.deque[Unit] = collections.deque()
        self.pending_exempt: collections.deque[Unit] = collections.deque()
        self.units: dict[int, Unit] = {}
        self.holding = 0
        """Units holding a non-exempt slot."""
        self.overdue_warned_at = -math.inf
        """When functions past their timeout were last said to hold slots (``Finishing``)."""
        self.acquiring = {False: False, True: False}
        self._slotting: list[Group] = []
        """Groups whose slots were asked for before their claim (``Claiming.drained``)."""
        self.stopping = False
        self._batches: dict[int, Any] = {}
        self._cleanups: dict[int, Any] = {}
        """Batch -> a lease cleanup in flight (:mod:`actors.lifecycle.cleanup`)."""
        self._releasing: list[tuple[Group, BaseException | None, LeaseRef]] = []
        self._persisting: list[tuple[Group, str]] = []
        self._unwatching: list[str] = []
        self._deadlines: dict[float, list[int]] = {}
        """Timeout (seconds) -> units sent with it during this message (one timer each)."""
        self._woken: set[int] = set()
        """Read batches asked for by a change notification (not timer polls)."""
        self._ids = itertools.count(1)

    # -- provided by the parts ---------------------------------------------------------

    @abc.abstractmethod
    def pump(self, now: float) -> None:
        """Ask for slots for what waits (:class:`actors.lifecycle.machine.Lifecycle`)."""

    @abc.abstractmethod
    def _admit(self, units: list[Unit], now: float, marked: bool = False) -> None:
        """Units holding slots: mark running (unless ``marked``), then send (``Lifecycle``)."""

    @abc.abstractmethod
    def _conclude(
        self, unit: Unit, members: list[Any] | None, error: BaseException | None, now: float
    ) -> None:
        """End a unit's last attempt (:class:`actors.lifecycle.finishing.Finishing`)."""

    def _compile(self, groups: list[Group]) -> list[Unit]:
        batch = self.tool.batch
        size = batch.max_batch_size if batch is not None else 1
        out: list[Unit] = []
        for exempt in (False, True):
            chosen = [g for g in groups if g.nested is exempt]
            for i in range(0, len(chosen), size):
                unit = Unit(next(self._ids), chosen[i : i + size], exempt=exempt)
                for group in unit.groups:
                    group.unit = unit
                    group.state = GroupState.CLAIMED
                self.units[unit.id] = unit
                out.append(unit)
        if batch is not None and len(out) > 0:
            self.fx.count("batches_compiled", sum(1 for u in out if len(u.groups) > 1))
        return out

    def _enqueue(self, units: Iterable[Unit], front: bool = False) -> None:
        for unit in units:
            if unit.queued:
                continue
            if not unit.exempt and not unit.slot and any(g.nested for g in unit.groups):
                # a nested call joined while it held a slot, and it goes again (a retry, a
                # 429): its parent holds a slot and waits on it, so it borrows that one
                unit.exempt = True
            queue = self.pending_exempt if unit.exempt else self.pending
            unit.queued = True
            if front:
                queue.appendleft(unit)
            else:
                queue.append(unit)

    # -- exits: every path ends here ------------------------------------------------------

    def _cancel(self, groups: list[Group]) -> None:
        for group in groups:
            self._settle(group, CallCancelledError("the dispatcher stopped"))

    def _refuse_latch(self, units: list[Unit], reason: str) -> None:
        for unit in units:
            self.fx.count("refused_by_latch", sum(len(g.calls) for g in unit.groups))
            self._give_back(unit, PersistenceCircuitOpenError(f"latch tripped: {reason}"))

    def _give_back(self, unit: Unit, error: BaseException) -> None:
        """Release a unit not sent: its receipts go back to pending, callers get ``error``."""
        for queue in (self.pending, self.pending_exempt):
            if unit.queued and unit in queue:
                queue.remove(unit)
        for group in list(unit.groups):
            self._release_group(group, error)
        self._leave(unit)

    def _release_group(self, group: Group, error: BaseException | None, lease_lost: bool = False) -> None:
        """Give a group's receipt back (pending); its callers hear ``error`` once the store
        has done it, so a refused call's receipt is already free when its caller learns."""
        lease = group.lease
        self._drop_from_unit(group)
        if lease is not None and self.tool.durable and not lease_lost and not group.lease_lost:
            group.state = GroupState.RELEASING
            self._releasing.append((group, error, lease))
            return
        self._released(group, error)

    def flush(self, idle: bool = True) -> None:
        """End of a message: send the outputs and releases gathered as one request each.

        Args:
            idle: no other message is waiting. Outputs wait for the next message while
                more are coming (up to ``PERSIST_BATCH`` members), so units finishing
                together are written together.
        """
        if self._deadlines:
            deadlines, self._deadlines = self._deadlines, {}
            for timeout_s, units in deadlines.items():
                self.fx.later(timeout_s, DeadlineDue(units=tuple(units)))
        if self._persisting and (idle or len(self._persisting) >= PERSIST_BATCH):
            values, self._persisting = self._persisting, []
            batch = next(self._ids)
            self._batches[batch] = values
            entries = [
                Completion(
                    g.key,
                    g.receipt.lease_id or "",
                    EncodedOutput(t),
                    g.receipt.generation,
                    g.receipt.completed_at,
                )
                for g, t in values
                if g.receipt
            ]
            self.fx.persist(batch, entries, {g.key: g.input_hash for g, _ in values})
        if self._unwatching:
            keys, self._unwatching = self._unwatching, []
            self.fx.unwatch(keys)
        if self._releasing:
            items, self._releasing = self._releasing, []
            batch = next(self._ids)
            self._batches[batch] = items
            self.fx.release_receipts(batch, [lease for _, _, lease in items])

    def _claim_failed(self, keys: list[str]) -> None:  # noqa: B027 - optional hook (actors.lifecycle.cleanup)
        """A claim raised after it may have committed (see :mod:`actors.lifecycle.cleanup`)."""

    def _released(self, group: Group, error: BaseException | None) -> None:
        if is_a(error, AuthScopeChangedError):  # (its real type: see Finishing.on_finished)
            calls, group.calls = group.calls, []
            self._settle(group, None)
            for call in calls:
                self.fx.requeue(call, error)
            return
        self._settle(group, error)

    def _drop_from_unit(self, group: Group) -> None:
        unit = group.unit
        if unit is not None and group in unit.groups:
            unit.groups.remove(group)
            if unit.persisting > 0:
                unit.persisting -= 1
            if not unit.groups:
                self._leave(unit)

    def _readmit(self, unit: Unit, now: float, front: bool = False) -> None:
        """Give the unit's slot back and queue it for admission again (nothing was sent)."""
        self._free_slot(unit)
        for group in unit.groups:
            group.state = GroupState.CLAIMED
        self._enqueue([unit], front=front)

    def _free_slot(self, unit: Unit) -> None:
        if unit.slot:
            unit.slot = False
            if not unit.exempt:
                self.holding -= 1
            # a slot under which nothing was sent gives its provider_calls charge back
            self.fx.release_slots(1, exempt=unit.exempt, refunds=0 if unit.sent_on_slot else 1)
            unit.sent_on_slot = False

    def _leave(self, unit: Unit) -> None:
        """A unit's exit action: its slot back, forgotten."""
        self._free_slot(unit)
        if unit.out:
            return  # its worker still runs: it leaves when the worker reports
        if unit.retry_charged:  # charged for a retry that never went: the charge comes back
            unit.retry_charged = False
            self.fx.refund_retry()
        self.units.pop(unit.id, None)
        for group in unit.groups:  # settled groups let go of it (no cycle left to collect)
            if group.unit is unit and group.state is GroupState.SETTLED:
                group.unit = None

    def _stop_waiting(self, group: Group) -> None:
        group.waiting_since = None
        if group.watched:
            group.watched = False
            self._unwatching.append(group.key)
        if group.waiting_counted:
            self.fx.count("waiting_on_owner", -group.waiting_counted)
            group.waiting_counted = 0

    def _unbeat(self, group: Group) -> bool:
        if group.beating:
            self.fx.unbeat([group.key])
        return False

    def _answer_early(self, group: Group, outcome: Any) -> None:
        """Answer the callers now; the group goes on (a late result is still persisted)."""
        calls, group.calls = group.calls, []
        group.answered = True
        for call in calls:
            self.fx.answer(call, self._outcome_for(call, group, outcome))

    def _settle(self, group: Group, outcome: Any) -> None:
        """A group's exit action: heartbeat off, out of the in-flight map, callers answered."""
        if group.state is GroupState.SETTLED:
            return
        group.beating = self._unbeat(group)
        self._stop_waiting(group)
        group.state = GroupState.SETTLED
        if self.groups.get(group.key) is group:
            del self.groups[group.key]
        if is_a(outcome, Done):  # an outcome may be a tool's error: judged by its real type
            if outcome.execution == "live" and group.ran:
                self.fx.count("live")
            if self.tool.durable:
                self.fx.remember(group.key, outcome.value, outcome.execution == "cached")
        calls, group.calls = group.calls, []
        if outcome is None:
            return
        for call in calls:
            self.fx.answer(call, self._outcome_for(call, group, outcome))

    def _outcome_for(self, call: Call, group: Group, outcome: Any) -> Any:
        if not is_a(outcome, Done):
            return outcome
        execution = outcome.execution
        if execution == "live" and (call.role is not Role.OWNER or not group.ran):
            execution = "in_flight"
        value = decode_output(outcome.value) if self.tool.durable else outcome.value
        return ToolResult.of(value, execution, group.key, self.tool.tool_id)  # type: ignore[arg-type]


MISSING = object()


class _FlusherFailed:
    kind = "salvaged"
    output: Any = None
    error = "the completion flusher failed"
    reason = ""


FLUSHER_FAILED: Any = _FlusherFailed()


class TooLarge(RecordedFailureError):
    """An output over the store's cap: the caller got it, it is salvaged, and the receipt
    records failure kind ``output_too_large`` (not retried by a normal claim). A call
    that joined the execution meanwhile gets this error."""

    def __init__(self, size_bytes: int) -> None:
        super().__init__(
            f"output of {size_bytes} bytes is over the store's cap; it was salvaged",
            failure_kind=FailureKind.OUTPUT_TOO_LARGE,
        )
        self.size_bytes = size_bytes


class Done:
    """A successful outcome: the encoded output (durable) or the value, and how it came."""

    __slots__ = ("execution", "value")

    def __init__(self, value: Any, execution: str) -> None:
        self.value = value
        self.execution = execution
