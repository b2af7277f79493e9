"""The exit actions every path of a call ends in, and the outcomes callers are given.

:class:`Exits` releases what a group or unit holds in one place, whichever message
made it leave: :meth:`Exits.settle` for a group (heartbeat off, out of the in-flight
map, callers answered), :meth:`Exits.leave` for a unit (its slot back, forgotten),
:meth:`Exits.release_group` / :meth:`Exits.give_back` for receipts given back pending.
It also compiles groups into units and queues units for admission. A part of
:class:`actors.lifecycle.machine.Lifecycle`; runs on its owner's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from actors.errors import (
    AuthScopeChangedError,
    BudgetExceededError,
    CallCancelledError,
    NotSentError,
    PersistenceCircuitOpenError,
    QuotaExhaustedError,
    RateLimitedError,
    RecordedFailureError,
    SuspendedError,
    is_a,
)
from actors.lifecycle.calls import Call, Group, GroupState, Role, Unit, note_wait
from actors.lifecycle.shared import Parts, Shared
from actors.results import ToolResult
from stores.codec import decode_output, encode_output
from stores.money import Money
from stores.types import ClaimMode, FailureKind, Receipt

__all__ = ["FLUSHER_FAILED", "MISSING", "RELEASE_ON", "Done", "Exits", "TooLarge", "batches_of"]

RELEASE_ON = (
    SuspendedError,
    AuthScopeChangedError,
    BudgetExceededError,
    QuotaExhaustedError,
    NotSentError,
)
"""Errors after which a receipt is given back (pending), not failed: none of them
follows a provider call that was paid for (a quota's refusal, like a budget's, comes
before the request is sent)."""


PERSIST_BATCH = 500
"""Most outputs held back for one flusher request while more messages are waiting."""


def batches_of(groups: list[Group], size: int, budget: int) -> list[list[Group]]:
    """``groups`` cut, in order, into runs of at most ``size`` members whose inputs sum
    to at most ``budget`` bytes (``Group.input_bytes``; ``budget`` 0: no byte limit). A
    member larger than ``budget`` alone makes a run of its own (its call's input is
    already held to the input cap)."""
    out: list[list[Group]] = []
    run: list[Group] = []
    held = 0
    for group in groups:
        if run and (len(run) >= size or (budget and held + group.input_bytes > budget)):
            out.append(run)
            run, held = [], 0
        run.append(group)
        held += group.input_bytes
    if run:
        out.append(run)
    return out


class Exits:
    """Exit actions, unit building and the admission queues (a part of
    :class:`actors.lifecycle.machine.Lifecycle`, sharing its :class:`~actors.lifecycle.shared.Shared`)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    def compile(self, groups: list[Group]) -> list[Unit]:
        """Units of ``groups``: one each, or for a batch tool batches of at most
        ``max_batch_size`` members and ``max_batch_bytes`` of input (:func:`batches_of`)."""
        batch = self.tool.batch
        size = batch.max_batch_size if batch is not None else 1
        budget = batch.max_batch_bytes if batch is not None else 0
        out: list[Unit] = []
        for exempt in (False, True):
            chosen = [g for g in groups if g.nested is exempt]
            for members in batches_of(chosen, size, budget):
                unit = Unit(next(self.s.ids), members, exempt=exempt)
                for group in unit.groups:
                    group.unit = unit
                    group.state = GroupState.CLAIMED
                self.s.units[unit.id] = unit
                out.append(unit)
        if batch is not None and len(out) > 0:
            self.fx.count("batches_compiled", sum(1 for u in out if len(u.groups) > 1))
        return out

    def enqueue(self, units: Iterable[Unit], front: bool = False) -> None:
        for unit in units:
            if unit.queued:
                continue
            if not unit.exempt and not unit.slot and any(g.nested for g in unit.groups):
                # a nested call joined while it held a slot, and it goes again (a retry, a
                # 429): its parent holds a slot and waits on it, so it borrows that one
                unit.exempt = True
            queue = self.s.pending_exempt if unit.exempt else self.s.pending
            unit.queued = True
            if unit.waiting is None:  # counted (and told to traced callers) when a slot comes
                paused = is_a(unit.last_error, RateLimitedError)  # the governor holds it through the pause
                unit.waiting = ("pause" if paused else "slot", self.s.clock())
            if front:
                queue.appendleft(unit)
            else:
                queue.append(unit)

    # -- exits: every path ends here ------------------------------------------------------

    def cancel_groups(self, groups: list[Group]) -> None:
        for group in groups:
            self.settle(group, CallCancelledError("the dispatcher stopped"))

    def refuse_latch(self, units: list[Unit], reason: str) -> None:
        for unit in units:
            self.fx.count("refused_by_latch", sum(len(g.calls) for g in unit.groups))
            self.give_back(unit, PersistenceCircuitOpenError(f"latch tripped: {reason}"))

    def give_back(self, unit: Unit, error: BaseException) -> None:
        """Release a unit not sent: its receipts go back to pending, callers get ``error``."""
        for queue in (self.s.pending, self.s.pending_exempt):
            if unit.queued and unit in queue:
                queue.remove(unit)
        for group in list(unit.groups):
            self.release_group(group, error)
        self.leave(unit)

    def release_group(self, group: Group, error: BaseException | None, lease_lost: bool = False) -> None:
        """Give a group's receipt back (pending); its callers hear ``error`` once the store
        has done it, so a refused call's receipt is already free when its caller learns."""
        lease = group.lease
        self.drop_from_unit(group)
        if lease is not None and self.tool.durable and not lease_lost and not group.lease_lost:
            group.state = GroupState.RELEASING
            self.s.releasing.append((group, error, lease))
            return
        self.released(group, error)

    def released(self, group: Group, error: BaseException | None) -> None:
        if is_a(error, AuthScopeChangedError):  # (its real type: see Finisher.on_finished)
            calls, group.calls = group.calls, []
            self.settle(group, None)
            for call in calls:
                self.fx.requeue(call, error)
            return
        self.settle(group, error)

    def drop_from_unit(self, group: Group) -> None:
        unit = group.unit
        if unit is not None and group in unit.groups:
            unit.groups.remove(group)
            if unit.persisting > 0:
                unit.persisting -= 1
            if not unit.groups:
                self.leave(unit)

    def readmit(self, unit: Unit, now: float, front: bool = False) -> None:
        """Give the unit's slot back and queue it for admission again (nothing was sent)."""
        self.free_slot(unit)
        for group in unit.groups:
            group.state = GroupState.CLAIMED
        self.enqueue([unit], front=front)

    def free_slot(self, unit: Unit) -> None:
        if unit.slot:
            unit.slot = False
            if not unit.exempt:
                self.s.holding -= 1
            # a slot under which nothing was sent gives its provider_calls charge back, and
            # its money charge (one sent keeps it until its answer settles it)
            if unit.sent_on_slot or not unit.charge:
                self.fx.release_slots(1, exempt=unit.exempt, refunds=0 if unit.sent_on_slot else 1)
            else:
                self.fx.release_slots(1, exempt=unit.exempt, refunds=1, unspent=unit.charge)
            if not unit.sent_on_slot:
                unit.charge = None
                if unit.units is not None:  # its units were taken and nothing went: back
                    self.fx.release_slots(0, exempt=unit.exempt, unsent_units={**unit.units, "requests": 1.0})
            unit.units = None
            unit.sent_on_slot = False

    def leave(self, unit: Unit) -> None:
        """A unit's exit action: its slot back, forgotten."""
        self.free_slot(unit)
        if unit.out:
            return  # its worker still runs: it leaves when the worker reports
        if unit.retry_charged:  # charged for a retry that never went: the charge comes back
            unit.retry_charged = False
            self.fx.refund_retry()
        self.s.units.pop(unit.id, None)
        for group in unit.groups:  # settled groups let go of it (no cycle left to collect)
            if group.unit is unit and group.state is GroupState.SETTLED:
                group.unit = None

    def stop_waiting(self, group: Group) -> None:
        since, group.wait.since = group.wait.since, None
        if since is not None:
            now = self.s.clock()
            self.fx.waited("owner", now - since)
            if self.s.traced:
                note_wait((group,), "owner", since, now)
        if group.wait.watched:
            group.wait.watched = False
            self.s.unwatching.append(group.key)
        if group.wait.counted:
            self.fx.count("waiting_on_owner", -group.wait.counted)
            group.wait.counted = 0

    def unbeat(self, group: Group) -> bool:
        if group.beating:
            self.fx.unbeat([group.key])
        return False

    def answer_early(self, group: Group, outcome: Any) -> None:
        """Answer the callers now; the group goes on (a late result is still persisted)."""
        calls, group.calls = group.calls, []
        group.answered = True
        for call in calls:
            self.fx.answer(call, self.outcome_for(call, group, outcome))

    def answer_last_good(self, group: Group, receipt: Receipt | None, mark: str | None) -> None:
        """A forced refresh holding the receipt's previous output: its callers that did not
        ask for a refresh (followers or attached calls, normal or retry_failed) get that
        output now, as their own claim would have (docs/receipts.md, Claims and
        dispositions), never waiting on the refresh. ``mark``: ``"refresh_running"`` (the
        refresh is under way), ``"refresh_uncertain"`` (its outcome is uncertain) or None
        (its failure was recorded: the output stands unmarked). Only for a key without
        staleness (with one, a normal call may itself be a stale re-run: it shares the
        refresh's outcome)."""
        if (
            receipt is None or receipt.completed_at is None or group.mode is not ClaimMode.FORCE_REFRESH
            or group.stale_after_s is not None
        ):  # fmt: skip
            return
        ordinary = [c for c in group.calls if c.mode is not ClaimMode.FORCE_REFRESH]
        if not ordinary:
            return
        try:
            text = encode_output(receipt.output)
        except Exception:  # unreadable: they share the refresh's outcome
            return
        group.calls = [c for c in group.calls if c.mode is ClaimMode.FORCE_REFRESH]
        if group.wait.counted:  # the waiting-on-owner gauge counts the callers still waiting
            self.fx.count("waiting_on_owner", -min(len(ordinary), group.wait.counted))
            group.wait.counted = max(0, group.wait.counted - len(ordinary))
        done = Done(text, "cached", last_good=mark, cost=receipt.cost)
        for call in ordinary:
            self.fx.answer(call, self.outcome_for(call, group, done))

    def settle(self, group: Group, outcome: Any) -> None:
        """A group's exit action: heartbeat off, out of the in-flight map, callers answered."""
        if group.state is GroupState.SETTLED:
            return
        group.beating = self.unbeat(group)
        self.stop_waiting(group)
        group.state = GroupState.SETTLED
        if self.s.groups.get(group.key) is group:
            del self.s.groups[group.key]
            self.fx.settled(group.key)  # calls held behind this execution may go
        if is_a(outcome, Done):  # an outcome may be a tool's error: judged by its real type
            if outcome.execution == "live" and group.ran:
                self.fx.count("live")
            if self.tool.durable and not outcome.last_good:  # not the memo's: later calls ask the store
                cached = outcome.execution == "cached"
                self.fx.remember(group.key, outcome.value, cached, outcome.cost if cached else group.cost)
        elif outcome is not None and group.receipt is not None and self.tool.durable:
            # it claimed the receipt and did not complete it: what the memo holds of the key
            # (a refresh's previous output) may no longer be what a normal claim answers
            self.fx.forget(group.key)
        if group.owed and not (is_a(outcome, Done) and outcome.execution == "live" and group.ran):
            group.owed = False  # its output was not stored after all (another's, or none)
            self.fx.owed(group.key)
        calls, group.calls = group.calls, []
        if outcome is None:
            return
        for call in calls:
            self.fx.answer(call, self.outcome_for(call, group, outcome))

    def outcome_for(self, call: Call, group: Group, outcome: Any) -> Any:
        if not is_a(outcome, Done):
            return outcome
        execution = outcome.execution
        if outcome.owed or execution == "live":
            if self._gets_live(call, group, outcome.owed):
                execution = "live"
            elif execution == "live":
                execution = "in_flight"
        value = decode_output(outcome.value) if self.tool.durable else outcome.value
        if outcome.cost is not None and execution != "live":  # from a receipt another execution paid
            self.fx.save(outcome.cost)
            if call.trace is not None:
                call.trace.cost = outcome.cost
        mark = outcome.last_good
        return ToolResult.of(
            value, execution, group.key, self.tool.tool_id,  # type: ignore[arg-type]
            refresh_uncertain=mark == "refresh_uncertain", refresh_running=mark == "refresh_running",
        )  # fmt: skip

    def _gets_live(self, call: Call, group: Group, owed: bool) -> bool:
        """Whether ``call`` is the one caller answered ``live`` with the output of its
        group's execution (every receipt this system completes has one, for the run's
        report): the owner, or the first caller answered with it when the owner left or
        never was (a member riding along in a request sent again); ``owed``: the output
        is that of an execution of this system whose mark the group took from the memo."""
        if group.live_given:
            return False
        if not owed:
            if not group.ran:
                return False
            if call.role is not Role.OWNER and any(c.role is Role.OWNER for c in group.calls):
                return False  # the owner is still to be answered
            if group.owed:  # its output went to the store callerless: one caller takes the mark
                group.owed = False
                if not self.fx.owed(group.key):
                    return False  # taken by a call answered elsewhere (the memo, a read)
        group.live_given = True
        return True


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
    """A successful outcome: the encoded output (durable) or the value, and how it came;
    ``last_good``: None, or the receipt's last good output given while a refresh of it
    runs (``"refresh_running"``) or has an uncertain outcome (``"refresh_uncertain"``);
    ``owed``: a stored output this system's execution wrote with no caller answered
    ``live`` (the group took its mark from the memo): its first caller is ``live``;
    ``cost``: what the call whose output this is cost when it was paid (an output taken
    from a receipt: ``Receipt.cost``)."""

    __slots__ = ("cost", "execution", "last_good", "owed", "value")

    def __init__(
        self, value: Any, execution: str, last_good: str | None = None, owed: bool = False,
        cost: Money | None = None,
    ) -> None:  # fmt: skip
        self.value = value
        self.execution = execution
        self.last_good = last_good
        self.owed = owed
        self.cost = cost
