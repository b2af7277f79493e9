"""How a tool queue actor performs its lifecycle's effects: every one a message or a task.

:class:`Ports` holds what every tool queue actor shares (actor refs, the worker pool,
the latch and gate snapshots, stats). :class:`ActorEffects` implements
:class:`~actors.lifecycle.Effects` for one actor: requests to the store, governor,
heartbeat and flusher carry a :class:`~actors._runtime.Reply` that comes back to the
actor as a fact message, which :meth:`ActorEffects.dispatch` hands to the lifecycle.
Slot releases are coalesced into one governor message per handled message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import attrs
import pykka

from stores.types import ClaimMode, ClaimRequest, Completion, Failure, LeaseRef, Owner

from ._calls import Call, Group
from ._execute import AttemptSpec, attempt
from ._runtime import Reply, Timers, WorkerPool, fail, log
from ._send_gate import SendGates
from .completion_flusher import Latch
from .messages import (
    AcquireSlots,
    BackpressureReported,
    CallCancelled,
    ChargeBudget,
    CompletionsPersisted,
    DeadlineDue,
    FailuresRecorded,
    FlushCompletions,
    LatchTripped,
    PollDue,
    ReceiptsChanged,
    ReceiptsClaimed,
    ReceiptsRead,
    ReceiptsReleased,
    Reconciled,
    RegisterLeases,
    ReleaseSlots,
    Resolved,
    RetryCharged,
    RetryDue,
    RunningMarked,
    StoreCall,
    TripLatch,
    UnitFinished,
    UnregisterLeases,
    WatchReceipts,
)
from .results import ToolContext, ToolResult, provider_idempotency_key
from .salvage import SalvageLog, salvage_entry
from .stats import Stats
from .tool import Policy, RunInfo, Tool

__all__ = ["ActorEffects", "Ports"]


@attrs.define(eq=False)
class Ports:
    """What the tool queue actors of one dispatch system share."""

    run: RunInfo
    owner: Owner
    policy: Policy
    store: Any
    """ReceiptStoreActor ref (takes StoreCall messages)."""
    governor: Any
    """GovernorActor ref."""
    heartbeat: Any
    """HeartbeatActor ref."""
    flusher: Any
    """CompletionFlusherActor ref."""
    latch: Latch
    """Read-only here: the flusher trips it (TripLatch)."""
    gates: SendGates
    """Read-only here: the governor keeps their pauses and closures."""
    stats: Stats
    pool: WorkerPool
    timers: Timers
    salvage: SalvageLog
    requeue: Callable[[Call, BaseException], None]
    width: Callable[[Tool], int]


@attrs.frozen(kw_only=True)
class _SlotsReply:
    """Governor fact for one of the two admission queues (normal, exempt)."""

    value: Any
    error: BaseException | None
    exempt: bool


class ActorEffects:
    """The lifecycle's effects for one tool queue actor (runs on that actor's thread)."""

    def __init__(self, actor: Any, tool: Tool, ports: Ports) -> None:
        self.actor = actor
        self.tool = tool
        self.ports = ports
        self.ref = actor.actor_ref
        self.org_id = ports.run.org_id
        self.lease_ttl_s = tool.lease_ttl_s or ports.policy.lease_ttl_s
        self._release: dict[bool, list[int]] = {False: [0, 0, 0, 0, 0], True: [0, 0, 0, 0, 0]}
        self._sent: dict[str, float] = {}
        self._settled_keys: set[str] = set()
        self._unbeat: list[str] = []
        self._tell = self.ref.tell

    # -- messages back in ---------------------------------------------------------------

    def dispatch(self, message: Any, now: float) -> None:
        """Hand a fact (an answer, a timer, a cancel) to the lifecycle, then ask for slots."""
        life = self.actor.lifecycle
        kind = type(message)
        if kind is UnitFinished and message.sent_at is not None:
            self.ports.stats.record("provider", (now - message.sent_at) * 1000.0, tool_id=self.tool.tool_id)
        phase = _TIMED.get(kind)
        if phase is not None:
            self._timed(phase, message.batch, now)
        if kind is CallCancelled:
            self.actor.cancel(message.call)
        else:
            handler = _HANDLERS.get(kind)
            if handler is not None:
                handler(life, message, now)
        life.pump(now)  # a slot freed or a unit queued by any of the above: ask for more
        for key in list(self._settled_keys):
            self.actor.drain_held(key, now)
        self._settled_keys.clear()

    def _timed(self, phase: str, batch: int, now: float) -> None:
        started = self._sent.pop(f"{phase}:{batch}", None)
        if started is not None:
            self.ports.stats.record(phase, (now - started) * 1000.0, tool_id=self.tool.tool_id)

    def flush(self, idle: bool = True) -> None:
        """Send the slot releases and heartbeat unregistrations gathered, one message each.

        Args:
            idle: no other message waits for this actor; while more are coming, they are
                gathered a little longer (up to ``_GATHER`` each) so one message carries many.
        """
        if self._unbeat and (idle or len(self._unbeat) >= _GATHER):
            keys, self._unbeat = tuple(self._unbeat), []
            self.ports.heartbeat.tell(UnregisterLeases(token=-1, keys=keys))
        if not idle and sum(self._release[False]) + sum(self._release[True]) < _GATHER:
            return
        for exempt, (count, successes, unavailable, answered, refunds) in self._release.items():
            if count or successes or unavailable or answered or refunds:
                self.ports.governor.tell(
                    ReleaseSlots(
                        org_id=self.org_id, provider=self.tool.provider_name, count=count,
                        successes=successes, unavailable=unavailable, answered=answered, exempt=exempt,
                        refunds=refunds,
                    )
                )  # fmt: skip
                self._release[exempt] = [0, 0, 0, 0, 0]

    # -- effects out --------------------------------------------------------------------

    def _store(self, method: str, reply: Any, *args: Any, **kwargs: Any) -> None:
        try:
            self.ports.store.tell(StoreCall(method=method, args=args, kwargs=kwargs, reply=reply))
        except pykka.ActorDeadError as exc:
            reply.set_exception((type(exc), exc, None))

    def claim(
        self, batch: int, mode: ClaimMode, stale_after_s: float | None, requests: list[ClaimRequest]
    ) -> None:
        self._sent[f"receipt_prepare:{batch}"] = time.monotonic()
        self._store(
            "claim_many", Reply(self.ref, ReceiptsClaimed, batch=batch), self.org_id, requests,
            self.ports.owner,
            lease_ttl_s=self.lease_ttl_s, mode=mode, stale_after_s=stale_after_s,
        )  # fmt: skip

    def read(self, batch: int, keys: list[str]) -> None:
        self._store("get_many", Reply(self.ref, ReceiptsRead, batch=batch), self.org_id, keys)

    def acquire(self, want: int, exempt: bool) -> None:
        reply = Reply(self.ref, _SlotsReply, exempt=exempt)
        try:
            self.ports.governor.tell(
                AcquireSlots(
                    org_id=self.org_id,
                    provider=self.tool.provider_name,
                    want=want,
                    reply=reply,
                    exempt=exempt,
                )
            )
        except pykka.ActorDeadError as exc:
            reply.set_exception((type(exc), exc, None))

    def release_slots(
        self, count: int, exempt: bool = False, successes: int = 0, unavailable: int = 0, answered: int = 0,
        refunds: int = 0,
    ) -> None:  # fmt: skip
        totals = self._release[exempt]
        totals[0] += count
        totals[1] += successes
        totals[2] += unavailable
        totals[3] += answered
        totals[4] += refunds

    def backpressure(self, retry_after: Any, sent_at: float | None) -> None:
        self.ports.governor.tell(
            BackpressureReported(
                org_id=self.org_id, provider=self.tool.provider_name, retry_after=retry_after, sent_at=sent_at
            )
        )

    def mark_running(self, batch: int, leases: list[LeaseRef]) -> None:
        self._store(
            "mark_running_many", Reply(self.ref, RunningMarked, batch=batch), self.org_id, leases,
            self.ports.owner, lease_ttl_s=self.lease_ttl_s,
        )  # fmt: skip

    def start(self, spec: AttemptSpec) -> None:
        tell = self._tell
        try:
            self.ports.pool.submit(lambda: attempt(spec, tell))
        except RuntimeError as exc:  # the pool is shut down: the system stopped
            tell(UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=exc))

    def persist(self, batch: int, entries: list[Completion], input_hashes: dict[str, str]) -> None:
        self._sent[f"receipt_complete:{batch}"] = time.monotonic()
        reply = Reply(self.ref, CompletionsPersisted, batch=batch)
        try:
            self.ports.flusher.tell(
                FlushCompletions(
                    org_id=self.org_id, owner=self.ports.owner, entries=tuple(entries),
                    tool_id=self.tool.tool_id, input_hashes=input_hashes, reply=reply,
                )
            )  # fmt: skip
        except pykka.ActorDeadError as exc:
            reply.set_exception((type(exc), exc, None))

    def record_failures(self, batch: int, failures: list[Failure], uncertain: bool = False) -> None:
        method = "mark_uncertain_many" if uncertain else "fail_many"
        reply = Reply(self.ref, FailuresRecorded, batch=batch)
        self._store(method, reply, self.org_id, failures, self.ports.owner)

    def reconcile(self, batch: int, group: Group) -> None:
        hook = self.tool.reconcile
        assert hook is not None
        receipt = group.receipt
        context = ToolContext(
            tool_id=self.tool.tool_id,
            idempotency_key=provider_idempotency_key(group.key, receipt.generation if receipt else None),
            receipt_keys=(group.key,), credential_scope_digest=group.credential_digest,
            deadline=time.monotonic() + group.timeout_s, timeout_s=group.timeout_s,
        )  # fmt: skip
        reply = Reply(self.ref, Reconciled, batch=batch)
        inp = group.input

        def ask() -> None:
            try:
                reply.set(hook(inp, context))
            except Exception as exc:
                reply.set_exception((type(exc), exc, exc.__traceback__))

        try:
            self.ports.pool.submit(ask)
        except RuntimeError as exc:
            reply.set_exception((type(exc), exc, None))

    def resolve(self, batch: int, key: str, action: str, output: Any = None) -> None:
        from stores.types import ResolveAction

        reply = Reply(self.ref, Resolved, batch=batch)
        self._store(
            "resolve", reply, self.org_id, key, ResolveAction(action), output=output,
            note="reconciled with the provider",
        )  # fmt: skip

    def release_receipts(self, batch: int, leases: list[LeaseRef]) -> None:
        # best effort: a lease the store cannot release now simply expires
        reply = Reply(self.ref, ReceiptsReleased, batch=batch)
        self._store("release", reply, self.org_id, leases, self.ports.owner)

    def beat(self, batch: int, leases: list[LeaseRef]) -> None:
        if not self.ports.policy.heartbeats or not leases:
            return
        ref = self.ref
        self.ports.heartbeat.tell(
            RegisterLeases(
                token=_token(self.tool.tool_id, batch), org_id=self.org_id, owner=self.ports.owner,
                leases=tuple(leases), lease_ttl_s=self.lease_ttl_s, deadline=float("inf"),
                on_lost=lambda keys: _tell_quietly(ref, _LeasesLostFact(keys=tuple(keys))),
            )
        )  # fmt: skip

    def unbeat(self, keys: list[str]) -> None:
        if self.ports.policy.heartbeats:
            self._unbeat.extend(keys)
        self._settled_keys.update(keys)

    def charge_retry(self, unit: int) -> None:
        self.ports.governor.tell(
            ChargeBudget(kind="retries", amount=1, reply=Reply(self.ref, RetryCharged, unit=unit))
        )

    def later(self, delay_s: float, message: Any) -> None:
        ref = self.ref
        self.ports.timers.call_later(delay_s, lambda: ref.tell(message))

    def watch(self, keys: list[str], watch: bool = True) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # stopped: the timers still poll
            self.ports.store.tell(
                WatchReceipts(org_id=self.org_id, keys=tuple(keys), ref=self.ref, watch=watch)
            )

    def unwatch(self, keys: list[str]) -> None:
        self.watch(keys, watch=False)

    def blocked_until(self, now: float) -> tuple[float, bool] | None:
        gate = self.ports.gates.get(self.org_id, self.tool.provider_name)
        return gate.blocked(now)

    def latch_reason(self) -> str | None:
        latch = self.ports.latch
        return latch.reason or "tripped" if latch.tripped else None

    def trip_latch(self, reason: str, batch: int) -> None:
        reply = Reply(self.ref, LatchTripped, batch=batch)
        try:
            self.ports.flusher.tell(TripLatch(reason=reason, reply=reply))
        except pykka.ActorDeadError as exc:
            reply.set_exception((type(exc), exc, None))

    def answer(self, call: Call, outcome: Any) -> None:
        future = call.future
        if isinstance(outcome, ToolResult):
            with contextlib.suppress(Exception):
                future.set(outcome)
            if outcome.execution != "live":
                self.ports.stats.add(outcome.execution, tool=self.tool.tool_id)
            return
        fail(future, outcome)
        self.ports.stats.add("errors", tool=self.tool.tool_id)

    def requeue(self, call: Call, error: BaseException) -> None:
        self.ports.requeue(call, error)

    def salvage(self, group: Group, output: Any, error: str) -> None:
        try:
            self._salvage(group, output, error)
        except Exception:  # an output whose very description fails: keep what can be kept
            log.exception("salvaging %s", group.key)
            stand_in = {"type": type(output).__qualname__, "reason": error, "repr": "<unrepresentable>"}
            self._salvage(group, stand_in, error, described=True)

    def _salvage(self, group: Group, output: Any, error: str, described: bool = False) -> None:
        entry = salvage_entry(
            key=group.key, org_id=self.org_id, scope=self.ports.run.scope, tool_id=self.tool.tool_id,
            input_hash=group.input_hash, output=output, attempts=1, first_error_at=None, error=error,
            lease_id=group.receipt.lease_id if group.receipt else None,
        )  # fmt: skip
        if described:  # a stand-in: kept for an operator, never replayed into the store
            entry = attrs.evolve(entry, output_form="described", output_problem=error)
        self.ports.salvage.append([entry])

    def count(self, name: str, n: int = 1) -> None:
        if n:  # n < 0 for gauges (waiting_on_owner)
            self.ports.stats.add(name, n, tool=self.tool.tool_id)

    def salvage_path(self) -> str:
        return str(self.ports.salvage.path)

    def remember(self, key: str, text: str, cached: bool) -> None:
        self.actor.queue.memo.remember(key, text, -float("inf") if cached else time.monotonic())


_HANDLERS: dict[type, Callable[[Any, Any, float], None]] = {
    UnitFinished: lambda life, m, now: life.on_finished(m, now),
    ReceiptsClaimed: lambda life, m, now: life.on_claimed(m.batch, m.value, m.error, now),
    CompletionsPersisted: lambda life, m, now: life.on_persisted(m.batch, m.value, m.error, now),
    RunningMarked: lambda life, m, now: life.on_marked(m.batch, m.value, m.error, now),
    FailuresRecorded: lambda life, m, now: life.on_failures_recorded(m.batch, m.value, m.error, now),
    LatchTripped: lambda life, m, now: life.on_latch_tripped(m.batch, now),
    ReceiptsReleased: lambda life, m, now: life.on_released(m.batch, now),
    Reconciled: lambda life, m, now: life.on_reconciled(m.batch, m.value, m.error, now),
    Resolved: lambda life, m, now: life.on_resolved(m.batch, m.error, now),
    ReceiptsRead: lambda life, m, now: life.on_read(m.batch, m.value, m.error, now),
    PollDue: lambda life, m, now: life.on_poll(m.keys, now),
    DeadlineDue: lambda life, m, now: life.on_deadline(m.unit, now),
    RetryCharged: lambda life, m, now: life.on_retry_charged(m.unit, m.error, now),
    RetryDue: lambda life, m, now: life.on_retry_due(m.unit, now),
}
"""Fact message type -> the lifecycle transition it drives."""

_TIMED = {ReceiptsClaimed: "receipt_prepare", CompletionsPersisted: "receipt_complete"}
"""Fact message type -> the phase whose time (since the request) it ends."""

_GATHER = 64
"""Most slot releases (or unregistrations) held back while more messages wait."""


@attrs.frozen(kw_only=True)
class _LeasesLostFact:
    keys: tuple[str, ...]


def _token(tool_id: str, batch: int) -> int:
    return hash((tool_id, batch)) & 0x7FFFFFFFFFFF


def _tell_quietly(ref: Any, message: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


_HANDLERS[_SlotsReply] = lambda life, m, now: life.on_granted(m.value, m.error, now, exempt=m.exempt)
_HANDLERS[_LeasesLostFact] = lambda life, m, now: life.on_leases_lost(m.keys, now)
_HANDLERS[ReceiptsChanged] = lambda life, m, now: life.on_changed(m.keys, now)
