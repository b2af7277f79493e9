"""Admission and sending: slots asked for and granted, receipts marked running, the
last checks before a request leaves; lease loss, cancellation, joining callers and stop.

Rules (docs/how-it-works.md): a slot per provider call, free when its result is
persisted; the latch, a stop and a paused or closed provider are checked right before
each send (and again by its worker, :mod:`actors.worker.launch`: a unit withdrawn or
refused there comes back ``withdrawn``); a unit whose deadline passes before it is
sent is never sent; one that times out while running keeps its slot, lease and
heartbeat until its worker returns, and its late result is persisted.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Collection, Iterable
from typing import Any

from actors.errors import (
    BudgetExceededError,
    CallCancelledError,
    LeaseLostError,
    NotSentError,
    ProviderUnavailableError,
    ResultSalvagedError,
    is_a,
)
from actors.lifecycle.attempts import SendTicket, batch_record, spec_for
from actors.lifecycle.calls import Call, Group, GroupState, Unit, note_wait, patience_s
from actors.lifecycle.exits import Done
from actors.lifecycle.shared import Parts, Shared
from actors.lifecycle.spending import ZERO, exact_difference, exact_sum, unit_cost
from actors.lifecycle.units import estimate_units
from stores.types import ClaimMode

__all__ = ["Admission", "sent_batch"]


class Admission:
    """Slots, sends, lease loss, cancellation and stop for one tool's lifecycle (a part of
    :class:`actors.lifecycle.machine.Lifecycle`; runs on its owner's thread)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    def pump(self, now: float) -> None:
        """Ask the governor for slots for what waits (one request out at a time)."""
        for exempt, queue in ((False, self.s.pending), (True, self.s.pending_exempt)):
            self._drop_empty(queue)
            if not queue or self.s.acquiring[exempt]:
                continue
            reason = self.fx.latch_reason()
            if reason is not None:
                refused = list(queue)
                queue.clear()
                for unit in refused:
                    unit.queued = False
                self.p.exits.refuse_latch(refused, reason)
                continue
            want = len(queue) if exempt else min(len(queue), self.s.width - self.s.holding)
            if want < 1:
                continue
            self.s.acquiring[exempt] = True
            patience = max((queue[i].timeout_s for i in range(want)), default=math.inf)
            extra: dict[str, Any] = {"patience_s": None if math.isinf(patience) else patience}
            if self.s.unit_limited:  # each request's units
                asked = tuple(self.s.bias.scaled(estimate_units(self.tool, queue[i])) for i in range(want))
                self.s.asked_units[exempt] = asked
                extra["units"] = asked
            if self.s.spend_currency is None:
                self.fx.acquire(want, exempt, **extra)
                continue
            # under a money budget the governor charges what each request is known to cost
            over = self.s.overrun
            prices = tuple(unit_cost(self.tool, queue[i], over) for i in range(min(want, len(queue))))
            self.s.asked_prices[exempt] = prices
            self.fx.acquire(len(prices), exempt, prices=prices, **extra)

    def _drop_empty(self, queue: collections.deque[Unit]) -> None:
        while queue and not queue[0].groups:
            dropped = queue.popleft()
            dropped.queued = False
            self.s.units.pop(dropped.id, None)

    def on_granted(
        self, n: int | None, error: BaseException | None, now: float, exempt: bool = False
    ) -> None:
        """The governor answered: start up to ``n`` units, or refuse every waiting one."""
        if self.s.slotting and not exempt:  # asked before a claim (Claims.drained)
            self.p.claims.slots_for_claim((n or 0) if error is None else -1, now)
            return
        self.s.acquiring[exempt] = False
        queue = self.s.pending_exempt if exempt else self.s.pending
        prices, self.s.asked_prices[exempt] = self.s.asked_prices[exempt], ()
        asked_units, self.s.asked_units[exempt] = self.s.asked_units[exempt], ()
        if is_a(error, BudgetExceededError) and queue and self._halve(queue):
            self.pump(now)  # the head batch, halved, asks again: what fits the budget may go
            return
        if error is not None or not n:
            units = list(queue)
            queue.clear()
            for unit in units:
                unit.queued = False
            if isinstance(error, ProviderUnavailableError):
                self.fx.count("unavailable", sum(len(g.calls) for u in units for g in u.groups))
            for unit in units:
                self.p.exits.give_back(unit, error or CallCancelledError("no slot was granted"))
            self.pump(now)
            return
        admitted: list[Unit] = []
        quota_wait = getattr(n, "quota_s", 0.0)  # (a Granted: how long a spent quota held it)
        # under a money budget: what the grant charged, spent on the units it admits (the
        # queue may have changed since it was asked: a unit costing more than what is left
        # waits for the next grant, priced anew)
        allowance = exact_sum(prices[:n]) if self.s.spend_currency is not None else None
        while n > 0 and queue:
            unit = queue[0]
            if not unit.groups:
                queue.popleft()
                unit.queued = False
                self.s.units.pop(unit.id, None)
                continue
            if allowance is not None:
                cost = unit_cost(self.tool, unit, self.s.overrun)
                if cost > allowance:
                    break
                allowance = exact_difference(allowance, cost)
                unit.charge = cost
            queue.popleft()
            unit.queued = False
            unit.slot = True
            if self.s.unit_limited:
                unit.units_estimate = estimate_units(self.tool, unit)
                unit.units, unit.granted_at = self.s.bias.scaled(unit.units_estimate), now
            if unit.waiting is not None:  # it waited for this slot
                reason, since = unit.waiting
                unit.waiting = None
                quota_s = min(quota_wait, now - since)
                if quota_s > 0:
                    self.fx.waited("quota", quota_s * len(unit.groups))
                self.fx.waited(reason, (now - since - quota_s) * len(unit.groups))
                if self.s.traced:
                    note_wait(unit.groups, reason, since, now)
            if not exempt:
                self.s.holding += 1
            n -= 1
            admitted.append(unit)
        if self.s.unit_limited:  # what the grant took, against what the units it admits take
            self._settle_units(asked_units, len(admitted) + n, admitted)
        if n > 0 or allowance:  # granted (and charged) for units gone meanwhile: never sent, charges back
            self.fx.release_slots(n, exempt=exempt, refunds=n, unspent=allowance or ZERO)
        self.admit(admitted, now)
        self.pump(now)

    def _settle_units(self, asked: tuple[dict[str, float], ...], granted: int, admitted: list[Unit]) -> None:
        """The grant of ``granted`` requests took the units ``asked`` for them; the queue may
        have changed since: give back the requests (and units) of grants no unit took,
        and correct by the difference between what the admitted units take and what was
        taken for them."""
        delta: dict[str, float] = {}
        for i in range(granted):
            for name, amount in (asked[i] if i < len(asked) else {}).items():
                delta[name] = delta.get(name, 0.0) - amount
        for unit in admitted:
            for name, amount in (unit.units or {}).items():
                delta[name] = delta.get(name, 0.0) + amount
        unsent = {"requests": float(granted - len(admitted))} if granted > len(admitted) else {}
        if unsent or any(abs(d) > 1e-9 for d in delta.values()):
            now = self.s.clock()
            self.fx.release_slots(0, unsent_units=unsent, usage=(now, {k: d for k, d in delta.items() if d}))

    def _halve(self, queue: Any) -> bool:
        """A money budget refused the batch at the head of ``queue``: put its two halves in
        its place (each asks again, for less), so a budget with room for some of its
        members pays for those rather than for none. Only a batch never sent and not
        recorded (a request taken over, or sent once, goes again whole); False when the
        head cannot be halved (a lone call: the refusal stands)."""
        unit = queue[0]
        if len(unit.groups) < 2 or unit.attempt or unit.record is not None or unit.proposed is not None:
            return False
        queue.popleft()
        self.s.units.pop(unit.id, None)
        middle = len(unit.groups) // 2
        for members in reversed((unit.groups[:middle], unit.groups[middle:])):
            half = Unit(next(self.s.ids), members, exempt=unit.exempt)
            half.queued = True
            half.waiting = unit.waiting
            for group in members:
                group.unit = half
            self.s.units[half.id] = half
            queue.appendleft(half)
        return True

    def admit(self, units: list[Unit], now: float, marked: bool = False) -> None:
        """Units holding slots: mark their receipts running (unless ``marked``: claimed
        straight into running), then send."""
        for unit in units:
            for group in unit.groups:
                group.state = GroupState.ADMITTED
        marking: list[Unit] = []
        for unit in units:
            if unit.groups and self.tool.durable and not marked:
                marking.append(unit)
            else:
                self._send(unit, now)
        self._mark(marking, now)

    def _mark(self, units: list[Unit], now: float) -> None:
        """Mark the units' receipts running; a batch tool's unit not yet recorded proposes
        its request's record with the mark (written in the same transaction, before the
        request can go: a crash, a takeover, a retry then sends exactly that request)."""
        leases = [lease for u in units for g in u.groups if (lease := g.lease) is not None]
        if not leases:
            for unit in units:
                self._send(unit, now)
            return
        records = []
        if self.tool.batch is not None:
            for unit in units:
                if unit.record is None and unit.groups:
                    unit.proposed = batch_record(unit)
                    records.append(unit.proposed)
        batch = next(self.s.ids)
        self.s.batches[batch] = units
        # rides out an outage of the store within its callers' timeout; nothing is sent
        # before the store answered that the receipts are running
        patience = patience_s(g for u in units for g in u.groups)
        self.fx.mark_running(batch, leases, patience, records=tuple(records))

    def on_marked(self, batch: int, report: Any, error: BaseException | None, now: float) -> None:
        """Receipts marked running (fenced): send the units whose leases held. A proposed
        record is the unit's once every member held; a member refused (its lease taken)
        leaves the unit, which proposes its request again without it (marked anew)."""
        units: list[Unit] = self.s.batches.pop(batch, [])
        if error is not None:
            for unit in units:
                unit.proposed = None
                self.p.exits.give_back(unit, error)
            self.pump(now)
            return
        lost = set(report.refused) if report is not None else set()
        again: list[Unit] = []
        for unit in units:
            proposed, unit.proposed = unit.proposed, None
            taken = [g for g in unit.groups if g.key in lost]
            if taken and sent_batch(unit) and len(taken) < len(unit.groups):
                # a batch sent before goes again whole (its key): the lost ride along,
                # answered now; their outputs are salvaged (the store refuses them)
                for group in taken:
                    if not group.lease_lost:
                        group.lease_lost = True
                        self.fx.count("lease_lost")
                    group.beating = self.p.exits.unbeat(group)
                    self.p.exits.answer_early(group, LeaseLostError("the lease was taken before the retry"))
                taken = []
            for group in taken:
                self.fx.count("lease_lost")
                group.beating = self.p.exits.unbeat(group)
                self.p.exits.drop_from_unit(group)
                self.p.exits.settle(
                    group, LeaseLostError("the receipt's lease was taken before the call started")
                )
            if not unit.groups:
                self.p.exits.leave(unit)
            elif proposed is not None and taken:
                again.append(unit)  # its record was not written: proposed anew without them
            else:
                if proposed is not None:
                    unit.record = proposed
                self._send(unit, now)
        if again:
            self._mark(again, now)
        self.pump(now)

    # -- sending -------------------------------------------------------------------------

    def _send(self, unit: Unit, now: float) -> None:
        """The last checks before a request leaves: stop, latch, provider pause, deadline."""
        if not sent_batch(unit):  # a batch sent before goes again whole (its key)
            for group in [g for g in unit.groups if not g.calls and not g.answered]:
                self.p.exits.release_group(
                    group, CallCancelledError("the call was cancelled before it was sent")
                )
        if not unit.groups:
            self.p.exits.leave(unit)
            return
        if self.s.stopping:
            self.p.exits.give_back(unit, CallCancelledError("the dispatcher stopped before the call started"))
            return
        reason = self.fx.latch_reason()
        if reason is not None:
            self.p.exits.refuse_latch([unit], reason)
            return
        blocked = self.fx.blocked_until(now)
        if blocked is not None:
            until, closed = blocked
            if closed:
                self.fx.count("unavailable", sum(len(g.calls) for g in unit.groups))
                self.p.exits.give_back(
                    unit, ProviderUnavailableError(f"provider {self.tool.provider_name!r} is unavailable")
                )
                return
            if unit.deadline is not None and until > unit.deadline:
                self._not_sent(unit, now)
                return
            self.p.exits.readmit(unit, now, front=True)  # the provider paused after this grant
            return
        if unit.deadline is not None and now >= unit.deadline:
            self._not_sent(unit, now)
            return
        if unit.deadline is None:
            timeout_s = unit.timeout_s
            unit.deadline, unit.sent_first_at = now + timeout_s, now
            for group in unit.groups:
                for call in group.calls:
                    call.timed_from = now
            # one timer per timeout and message: the unit's, and each shorter caller's own
            for own in {c.timeout_s for g in unit.groups for c in g.calls if c.timeout_s < timeout_s}:
                self.s.deadlines.setdefault(own, []).append(unit.id)
            self.s.deadlines.setdefault(timeout_s, []).append(unit.id)
        unit.attempt += 1
        unit.out = True
        unit.sent_on_slot = True
        for group in unit.groups:
            group.state = GroupState.RUNNING
            group.ran = True
        counted: tuple[str, ...] = ("requests",)
        if unit.attempt == 1 and unit.readmissions == 0:
            counted = ("requests", "provider_calls", "batches") if len(unit.groups) > 1 else (
                "requests", "provider_calls")  # fmt: skip
        for name in counted:
            self.fx.count(name)
        unit.counted = counted  # taken back if its worker sends nothing (``Finisher._withdrawn``)
        # taken by its worker right before the request, unless its deadline passed first
        unit.ticket = ticket = SendTicket(unit.deadline if unit.deadline is not None else math.inf)
        self.fx.start(spec_for(unit, unit.attempt, now, ticket, traced=self.s.traced))

    def _not_sent(self, unit: Unit, now: float) -> None:
        error = unit.last_error  # (``is``, not its truth: a tool's error may be falsy, or raise)
        if error is None:
            error = NotSentError(f"{self.tool.tool_id}: its turn to send came after its deadline; not sent")
        self.p.finisher.conclude(unit, None, error, now)

    # -- leases, cancellation, stop -----------------------------------------------------

    def on_leases_lost(self, keys: Iterable[str], now: float) -> None:
        """A renewal found these leases taken: callers are told now; a later result is salvaged."""
        for key in keys:
            group = self.s.groups.get(key)
            if group is None or group.lease_lost:
                continue
            if group.state in (GroupState.PERSISTING, GroupState.RELEASING):
                # its write is out: a renewal that raced it (the receipt already completed,
                # failed or released) is no loss; a real one shows in the write's report
                continue
            group.lease_lost = True
            group.beating = False
            self.fx.count("lease_lost")
            error = LeaseLostError(f"lease on {key} was lost while the call waited or ran")
            unit = group.unit
            if (
                group.state is GroupState.CLAIMED
                and unit is not None
                and not unit.slot
                and not sent_batch(unit)
            ):
                self.p.exits.drop_from_unit(group)
                self.p.exits.settle(group, error)
            else:
                # not sent yet: withdrawn; the members still ours go again without the lost (a
                # batch sent before, here or by a lost owner, goes again whole: its key covers
                # every member)
                first = (
                    unit is not None and unit.attempt == 1 and unit.readmissions == 0 and not unit.taken_over
                )
                if unit is not None and unit.out and (first or all(g.lease_lost for g in unit.groups)):
                    self.fx.withdraw(unit.ticket, "lease_lost", error)
                self.p.exits.answer_early(group, error)

    def cancel(self, call: Call, now: float) -> bool:
        """The caller gave up. Returns True when the call was removed (answered cancelled)."""
        group = self.s.groups.get(call.key)
        if group is None or call not in group.calls:
            return False
        if group.state in (GroupState.RUNNING, GroupState.PERSISTING) or (group.unit and group.unit.out):
            # handed to its worker: withdrawn if not sent yet (waiting for its turn at the
            # gate, a batch being built) and no caller of it is left; else it is persisted
            # as usual and the caller still gets the answer if it asks
            return self._withdraw_cancelled(group, call)
        group.calls.remove(call)
        self.fx.count("cancelled")
        self.fx.answer(call, CallCancelledError("the call was cancelled"))
        if group.calls:
            return True
        unit = group.unit
        if group.state is GroupState.CLAIMED and unit is not None and not unit.slot:
            if not sent_batch(unit):  # else it goes again with its batch: output stored
                self.p.exits.release_group(group, None)
        elif group.state is GroupState.WAITING:
            self.p.exits.settle(group, None)
        return True

    def _withdraw_cancelled(self, group: Group, call: Call) -> bool:
        unit = group.unit
        if group.state is not GroupState.RUNNING or unit is None or not unit.out:
            return False
        calls = [c for g in unit.groups for c in g.calls]
        if not all(c is call or getattr(c.future, "cancelled", False) is True for c in calls):
            return False  # another caller still wants it
        if not self.fx.withdraw(unit.ticket, "cancelled", CallCancelledError("the call was cancelled")):
            return False  # its request is out
        for g in unit.groups:  # every caller of the unit cancelled: answered now
            for c in g.calls:
                self.fx.count("cancelled")
                self.fx.answer(c, CallCancelledError("the call was cancelled"))
            g.calls = []
        return True  # its worker reports it not sent (``on_withdrawn``): the receipts go back then

    def joined(self, call: Call, now: float) -> None:
        """A call joined its key's execution. Sent already: it times out on its own
        timer, ``timeout_s`` after it came (a call that came before the send counts from
        the send), and the execution runs as long as it waits (``Unit.deadline``)."""
        group = self.s.groups.get(call.key)
        if group is not None and call.mode is not ClaimMode.FORCE_REFRESH and group.receipt is not None:
            # a refresh under way holding the last good output: an ordinary call takes it now
            self.p.exits.answer_last_good(group, group.receipt, "refresh_running")
            if call not in group.calls:
                return
        if group is not None:
            self.p.waits.waiting_joined(group, call, now)  # a wait (another owner, a reconcile hook) too
        unit = group.unit if group is not None else None
        if group is not None and unit is not None and unit.missing:
            self._brought(unit, group, call, now)
            return
        if unit is None or unit.deadline is None or unit.sent_first_at is None or math.isinf(call.timeout_s):
            return  # not sent (yet, or again): its next send arms a timer for every caller's timeout
        call.timed_from = max(unit.sent_first_at, call.submitted_at)
        own = call.timed_from + call.timeout_s
        self.s.deadlines.setdefault(max(0.0, own - now), []).append(unit.id)
        if unit.deadline is not None and not unit.timed_out and own > unit.deadline:
            unit.deadline = own
            if unit.ticket is not None:  # its worker, not yet sending, sends for it too
                unit.ticket.deadline = own

    def _brought(self, unit: Unit, group: Group, call: Call, now: float) -> None:
        """A call joined a member of a request taken over that waits for its members'
        inputs (``Unit.missing``): one of its input hash is that member's input; the
        request goes once every input is at hand. It waits as long as its latest caller."""
        if group.key in unit.missing and call.input_hash == group.input_hash:
            group.input = call.input
            group.input_known = True
            unit.missing.discard(group.key)
        if not unit.missing:
            unit.deadline = None  # set again at its first send
            self.fx.count("requests_resent")
            self.p.exits.enqueue([unit])
            self.pump(now)
            return
        if (
            unit.deadline is not None
            and not math.isinf(call.timeout_s)
            and now + call.timeout_s > unit.deadline
        ):
            unit.deadline = now + call.timeout_s
            self.s.deadlines.setdefault(call.timeout_s, []).append(unit.id)

    def nested_joined(self, key: str) -> None:
        """A nested call joined a group (or waits behind it: another mode of its key)
        still waiting for a slot: its unit borrows the parent's slot too (else the
        parent, holding the slot, waits on it forever)."""
        group = self.s.groups.get(key)
        if group is not None:
            group.nested = True  # a retry or re-admission borrows a slot too (``Exits.enqueue``)
        unit = group.unit if group is not None else None
        if unit is None or unit.exempt or unit.slot or unit.out:
            return
        if unit.queued and unit in self.s.pending:
            self.s.pending.remove(unit)
            unit.queued = False
            unit.exempt = True
            self.p.exits.enqueue([unit], front=True)
        else:
            unit.exempt = True

    def stop(self, now: float) -> int:
        """Refuse everything not yet sent (claims answered later are released); running
        calls go on and are persisted. Returns the number of calls refused."""
        self.s.stopping = True
        refused = 0
        for queue in (self.s.pending, self.s.pending_exempt):
            units = list(queue)
            queue.clear()
            for unit in units:
                unit.queued = False
                refused += sum(len(g.calls) for g in unit.groups)
                self.p.exits.give_back(
                    unit, CallCancelledError("the dispatcher stopped before the call started")
                )
        gathered, self.s.intake = self.s.intake, []  # drained, not yet claimed
        refused += sum(len(g.calls) for g in gathered)
        self.p.exits.cancel_groups(gathered)
        waiting = [g for g in self.s.groups.values() if g.state is GroupState.WAITING]
        refused += sum(len(g.calls) for g in waiting)
        self.p.exits.cancel_groups(waiting)
        for unit in list(self.s.units.values()):
            if not unit.out and not unit.slot and unit.persisting == 0 and unit.groups:
                refused += sum(len(g.calls) for g in unit.groups)
                self.p.exits.give_back(
                    unit, CallCancelledError("the dispatcher stopped before the call started")
                )
        return refused

    def abandon(self, error: BaseException, kept: Collection[str] = ()) -> None:
        """The actor is gone (stop's bound ran out): answer every caller still waiting with
        ``error``, or, when its group's paid output is in the salvage file (being stored:
        the flusher's, or stop's, salvage keeps it; or one of ``kept``, the keys whose late
        answer was just salvaged), with :class:`ResultSalvagedError`: a rerun replays it,
        the tool is not called again. Nothing else is done: the store and the flusher have
        stopped; leases lapse at their TTL, a result still to come is not kept."""
        for group in list(self.s.groups.values()):
            calls, group.calls = group.calls, []
            paid = group.key in kept or (group.state is GroupState.PERSISTING and is_a(group.written, Done))
            for call in calls:
                self.fx.answer(
                    call,
                    ResultSalvagedError(
                        f"the dispatcher stopped while the paid result of {group.key} was being "
                        "stored: it is kept in the salvage file, and the next run stores it from "
                        "there (the tool is not called again)"
                    )
                    if paid
                    else error,
                )

    @property
    def idle(self) -> bool:
        """Nothing running, persisting or held."""
        return not self.s.groups and not self.s.units


def sent_batch(unit: Unit) -> bool:
    """A request that may have been sent: recorded by the store before its first send (a
    batch tool's, ``Unit.record``: from then on it may be out, in this process or in a
    crashed one), or a batch already sent (waiting to retry, or re-admitted after a 429).
    Its members go again together, so the request keeps the idempotency key the provider
    saw (a member left out would change the batch key, and the others would be billed
    again). A member whose caller left, or whose lease was lost, rides along; its output is
    stored or salvaged as usual."""
    return unit.record is not None or (unit.attempt > 0 and len(unit.groups) > 1)
