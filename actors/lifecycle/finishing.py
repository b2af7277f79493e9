"""After a provider call returns: retries, re-admission, deadlines (persistence and
failure records: :mod:`actors.lifecycle.persisting`).

A retry-safe tool's transient error is retried after a back-off (charging the retry
budget, within the unit's deadline); a 429 re-admits the unit; values are persisted
through the completion flusher (the slot is free once every member is written); errors
are recorded in bulk, or the receipt released when the error says it was never the
call's fault (suspension, credentials changed, budget spent, not storable, not sent).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from actors.errors import (
    CallCancelledError,
    NotSentError,
    ProviderUnreachableError,
    RateLimitedError,
    StoreError,
    ToolTimeoutError,
    UncertainOutcomeError,
    attr_of,
    is_a,
)
from actors.lifecycle.attempts import plain_value, retry_in_call, transient
from actors.lifecycle.calls import Group, GroupState, Role, Unit, note_wait
from actors.lifecycle.exits import Done
from actors.lifecycle.shared import Parts, Shared
from actors.lifecycle.spending import ZERO, exact_difference, overrun_of, settled_cost
from actors.messages import RetryDue, UnitFinished
from stores.claims import batch_unsendable

__all__ = ["Finisher"]

log = logging.getLogger("tooldispatch")

OVERDUE_WARN_EVERY_S = 60.0


class Finisher:
    """A provider call returned: retries, re-admission, deadlines (a part of
    :class:`actors.lifecycle.machine.Lifecycle`; runs on its owner's thread)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    # -- a provider call returned ---------------------------------------------------------

    def on_finished(self, msg: UnitFinished, now: float) -> None:
        """A worker reported an attempt: retry, re-admit, or persist / record per member."""
        unit = self.s.units.get(msg.unit)
        if unit is None or not unit.out or msg.attempt != unit.attempt:
            return
        unit.out = False
        error = msg.error
        members = len(unit.groups)
        if msg.gated is not None:  # its wait at the send gate
            self.fx.waited(msg.gated[0], msg.gated[1] * members)
        if msg.sent_at is not None:
            self.fx.waited("running", (now - msg.sent_at) * members)
        if msg.withdrawn:
            self._withdrawn(unit, msg.withdrawn, error, now)
            return
        unit.relayed = msg.relayed
        relayed = unit.relayed_error(
            error
        )  # a nested call's error passed on: no evidence about this provider
        policy = self.policy
        blocked = self.fx.blocked_until(now) if is_a(error, NotSentError) and msg.sent_at is None else None
        if blocked is not None and blocked[1]:
            # the worker's send gate sent nothing because the provider's circuit opened
            # meanwhile: admitted again, its send refuses it as unavailable and gives the
            # receipt back, as for any call reaching an open circuit
            self._unsend(unit)
            self.p.exits.readmit(unit, now, front=True)
            return
        unsent = not relayed and (
            is_a(error, (ProviderUnreachableError, ConnectionRefusedError))
            or (is_a(error, NotSentError) and msg.sent_at is None)
        )  # a refused connection, an attempt never started or held past its turn: no request
        if unsent:
            self.fx.count("requests", -1)
        if msg.announced and msg.sent_at is not None:  # what the provider said of its limits
            self.fx.release_slots(0, exempt=unit.exempt, announced=(msg.sent_at, tuple(msg.announced)))
        if unit.units is not None:
            self._settle_units(unit, msg, unsent, is_a(error, RateLimitedError) and not relayed)
        if unit.charge is not None:
            self._settle(unit, msg, unsent or (is_a(error, RateLimitedError) and not relayed))
        if unit.retry_charged:  # the retry this attempt was charged for: spent if it went out
            unit.retry_charged = False
            if unsent:
                self.fx.refund_retry()
        if error is not None:
            # a tool's error is judged by its real type, never by what it says its
            # ``__class__`` is (a property that may lie, or raise on this thread)
            if is_a(error, RateLimitedError) and not relayed:
                self.fx.backpressure(attr_of(error, "retry_after"), msg.sent_at)
                self.fx.count("backpressure")
                unit.last_error = error
                self.fx.release_slots(0, exempt=unit.exempt, answered=1)
                if unit.readmissions < policy.retry_attempts and not self.s.stopping and not unit.timed_out:
                    unit.readmissions += 1
                    unit.deadline = None  # not served: its next send gets a whole timeout
                    self._charge_then(unit)
                    return
            elif (
                self.tool.retry_safe and not relayed and retry_in_call(error)
                and unit.attempt < policy.retry_attempts and not self.s.stopping and not unit.timed_out
                and now < (unit.deadline or math.inf)
            ):  # fmt: skip
                unit.last_error = error
                self._charge_then(unit)
                return
            self._report(unit, error, replayed=msg.replayed)
            self.conclude(unit, None, error, now)
            return
        self._report(unit, None, msg.sent_at, msg.replayed)
        if msg.costs and not msg.replayed:  # paid now (a replayed answer was paid before)
            self.fx.spend([cost for cost in msg.costs if cost is not None])
        self.conclude(unit, msg.members, None, now, costs=msg.costs)

    def _settle_units(self, unit: Unit, msg: UnitFinished, unsent: bool, refused: bool) -> None:
        """Settle the units its grant took: all back when nothing went, all but the request
        for a 429 (the provider may count the request, not its units), corrected to its real
        use for an answer (which the bias learns from); otherwise the estimate stands."""
        taken, unit.units = unit.units or {}, None
        if unsent or refused:
            back = {**taken, "requests": 1.0} if unsent else dict(taken)
            self.fx.release_slots(0, exempt=unit.exempt, unsent_units=back)
            return
        if msg.members is None:
            return
        if not msg.usage:  # none reported: its estimate stands (the factor's margin comes back)
            self.s.bias.learn(unit.units_estimate, {})
            back = {n: unit.units_estimate.get(n, 0.0) - amount for n, amount in taken.items()}
            if any(d < 0 for d in back.values()):
                self.fx.release_slots(0, exempt=unit.exempt, usage=(unit.granted_at, back))
            return
        delta = {name: msg.usage.get(name, amount) - amount for name, amount in taken.items()}
        delta.update({name: used for name, used in msg.usage.items() if name not in taken})
        self.s.bias.learn(unit.units_estimate, msg.usage)
        if any(delta.values()):
            self.fx.release_slots(0, exempt=unit.exempt, usage=(unit.granted_at, delta))

    def _settle(self, unit: Unit, msg: UnitFinished, free: bool) -> None:
        """Settle the money charge of an attempt that came back (sent, or known to be unsent:
        ``free``, as a 429): nothing spent for one unsent, refused with a 429 or answered
        by the provider's replay; what it cost for an answer; for another error its charge
        stands (whether it was billed is not known)."""
        charge, unit.charge = unit.charge, None
        if charge is None or self.s.spend_currency is None:
            return
        if free or msg.replayed:
            spent = ZERO
        elif msg.error is not None or msg.members is None:
            return
        else:
            failed = [member[1] is not None for member in msg.members]
            spent = settled_cost(self.tool, unit, charge, msg.costs, failed, self.s.spend_currency)
            over = overrun_of(self.tool, unit, msg.costs, self.s.spend_currency)
            if over > self.s.overrun:  # the estimate is too low: later charges count this much more
                self.s.overrun = over
        if spent != charge:
            self.fx.release_slots(0, exempt=unit.exempt, unspent=exact_difference(charge, spent))

    def _withdrawn(self, unit: Unit, kind: str, error: BaseException | None, now: float) -> None:
        """Its worker sent nothing: the last check before the request refused it
        (:mod:`actors.worker.launch`). Counted as never sent (its stats, its slot's charge).
        Admitted again when callers still wait on it and can be served: callers who came
        after all the others cancelled, or who joined with more time than the deadline it
        was refused by; the rest are refused with ``error`` and the receipts given back."""
        self._unsend(unit)
        if kind == "lease_lost":  # members another run holds now go no further; the rest go again
            for group in [g for g in unit.groups if g.lease_lost]:
                self.p.exits.drop_from_unit(group)
                self.p.exits.settle(group, error)  # its callers heard at the loss
            if not unit.groups:
                self.p.exits.leave(unit)
                return
            if not unit.taken_over:  # its request never went: formed and recorded anew
                unit.record = None
        waiting = [c for g in unit.groups for c in g.calls]
        if waiting and not self.s.stopping and self._serve_again(unit, kind, waiting, now):
            for group in unit.groups:  # a caller who came after the others left: it is theirs
                if group.calls and not any(c.role is Role.OWNER for c in group.calls):
                    group.calls[0].role = Role.OWNER
            self.p.exits.readmit(unit, now, front=True)  # a retry keeps its charge: its send spends it
            return
        if unit.retry_charged:  # a retry that never went out: neither charged nor counted
            unit.retry_charged = False
            self.fx.refund_retry()
            self.fx.count("retries", -1)
        refusal = error or NotSentError(f"{self.tool.tool_id}: not sent")
        if kind == "latch":
            self.fx.count("refused_by_latch", len(waiting))
        elif kind == "stopped":
            self.fx.count("cancelled", len(waiting))
        self.p.exits.give_back(unit, refusal)

    def _unsend(self, unit: Unit) -> None:
        """Its last attempt sent nothing: what its send counted (the stats, the attempt,
        its slot's provider_calls charge) comes back."""
        for name in unit.counted:
            self.fx.count(name, -1)
        unit.counted = ()
        unit.attempt -= 1
        unit.sent_on_slot = False  # its slot's provider_calls charge comes back with it

    @staticmethod
    def _serve_again(unit: Unit, kind: str, waiting: list[Any], now: float) -> bool:
        if kind in ("cancelled", "lease_lost"):
            return True
        if kind != "deadline" or unit.ticket is None:
            return False
        ends = [now + c.timeout_s if c.timed_from is None else c.timed_from + c.timeout_s for c in waiting]
        latest = max(ends)
        if latest <= unit.ticket.judged + 1e-3 or latest <= now:
            return False  # nobody has more time than the deadline it could not make
        unit.deadline, unit.timed_out = latest, False
        return True

    def _report(
        self, unit: Unit, error: BaseException | None, sent_at: float | None = None, replayed: bool = False
    ) -> None:
        """Tell the governor what the provider's answer says of it, and count the lookups
        the provider answered (``answered``: anew, what it bills; ``replayed``: from its
        record of the idempotency key): a value, or an error that is neither a 429, a
        failure to reach it or to be answered in time, nor a nested call's passed on."""
        if error is None:
            self.fx.release_slots(0, exempt=unit.exempt, successes=1, answered=1, sent_at=sent_at)
        elif unit.relayed_error(error):
            return  # a nested call's error: nothing learnt of this provider (no circuit count)
        elif transient(error):
            self.fx.release_slots(0, exempt=unit.exempt, unavailable=1)
            return
        elif not is_a(error, (RateLimitedError, NotSentError)):
            self.fx.release_slots(0, exempt=unit.exempt, answered=1)
        else:
            return
        self.fx.count("replayed" if replayed else "answered", len(unit.groups))

    def _charge_then(self, unit: Unit) -> None:
        """Charge the retry budget; the next attempt is re-admitted after its back-off."""
        self.p.exits.free_slot(unit)
        for group in unit.groups:
            group.state = GroupState.CLAIMED
        self.fx.charge_retry(unit.id)

    def on_retry_charged(self, unit_id: int, error: BaseException | None, now: float) -> None:
        """The retry budget answered: back off, or give up (not recorded as a failure)."""
        unit = self.s.units.get(unit_id)
        if unit is None or unit.persisting:  # concluded meanwhile (its deadline passed, a
            if error is None:  # cancel, a stop): that retry never goes, its charge comes back
                self.fx.refund_retry()
            return
        if error is not None:
            self.conclude(unit, None, error, now)
            return
        unit.retry_charged = True
        self.fx.count("retries")
        if is_a(unit.last_error, RateLimitedError):
            self.p.exits.enqueue([unit], front=True)  # the governor holds it until the pause ends
            self.p.admission.pump(now)
            return
        backoff = self.policy.retry_backoff_s * (2 ** max(0, unit.attempt - 1))
        unit.waiting = ("retry_backoff", now)
        self.fx.later(backoff, RetryDue(unit=unit.id))

    def on_retry_due(self, unit_id: int, now: float) -> None:
        """A retry's back-off elapsed: queue it for admission (its deadline still holds)."""
        unit = self.s.units.get(unit_id)
        if unit is None or unit.out or unit.slot or unit.persisting:
            return
        if unit.waiting is not None:  # its back-off is over
            _, since = unit.waiting
            unit.waiting = None
            self.fx.waited("retry_backoff", (now - since) * len(unit.groups))
            if self.s.traced:
                note_wait(unit.groups, "retry_backoff", since, now)
        self.p.exits.enqueue([unit], front=True)
        self.p.admission.pump(now)

    def on_deadlines(self, unit_ids: Iterable[int], now: float) -> None:
        """A deadline timer fired for these units (see :meth:`on_deadline`)."""
        for unit_id in unit_ids:
            self.on_deadline(unit_id, now)

    def on_deadline(self, unit_id: int, now: float) -> None:
        """A unit's deadline passed: a running call's callers time out now (the call keeps
        its slot, lease and heartbeat until it returns); a call not running ends here."""
        unit = self.s.units.get(unit_id)
        if unit is None:
            return
        if unit.persisting and not unit.out:
            self._answer_writing(unit, now)
            return
        self._time_out_callers(unit, now)
        if unit.timed_out or unit.deadline is None or now < unit.deadline - 1e-3:
            return  # an older deadline (re-admitted after a 429: it has a new one)
        error = ToolTimeoutError(f"{self.tool.tool_id} did not return within {unit.timeout_s} s")
        if unit.out:
            unit.timed_out = True
            self.fx.count("timed_out")
            if unit.ticket is None or unit.ticket.sent:  # its function runs (not held before it)
                self._warn_overdue(now)
            for group in unit.groups:
                self.p.exits.answer_early(group, error)
            return
        if unit.slot or unit.queued:
            return  # admitted again; checked before it is sent
        if unit.missing:  # a request taken over whose members' inputs never all came
            self._unsendable(unit, now)
            return
        last = unit.last_error  # (``is``, not its truth: a tool's error may be falsy, or raise)
        self.conclude(unit, None, last if last is not None else error, now)

    def _unsendable(self, unit: Unit, now: float) -> None:
        """A request taken over, its record holding no inputs, whose members' calls did
        not all come with their inputs within its callers' timeout: it cannot be sent
        again as itself, so its members are recorded uncertain (as a claim records those
        of a request it cannot rebuild, ``stores.claims.batch_unsendable``)."""
        record = unit.record
        assert record is not None
        if not any(g.calls for g in unit.groups):  # nobody waits: given back, the record kept
            unit.missing = set()
            self.p.exits.give_back(unit, CallCancelledError("the call was cancelled before it was sent"))
            return
        absent = ", ".join(sorted(k[:16] for k in unit.missing))
        why = (
            f"the input of member(s) {absent} never came: its tool keeps no input in the store, "
            "so the request is rebuilt only from calls of every member"
        )
        error = UncertainOutcomeError(
            batch_unsendable(record.key, len(record.members), why), failure_kind=None
        )
        unit.missing = set()
        self.conclude(unit, None, error, now, uncertain=True)

    def _warn_overdue(self, now: float) -> None:
        """Say, once a minute at most, that functions past their timeout still hold slots: a
        slow provider, or a tool that waits on calls it made from threads of its own."""
        if now - self.s.overdue_warned_at < OVERDUE_WARN_EVERY_S:
            return
        self.s.overdue_warned_at = now
        held = sum(
            1 for u in self.s.units.values() if u.timed_out and u.out and (u.ticket is None or u.ticket.sent)
        )
        log.warning(
            "%d call(s) of %s passed their timeout while its function still runs; each keeps its "
            "slot until the function returns. Its provider may be slow to answer; or the function "
            "waits on calls it made from threads of its own outside ctx.nested() and ctx.wrap, which "
            "at the concurrency ceiling wait for the slots their parents hold",
            held, self.tool.tool_id,
        )  # fmt: skip

    def _time_out_callers(self, unit: Unit, now: float) -> None:
        """Callers whose own deadline has passed are answered now: ``timeout_s`` after the
        unit's first send, or after the call came if it attached later. The call goes on for
        the others (and its late result is persisted, answering any caller still waiting)."""
        if (
            unit.sent_first_at is None
            or unit.deadline is None
            or (not unit.timed_out and now >= unit.deadline - 1e-3)
        ):
            return  # not sent yet, or its own deadline is here: every caller is answered below
        for group in unit.groups:
            late = group.take_late(unit.sent_first_at, now)
            if late and not group.calls:
                group.answered = True  # it goes on, callerless, to its persisted result
            for call in late:
                error = ToolTimeoutError(f"{self.tool.tool_id} did not return within {call.timeout_s} s")
                self.fx.answer(call, self.p.exits.outcome_for(call, group, error))

    def _answer_writing(self, unit: Unit, now: float) -> None:
        """The tool returned and its outcome is being written (a slow or locked store):
        callers whose own timeout passed get that outcome now; the write goes on (should
        it fail, the output is salvaged, as for any write)."""
        sent = unit.sent_first_at
        if sent is None:
            return
        for group in unit.groups:
            if group.state is not GroupState.PERSISTING or group.written is None:
                continue
            for call in group.take_late(sent, now):
                self.fx.answer(call, self.p.exits.outcome_for(call, group, group.written))

    def conclude(
        self,
        unit: Unit,
        members: list[Any] | None,
        error: BaseException | None,
        now: float,
        uncertain: bool = False,
        costs: tuple[Any, ...] = (),
    ) -> None:
        """The unit's last attempt is over: persist values (with what each cost:
        ``costs``, per member), record or release the rest (``uncertain``: failures are
        recorded uncertain whatever the tool)."""
        for queue in (self.s.pending, self.s.pending_exempt):
            if unit.queued and unit in queue:
                queue.remove(unit)
        values: list[tuple[Group, str]] = []
        failed: list[tuple[Group, BaseException]] = []
        for i, group in enumerate(unit.groups):
            if error is not None:
                failed.append((group, error))
                continue
            text: Any
            member_error: BaseException | None
            text, member_error = members[i] if members is not None else (None, StoreError("no result"))
            if member_error is not None:
                failed.append((group, member_error))
            elif not self.tool.durable:
                self.p.exits.settle(group, Done(plain_value(text), "live"))
            else:
                group.cost = costs[i] if i < len(costs) else None
                values.append((group, text))
        if not self.tool.durable:
            for group, exc in failed:
                self.fx.count("failures")
                self.p.exits.settle(group, exc)
            self.p.exits.leave(unit)
            return
        unit.persisting = len(values) + len(failed)
        if values:
            self.p.persister.persist(values)
        if failed:
            self.p.persister.fail(failed, uncertain=uncertain)
        if unit.persisting == 0:
            self.p.exits.leave(unit)
