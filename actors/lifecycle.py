"""The life of a call group, as a plain state machine: messages in, effects out, time passed in.

One :class:`Lifecycle` per tool, owned by that tool's queue actor. Each group moves
through :class:`~actors._calls.GroupState`::

    queued -> claiming -> reused | waiting | claimed -> admitted -> running -> persisting -> settled

and every transition is one method taking a message's content and ``now``
(``time.monotonic()`` seconds). Nothing here blocks or sleeps: a request to another
actor, the store or the worker pool is an effect (:class:`Effects`), and its answer
comes back as another method call. A wait on another owner's receipt is a timer plus a
plain read. What a group or unit holds is released in one place whichever way it
leaves: :meth:`Lifecycle._settle` (heartbeat registration, its place in the in-flight
map) and :meth:`Lifecycle._leave` (the unit's slot).

Rules (SEMANTICS.md): claims in bulk per claim mode; dispositions as its table says; a
slot per provider call, free when its result is persisted; the latch, a stop and a
paused or closed provider are checked right before each send; a unit whose deadline
passes before it is sent is never sent; one that times out while running keeps its
slot, lease and heartbeat until its worker returns, and its late result is persisted.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterable
from typing import Any, Protocol

from stores._codec import EncodedOutput, decode_output, encode_output, salvage_form
from stores import output_too_large_error
from stores.types import (
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Receipt,
)

from ._calls import Call, Group, GroupState, Role, Unit
from ._execute import AttemptSpec, failure_kind_for, plain_value, retry_in_call, spec_for, transient
from .errors import (
    AuthScopeChangedError,
    InvalidOutputError,
    OutputNotStorableError,
    BudgetExceededError,
    CallCancelledError,
    LeaseLostError,
    NotSentError,
    PersistenceCircuitOpenError,
    ProviderUnavailableError,
    RateLimitedError,
    ReceiptPersistenceError,
    ReceiptWaitTimeoutError,
    RecordedFailureError,
    StoreError,
    SuspendedError,
    ToolTimeoutError,
)
from .messages import DeadlineDue, PollDue, RetryDue, UnitFinished
from .results import ToolResult
from .tool import Policy, Tool

__all__ = ["Effects", "Lifecycle"]

_RELEASE_ON = (SuspendedError, AuthScopeChangedError, BudgetExceededError, OutputNotStorableError, NotSentError)
"""Errors after which a receipt is given back (pending), not failed."""


class Effects(Protocol):
    """What the lifecycle asks its actor to do. Each answer comes back as a message."""

    def claim(self, batch: int, mode: ClaimMode, stale_after_s: float | None, requests: list[ClaimRequest]) -> None: ...
    def read(self, batch: int, keys: list[str]) -> None: ...
    def acquire(self, want: int, exempt: bool) -> None: ...
    def release_slots(self, count: int, exempt: bool = False, successes: int = 0, unavailable: int = 0, answered: int = 0) -> None: ...
    def backpressure(self, retry_after: Any, sent_at: float | None) -> None: ...
    def mark_running(self, batch: int, leases: list[LeaseRef]) -> None: ...
    def start(self, spec: AttemptSpec) -> None: ...
    def persist(self, batch: int, entries: list[Completion], input_hashes: dict[str, str]) -> None: ...
    def record_failures(self, batch: int, failures: list[Failure]) -> None: ...
    def release_receipts(self, leases: list[LeaseRef]) -> None: ...
    def beat(self, batch: int, leases: list[LeaseRef]) -> None: ...
    def unbeat(self, keys: list[str]) -> None: ...
    def charge_retry(self, unit: int) -> None: ...
    def later(self, delay_s: float, message: Any) -> None: ...
    def blocked_until(self, now: float) -> tuple[float, bool] | None: ...
    def latch_reason(self) -> str | None: ...
    def trip_latch(self, reason: str) -> None: ...
    def answer(self, call: Call, outcome: Any) -> None: ...
    def requeue(self, call: Call, error: BaseException) -> None: ...
    def salvage(self, group: Group, output: Any, error: str) -> None: ...
    def count(self, name: str, n: int = 1) -> None: ...
    def remember(self, key: str, text: str, cached: bool) -> None: ...
    def salvage_path(self) -> str: ...
    # fmt: skip


class Lifecycle:
    """Every call group of one tool past its batch grace window (see the module doc).

    Args:
        tool: the tool.
        policy: timeouts, retries, receipt waits.
        org_id / scope: the run's org and scope (claim requests).
        fx: the effects port (the actor, or a recorder in tests).
        width: most units of this tool holding slots at once (suggested parallelism).
    """

    def __init__(self, tool: Tool, policy: Policy, org_id: str, scope: str, fx: Effects, width: int) -> None:
        self.tool = tool
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
        self.acquiring = {False: False, True: False}
        self.stopping = False
        self._batches: dict[int, Any] = {}
        self._ids = itertools.count(1)

    # -- from the queue -----------------------------------------------------------------

    def drained(self, groups: list[Group], now: float) -> None:
        """Groups leave the batch grace window: claim (durable) or run (not durable)."""
        for group in groups:
            self.groups[group.key] = group
        if self.stopping:
            self._cancel(groups)
            return
        if not self.tool.durable:
            self._enqueue(self._compile(groups))
            self.pump(now)
            return
        self._claim(groups, None)

    def _claim(self, groups: list[Group], force: ClaimMode | None) -> None:
        buckets: dict[tuple[ClaimMode, float | None], list[Group]] = {}
        for group in groups:
            group.state = GroupState.CLAIMING
            buckets.setdefault((force or group.mode, group.stale_after_s), []).append(group)
        for (mode, stale), members in buckets.items():
            batch = next(self._ids)
            self._batches[batch] = members
            safe = self.tool.retry_safe
            requests = [ClaimRequest(g.key, self.scope, self.tool.tool_id, g.input_hash, retry_safe=safe) for g in members]
            self.fx.claim(batch, mode, stale, requests)

    def on_claimed(self, batch: int, claims: list[Any] | None, error: BaseException | None, now: float) -> None:
        """A bulk claim answered: sort the dispositions."""
        members: list[Group] = self._batches.pop(batch, [])
        if error is not None or claims is None:
            for group in members:
                self._settle(group, error or StoreError("the claim returned nothing"))
            self.pump(now)
            return
        claimed: list[Group] = []
        again: list[Group] = []
        waiting: list[Group] = []
        for group, claim in zip(members, claims, strict=True):
            disposition, receipt = claim.disposition, claim.receipt
            if disposition is ClaimDisposition.CLAIMED:
                self._stop_waiting(group)
                group.receipt = receipt
                if receipt.attempts <= 1 and receipt.generation <= 1:
                    self.fx.count("receipts_created")
                group.state = GroupState.CLAIMED
                if not group.calls or self.stopping:  # every caller gave up meanwhile
                    self.fx.release_receipts([LeaseRef(receipt.key, receipt.lease_id)])
                    self._settle(group, CallCancelledError("the call was cancelled before it was sent"))
                    continue
                claimed.append(group)
            elif disposition is ClaimDisposition.REUSED:
                self._settle(group, self._reused(group, receipt, "in_flight" if group.polls else "cached"))
            elif disposition is ClaimDisposition.FAILED:
                kind = receipt.failure_kind
                if kind is not None and kind.retryable and group.mode is ClaimMode.NORMAL:
                    group.mode = ClaimMode.RETRY_FAILED  # reuses a receipt completed meanwhile
                    again.append(group)
                else:
                    self._settle(group, self._recorded_failure(group, receipt))
            elif disposition.value == "uncertain":
                self._settle(group, self._uncertain(group, receipt))
            elif group.polls >= self.policy.receipt_wait_max_attempts:
                self._settle(group, ReceiptWaitTimeoutError(f"receipt {group.key} is still held by another owner's live lease"))
            else:  # running, blocked_active_lease: another owner holds it
                group.force_after_wait = disposition is ClaimDisposition.BLOCKED_ACTIVE_LEASE
                waiting.append(group)
        if claimed:
            leases = [g.lease for g in claimed if g.lease is not None]
            self.fx.beat(batch, leases)
            for group in claimed:
                group.beating = True
            self._enqueue(self._compile(claimed))
        if again:
            self._claim(again, None)
        if waiting:
            self._wait(waiting, now)
        self.pump(now)

    def _reused(self, group: Group, receipt: Receipt, execution: str) -> Any:
        if receipt.input_hash != group.input_hash:
            return StoreError(
                f"receipt {group.key} holds input hash {receipt.input_hash}, not {group.input_hash}: "
                "a receipt key collision or a corrupted receipt"
            )
        try:
            text = encode_output(receipt.output)
        except Exception as exc:
            return StoreError(f"receipt {group.key} holds an output that cannot be read back: {exc}")
        return _Done(text, execution)

    @staticmethod
    def _recorded_failure(group: Group, receipt: Receipt) -> BaseException:
        return RecordedFailureError(
            f"durable tool call {group.key} failed earlier: {receipt.error or 'unknown error'}",
            failure_kind=receipt.failure_kind,
        )

    @staticmethod
    def _uncertain(group: Group, receipt: Receipt) -> BaseException:
        from . import errors

        cls = getattr(errors, "UncertainOutcomeError", RecordedFailureError)
        return cls(  # type: ignore[no-any-return]
            f"the outcome of {group.key} is uncertain (its request may have reached the provider); "
            "resolve it with `tooldispatch receipts resolve KEY --rerun | --fail`",
            failure_kind=receipt.failure_kind,
        )

    # -- waiting on another owner (timers and plain reads, no thread held) -------------

    def _wait(self, groups: list[Group], now: float) -> None:
        policy = self.policy
        for group in groups:
            group.state = GroupState.WAITING
            if group.polls == 0:
                group.poll_delay_s = policy.receipt_poll_initial_s
                self.fx.count("owner_waits", len(group.calls))
            if not group.waiting_counted:
                group.waiting_counted = len(group.calls)
                self.fx.count("waiting_on_owner", group.waiting_counted)
        delay = min(g.poll_delay_s for g in groups)
        for group in groups:
            group.poll_delay_s = min(group.poll_delay_s * 2, policy.receipt_poll_max_s)
        self.fx.later(delay, PollDue(keys=tuple(g.key for g in groups)))

    def on_poll(self, keys: Iterable[str], now: float) -> None:
        """A poll timer fired: read the receipts still waited on."""
        groups = [g for k in keys if (g := self.groups.get(k)) is not None and g.state is GroupState.WAITING]
        if not groups:
            return
        if self.stopping:
            self._cancel(groups)
            return
        batch = next(self._ids)
        self._batches[batch] = groups
        self.fx.read(batch, [g.key for g in groups])

    def on_read(self, batch: int, receipts: list[Any] | None, error: BaseException | None, now: float) -> None:
        """A poll's read answered: take completed outputs; claim what may be free; wait on."""
        groups: list[Group] = self._batches.pop(batch, [])
        groups = [g for g in groups if g.state is GroupState.WAITING and g.calls]
        reclaim: list[Group] = []
        force: list[Group] = []
        still: list[Group] = []
        for i, group in enumerate(groups):
            group.polls += 1
            receipt = None if receipts is None else receipts[i]
            status = None if receipt is None else receipt.status.value
            if error is None and status == "completed":
                if group.force_after_wait:
                    force.append(group)
                else:
                    self._settle(group, self._reused(group, receipt, "in_flight"))
                continue
            free = error is None and status not in ("queued", "running")
            # the store judges leases: claim when the read says free, now and then (the
            # owner may have died), and after the last poll (a live lease then times out)
            if free or group.polls % 8 == 0 or group.polls >= self.policy.receipt_wait_max_attempts:
                (force if group.force_after_wait else reclaim).append(group)
            else:
                still.append(group)
        if reclaim:
            self._claim(reclaim, None)
        if force:
            self._claim(force, ClaimMode.FORCE_REFRESH)
        if still:
            self._wait(still, now)

    # -- admission -----------------------------------------------------------------------

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
            queue = self.pending_exempt if unit.exempt else self.pending
            if front:
                queue.appendleft(unit)
            else:
                queue.append(unit)

    def pump(self, now: float) -> None:
        """Ask the governor for slots for what waits (one request out at a time)."""
        for exempt, queue in ((False, self.pending), (True, self.pending_exempt)):
            self._drop_empty(queue)
            if not queue or self.acquiring[exempt]:
                continue
            reason = self.fx.latch_reason()
            if reason is not None:
                self._refuse_latch(list(queue), reason)
                queue.clear()
                continue
            want = len(queue) if exempt else min(len(queue), self.width - self.holding)
            if want < 1:
                continue
            self.acquiring[exempt] = True
            self.fx.acquire(want, exempt)

    def _drop_empty(self, queue: collections.deque[Unit]) -> None:
        while queue and not queue[0].groups:
            self.units.pop(queue.popleft().id, None)

    def on_granted(self, n: int | None, error: BaseException | None, now: float, exempt: bool = False) -> None:
        """The governor answered: start up to ``n`` units, or refuse every waiting one."""
        self.acquiring[exempt] = False
        queue = self.pending_exempt if exempt else self.pending
        if error is not None or not n:
            units = list(queue)
            queue.clear()
            if isinstance(error, ProviderUnavailableError):
                self.fx.count("unavailable", sum(len(g.calls) for u in units for g in u.groups))
            for unit in units:
                self._give_back(unit, error or CallCancelledError("no slot was granted"))
            self.pump(now)
            return
        admitted: list[Unit] = []
        while n > 0 and queue:
            unit = queue.popleft()
            if not unit.groups:
                self.units.pop(unit.id, None)
                continue
            unit.slot = True
            if not exempt:
                self.holding += 1
            n -= 1
            admitted.append(unit)
        if n > 0:
            self.fx.release_slots(n, exempt=exempt)
        self._admit(admitted, now)
        self.pump(now)

    def _admit(self, units: list[Unit], now: float) -> None:
        for unit in units:
            for group in unit.groups:
                group.state = GroupState.ADMITTED
        marking = [u for u in units if u.groups and self.tool.durable]
        for unit in units:
            if unit not in marking:
                self._send(unit, now)
        leases = [g.lease for u in marking for g in u.groups if g.lease is not None]
        if leases:
            batch = next(self._ids)
            self._batches[batch] = marking
            self.fx.mark_running(batch, leases)
        else:
            for unit in marking:
                self._send(unit, now)

    def on_marked(self, batch: int, report: Any, error: BaseException | None, now: float) -> None:
        """Receipts marked running (fenced): send the units whose leases held."""
        units: list[Unit] = self._batches.pop(batch, [])
        if error is not None:
            for unit in units:
                self._give_back(unit, error)
            self.pump(now)
            return
        lost = set(report.refused) if report is not None else set()
        for unit in units:
            for group in [g for g in unit.groups if g.key in lost]:
                self.fx.count("lease_lost")
                group.beating = self._unbeat(group)
                self._drop_from_unit(group)
                self._settle(group, LeaseLostError("the receipt's lease was taken before the call started"))
            if unit.groups:
                self._send(unit, now)
            else:
                self._leave(unit)
        self.pump(now)

    # -- sending -------------------------------------------------------------------------

    def _send(self, unit: Unit, now: float) -> None:
        """The last checks before a request leaves: stop, latch, provider pause, deadline."""
        for group in [g for g in unit.groups if not g.calls and not g.answered]:
            self._release_group(group, CallCancelledError("the call was cancelled before it was sent"))
        if not unit.groups:
            self._leave(unit)
            return
        if self.stopping:
            self._give_back(unit, CallCancelledError("the dispatcher stopped before the call started"))
            return
        reason = self.fx.latch_reason()
        if reason is not None:
            self._refuse_latch([unit], reason)
            return
        blocked = self.fx.blocked_until(now)
        if blocked is not None:
            until, closed = blocked
            if closed:
                self.fx.count("unavailable", sum(len(g.calls) for g in unit.groups))
                self._give_back(unit, ProviderUnavailableError(f"provider {self.tool.provider_name!r} is unavailable"))
                return
            if unit.deadline is not None and until > unit.deadline:
                self._not_sent(unit, now)
                return
            self._readmit(unit, now, front=True)  # the provider paused after this grant
            return
        if unit.deadline is not None and now >= unit.deadline:
            self._not_sent(unit, now)
            return
        if unit.deadline is None:
            unit.deadline = now + unit.timeout_s
            self.fx.later(unit.timeout_s, DeadlineDue(unit=unit.id))
        unit.attempt += 1
        unit.out = True
        for group in unit.groups:
            group.state = GroupState.RUNNING
            group.ran = True
        self.fx.count("requests")
        if unit.attempt == 1 and unit.readmissions == 0:
            self.fx.count("provider_calls")
            if len(unit.groups) > 1:
                self.fx.count("batches")
        self.fx.start(spec_for(unit, unit.attempt, now))

    def _not_sent(self, unit: Unit, now: float) -> None:
        error = unit.last_error or NotSentError(
            f"{self.tool.tool_id}: its turn to send came after its deadline; not sent"
        )
        self._conclude(unit, None, error, now)

    def _readmit(self, unit: Unit, now: float, front: bool = False) -> None:
        self._free_slot(unit)
        for group in unit.groups:
            group.state = GroupState.CLAIMED
        self._enqueue([unit], front=front)

    # -- a provider call returned ---------------------------------------------------------

    def on_finished(self, msg: UnitFinished, now: float) -> None:
        """A worker reported an attempt: retry, re-admit, or persist / record per member."""
        unit = self.units.get(msg.unit)
        if unit is None or not unit.out or msg.attempt != unit.attempt:
            return
        unit.out = False
        error = msg.error
        policy = self.policy
        if error is not None:
            if isinstance(error, RateLimitedError):
                self.fx.backpressure(error.retry_after, msg.sent_at)
                self.fx.count("backpressure")
                unit.last_error = error
                self.fx.release_slots(0, exempt=unit.exempt, answered=1)
                if unit.readmissions < policy.retry_attempts and not self.stopping and not unit.timed_out:
                    unit.readmissions += 1
                    self._charge_then(unit)
                    return
            elif (
                self.tool.retry_safe and retry_in_call(error) and unit.attempt < policy.retry_attempts
                and not self.stopping and not unit.timed_out and now < (unit.deadline or math.inf)
            ):  # fmt: skip
                unit.last_error = error
                self._charge_then(unit)
                return
            self._report(unit, error)
            self._conclude(unit, None, error, now)
            return
        self._report(unit, None)
        self._conclude(unit, msg.members, None, now)

    def _report(self, unit: Unit, error: BaseException | None) -> None:
        if error is None:
            self.fx.release_slots(0, exempt=unit.exempt, successes=1, answered=1)
        elif transient(error):
            self.fx.release_slots(0, exempt=unit.exempt, unavailable=1)
        elif not isinstance(error, (RateLimitedError, NotSentError)):
            self.fx.release_slots(0, exempt=unit.exempt, answered=1)

    def _charge_then(self, unit: Unit) -> None:
        """Charge the retry budget; the next attempt is re-admitted after its back-off."""
        self._free_slot(unit)
        for group in unit.groups:
            group.state = GroupState.CLAIMED
        self.fx.charge_retry(unit.id)

    def on_retry_charged(self, unit_id: int, error: BaseException | None, now: float) -> None:
        """The retry budget answered: back off, or give up (not recorded as a failure)."""
        unit = self.units.get(unit_id)
        if unit is None or unit.persisting:  # concluded meanwhile (its deadline passed)
            return
        if error is not None:
            self._conclude(unit, None, error, now)
            return
        self.fx.count("retries")
        if isinstance(unit.last_error, RateLimitedError):
            self._enqueue([unit], front=True)  # the governor holds it until the pause ends
            self.pump(now)
            return
        backoff = self.policy.retry_backoff_s * (2 ** max(0, unit.attempt - 1))
        self.fx.later(backoff, RetryDue(unit=unit.id))

    def on_retry_due(self, unit_id: int, now: float) -> None:
        """A retry's back-off elapsed: queue it for admission (its deadline still holds)."""
        unit = self.units.get(unit_id)
        if unit is None or unit.out or unit.slot or unit.persisting:
            return
        self._enqueue([unit], front=True)
        self.pump(now)

    def on_deadline(self, unit_id: int, now: float) -> None:
        """A unit's deadline passed: a running call's callers time out now (the call keeps
        its slot, lease and heartbeat until it returns); a call not running ends here."""
        unit = self.units.get(unit_id)
        if unit is None or unit.timed_out:
            return
        error = ToolTimeoutError(f"{self.tool.tool_id} did not return within {unit.timeout_s} s")
        if unit.out:
            unit.timed_out = True
            self.fx.count("timed_out")
            for group in unit.groups:
                self._answer_early(group, error)
            return
        if unit.slot or unit in self.pending or unit in self.pending_exempt:
            return  # admitted again; checked before it is sent
        self._conclude(unit, None, unit.last_error or error, now)

    def _conclude(self, unit: Unit, members: list[Any] | None, error: BaseException | None, now: float) -> None:
        """The unit's last attempt is over: persist values, record or release the rest."""
        for queue in (self.pending, self.pending_exempt):
            if unit in queue:
                queue.remove(unit)
        values: list[tuple[Group, str]] = []
        failed: list[tuple[Group, BaseException]] = []
        for i, group in enumerate(unit.groups):
            if error is not None:
                failed.append((group, error))
                continue
            text, member_error = members[i] if members is not None else (None, StoreError("no result"))
            if member_error is not None:
                failed.append((group, member_error))
            elif not self.tool.durable:
                self._settle(group, _Done(plain_value(text), "live"))
            else:
                values.append((group, text))
        if not self.tool.durable:
            for group, exc in failed:
                self.fx.count("failures")
                self._settle(group, exc)
            self._leave(unit)
            return
        unit.persisting = len(values) + len(failed)
        if values:
            self._persist(values)
        if failed:
            self._fail(failed)
        if unit.persisting == 0:
            self._leave(unit)

    def _persist(self, values: list[tuple[Group, str]]) -> None:
        batch = next(self._ids)
        self._batches[batch] = values
        entries = [Completion(g.key, g.receipt.lease_id or "", EncodedOutput(t)) for g, t in values if g.receipt]
        for group, _ in values:
            group.state = GroupState.PERSISTING
        self.fx.persist(batch, entries, {g.key: g.input_hash for g, _ in values})

    def on_persisted(self, batch: int, outcomes: dict[str, Any] | None, error: BaseException | None, now: float) -> None:
        """The flusher settled outputs: answer callers; the slot is free once all are written."""
        values: list[tuple[Group, str]] = self._batches.pop(batch, [])
        refused: list[tuple[Group, BaseException]] = []
        for group, text in values:
            outcome = None if outcomes is None else outcomes.get(group.key)
            kind = "salvaged" if outcome is None else outcome.kind
            if outcome is None:
                self.fx.salvage(group, decode_output(text), f"the completion flusher failed: {error}")
            if kind in ("persisted", "salvaged"):
                if kind == "salvaged":
                    self.fx.count("salvaged")
                self._settle(group, _Done(text, "live"))
            elif kind == "completed_by_other":
                self._settle(group, _Done(encode_output(outcome.output), "cached"))
            elif kind == "lease_lost":
                self.fx.count("lease_lost")
                self.fx.count("salvaged")
                self._settle(group, LeaseLostError(f"lease on {group.key} was lost; output salvaged"))
            else:  # refused by the store: the caller still gets what was paid for; salvaged
                self.fx.salvage(group, EncodedOutput(text), outcome.error)
                self.fx.count("salvaged")
                self._answer_early(group, _Done(text, "live"))
                if outcome.reason == "output_too_large":
                    refused.append((group, _TooLarge(len(text.encode("utf-8")))))
                else:
                    refused.append((group, OutputNotStorableError(f"receipt {group.key} refused the output: {outcome.error}")))
                continue
            self._persisted_one(group)
        if refused:
            self._fail(refused, counted=False)

    def _fail(self, failed: list[tuple[Group, BaseException]], counted: bool = True) -> None:
        records: list[Failure] = []
        released: list[Group] = []
        outcome: dict[str, BaseException] = {}
        for group, exc in failed:
            raw = getattr(exc, "raw_output", _MISSING)
            if raw is not _MISSING:  # paid for but not storable: kept in a described form
                self.fx.salvage(group, salvage_form(raw)[0], str(exc))
                self.fx.count("salvaged")
            if isinstance(exc, _RELEASE_ON) or isinstance(exc, LeaseLostError) or group.receipt is None:
                released.append(group)
                outcome[group.key] = exc
                continue
            if counted:
                self.fx.count("failures")
            outcome[group.key] = exc
            records.append(Failure(group.key, group.receipt.lease_id or "", *self._failure_text(exc)))
            group.state = GroupState.PERSISTING
        for group in released:
            exc = outcome[group.key]
            self._release_group(group, exc, lease_lost=isinstance(exc, LeaseLostError))
        if records:
            batch = next(self._ids)
            self._batches[batch] = [(g, outcome[g.key]) for g, _ in failed if g.key in {r.key for r in records}]
            self.fx.record_failures(batch, records)

    def _failure_text(self, exc: BaseException) -> tuple[str, Any]:
        if isinstance(exc, _TooLarge):
            return output_too_large_error(exc.size_bytes, self.fx.salvage_path()), FailureKind.OUTPUT_TOO_LARGE
        if isinstance(exc, InvalidOutputError):
            return str(exc), FailureKind.PERMANENT
        return str(exc) or type(exc).__name__, failure_kind_for(exc)

    def on_failures_recorded(self, batch: int, report: Any, error: BaseException | None, now: float) -> None:
        """Failures written (or the write failed: the latch trips, callers hear both causes)."""
        failed: list[tuple[Group, BaseException]] = self._batches.pop(batch, [])
        if error is not None:
            self.fx.trip_latch(f"recording failures failed: {error}")
        for group, exc in failed:
            if error is not None:
                exc = ReceiptPersistenceError(f"recording the failure of {group.key} failed: {error}", cause=exc)
            self._settle(group, exc)
            self._persisted_one(group)

    def _persisted_one(self, group: Group) -> None:
        unit = group.unit
        if unit is None:
            return
        unit.persisting -= 1
        if unit.persisting <= 0:
            self._leave(unit)

    # -- leases, cancellation, stop -----------------------------------------------------

    def on_leases_lost(self, keys: Iterable[str], now: float) -> None:
        """A renewal found these leases taken: callers are told now; a later result is salvaged."""
        for key in keys:
            group = self.groups.get(key)
            if group is None or group.lease_lost:
                continue
            group.lease_lost = True
            group.beating = False
            self.fx.count("lease_lost")
            error = LeaseLostError(f"lease on {key} was lost while the call waited or ran")
            if group.state in (GroupState.CLAIMED,) and group.unit is not None and not group.unit.slot:
                self._drop_from_unit(group)
                self._settle(group, error)
            else:
                self._answer_early(group, error)

    def cancel(self, call: Call, now: float) -> bool:
        """The caller gave up. Returns True when the call was removed (answered cancelled)."""
        group = self.groups.get(call.key)
        if group is None or call not in group.calls:
            return False
        if group.state in (GroupState.RUNNING, GroupState.PERSISTING) or (group.unit and group.unit.out):
            return False  # sent: persisted as usual; the caller still gets the answer if it asks
        group.calls.remove(call)
        self.fx.count("cancelled")
        self.fx.answer(call, CallCancelledError("the call was cancelled"))
        if group.calls:
            return True
        if group.state is GroupState.CLAIMED and group.unit is not None and not group.unit.slot:
            self._release_group(group, None)
        elif group.state is GroupState.WAITING:
            self._settle(group, None)
        return True

    def stop(self, now: float) -> int:
        """Refuse everything not yet sent (claims answered later are released); running
        calls go on and are persisted. Returns the number of calls refused."""
        self.stopping = True
        refused = 0
        for queue in (self.pending, self.pending_exempt):
            for unit in list(queue):
                refused += sum(len(g.calls) for g in unit.groups)
                self._give_back(unit, CallCancelledError("the dispatcher stopped before the call started"))
            queue.clear()
        waiting = [g for g in self.groups.values() if g.state is GroupState.WAITING]
        refused += sum(len(g.calls) for g in waiting)
        self._cancel(waiting)
        for unit in list(self.units.values()):
            if not unit.out and not unit.slot and unit.persisting == 0 and unit.groups:
                refused += sum(len(g.calls) for g in unit.groups)
                self._give_back(unit, CallCancelledError("the dispatcher stopped before the call started"))
        return refused

    @property
    def idle(self) -> bool:
        """Nothing running, persisting or held."""
        return not self.groups and not self.units

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
            if unit in queue:
                queue.remove(unit)
        for group in list(unit.groups):
            self._release_group(group, error)
        self._leave(unit)

    def _release_group(self, group: Group, error: BaseException | None, lease_lost: bool = False) -> None:
        lease = group.lease
        if lease is not None and self.tool.durable and not lease_lost and not group.lease_lost:
            self.fx.release_receipts([lease])
        self._drop_from_unit(group)
        if isinstance(error, AuthScopeChangedError):
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

    def _free_slot(self, unit: Unit) -> None:
        if unit.slot:
            unit.slot = False
            if not unit.exempt:
                self.holding -= 1
            self.fx.release_slots(1, exempt=unit.exempt)

    def _leave(self, unit: Unit) -> None:
        """A unit's exit action: its slot back, forgotten."""
        self._free_slot(unit)
        if unit.out:
            return  # its worker still runs: it leaves when the worker reports
        self.units.pop(unit.id, None)

    def _stop_waiting(self, group: Group) -> None:
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
        if isinstance(outcome, _Done):
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
        if not isinstance(outcome, _Done):
            return outcome
        execution = outcome.execution
        if execution == "live":
            if call.role is not Role.OWNER or not group.ran:
                execution = "in_flight"
        value = decode_output(outcome.value) if self.tool.durable else outcome.value
        return ToolResult.of(value, execution, group.key, self.tool.tool_id)  # type: ignore[arg-type]


_MISSING = object()


class _TooLarge(Exception):
    """An output over the store's cap: the caller got it, it is salvaged, and the receipt
    records failure kind ``output_too_large`` (not retried by a normal claim)."""

    def __init__(self, size_bytes: int) -> None:
        super().__init__(f"output of {size_bytes} bytes is over the store's cap")
        self.size_bytes = size_bytes


class _Done:
    """A successful outcome: the encoded output (durable) or the value, and how it came."""

    __slots__ = ("execution", "value")

    def __init__(self, value: Any, execution: str) -> None:
        self.value = value
        self.execution = execution
