"""How a tool queue actor performs its lifecycle's effects: every one a message or a task.

:class:`ActorEffects` implements :class:`~actors.lifecycle.machine.Effects` for one actor,
through the :class:`~actors.queue.system_ports.Ports` every tool queue actor of a system
shares: requests to the store, governor, heartbeat and flusher carry a
:class:`~actors.runtime.actor.Reply` that comes back to the actor as a fact message, which
:meth:`ActorEffects.dispatch` hands to the lifecycle. Slot releases are coalesced into
one governor message per handled message. The effects that stay in the process
(attempts, callers, salvage, memo) are those of the
:class:`~actors.queue.local_effects.LocalEffects` it holds.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs
import pykka

from actors.heartbeat.deferred_beats import DeferredBeats
from actors.lifecycle.machine import EVENTS
from actors.lifecycle.spending import ZERO, exact_sum
from actors.messages import (
    AcquireSlots,
    BackpressureReported,
    CallCancelled,
    ChargeBudget,
    ClaimReceipts,
    CompleteReceipts,
    CompletionsPersisted,
    CompletionsWritten,
    FailuresRecorded,
    FlushCompletions,
    LatchTripped,
    LeasesLost,
    MarkRunning,
    ReadReceipts,
    ReceiptsClaimed,
    ReceiptsRead,
    ReceiptsReleased,
    RecordFailures,
    RecordUncertain,
    RefundBudget,
    RegisterLeases,
    ReleaseReceipts,
    ReleaseSlots,
    Resolved,
    ResolveReceipt,
    RetryCharged,
    RunningMarked,
    SlotsGranted,
    TripLatch,
    UnitFinished,
    UnregisterLeases,
    WatchReceipts,
)
from actors.pacing.bucket import plain_retry_after
from actors.queue.completion_write import CompletionWriter
from actors.queue.local_effects import FINISHED_READY, Finished, LocalEffects
from actors.queue.system_ports import Ports
from actors.runtime.actor import Reply, log
from actors.runtime.flavor import runtime_name
from actors.tool import Tool
from stores.types import BatchRecord, ClaimMode, ClaimRequest, Completion, Failure, LeaseRef

__all__ = ["ActorEffects"]


class ActorEffects:
    """The lifecycle's effects for one tool queue actor (runs on that actor's thread).

    The effects that stay in the process (``start``, ``keep_late``, ``reconcile``,
    ``answer``, ``requeue``, ``salvage``, ``count``, ``spend``, ``save``, ``waste``, ``waited``,
    ``salvage_path``, ``remember``, ``forget``, ``owe``, ``owed``) are the bound methods of
    its :attr:`local`, taken once here: a call to one costs no extra layer.
    """

    def __init__(self, actor: Any, tool: Tool, ports: Ports) -> None:
        self.actor = actor
        self.tool = tool
        self.ports = ports
        self.ref = actor.actor_ref
        self.org_id = ports.run.org_id
        self.lease_ttl_s = tool.lease_ttl_s or ports.policy.lease_ttl_s
        self._release: dict[bool, list[int]] = {False: [0, 0, 0, 0, 0], True: [0, 0, 0, 0, 0]}
        self._sent_at: dict[bool, list[float]] = {False: [], True: []}
        """Send times of the successes in ``_release``."""
        self._unspent: dict[bool, Decimal] = {False: ZERO, True: ZERO}
        """Money charged and not spent, given back with ``_release``."""
        self._units: dict[bool, tuple[dict[str, float], list[Any], list[Any]]] = {
            False: ({}, [], []), True: ({}, [], [])
        }  # fmt: skip
        """Units to give back, usage corrections and announcements, sent with ``_release``."""
        self._heard_limits = False
        """Whether an announcement went to the governor yet: the first goes at once (the
        provider's announced rate applies from its first answer on); later ones ride with
        the releases gathered (a change is heard within ``_GATHER`` answers)."""
        self._sent: dict[str, float] = {}
        self._settled_keys: set[str] = set()
        self._unbeat: list[str] = []
        self._tell = self.ref.tell
        self.finished = Finished()
        local = self.local = LocalEffects(actor, tool, ports, self.finished)
        """The effects that stay in the process."""
        self.start = local.start
        self.keep_late = local.keep_late
        self.reconcile = local.reconcile
        self.answer = local.answer
        self.requeue = local.requeue
        self.salvage = local.salvage
        self.count = local.count
        self.spend = local.spend
        self.save = local.save
        self.waste = local.waste
        self.waited = local.waited
        self.salvage_path = local.salvage_path
        self.remember = local.remember
        self.forget = local.forget
        self.owe = local.owe
        self.owed = local.owed
        self.writer = CompletionWriter(ports, tool.tool_id, self.org_id)
        self.beats = DeferredBeats(
            ports.policy.heartbeat_for(self.lease_ttl_s), defer=runtime_name() != "gevent"
        )
        self._beat_ids = itertools.count(1)

    # -- messages back in ---------------------------------------------------------------

    def dispatch(self, message: Any, now: float) -> None:
        """Hand a fact (an answer, a timer, a cancel) to the lifecycle, then ask for slots."""
        if message is FINISHED_READY:  # the doorbell: every outcome reported since
            for finished, _ in self.finished.take():
                try:
                    self.dispatch(finished, now)
                except Exception:  # as a message of its own would be (``guarded``): the
                    log.exception("handling an outcome of %s failed", self.tool.tool_id)  # rest go on
            return
        life = self.actor.lifecycle
        kind = type(message)
        if kind is CompletionsWritten:
            message = self._written(message)
            if message is None:
                return  # the write failed: it goes on in the flusher
            kind = CompletionsPersisted
        elif kind is _BeatDue:
            self._register()
            return
        if kind is UnitFinished and message.sent_at is not None:  # a local tool's run is no request
            ran = "provider" if self.tool.durable else "local_run"
            self.ports.stats.record(ran, (now - message.sent_at) * 1000.0, tool_id=self.tool.tool_id)
        phase = _TIMED.get(kind)
        if phase is not None:
            self._timed(phase, message.batch, now)
        if kind is CallCancelled:  # a call still in the queue is the actor's to take out
            self.actor.cancel(message.call)
        elif kind in EVENTS:
            life.handle(message, now)
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
        first_heard = not self._heard_limits and bool(self._units[False][2] or self._units[True][2])
        if not idle and not first_heard and sum(self._release[False]) + sum(self._release[True]) < _GATHER:
            return
        self._heard_limits = self._heard_limits or first_heard
        for exempt, (count, successes, unavailable, answered, refunds) in self._release.items():
            unspent = self._unspent[exempt]
            unsent, usage, announced = self._units[exempt]
            if (
                count
                or successes
                or unavailable
                or answered
                or refunds
                or unspent
                or unsent
                or usage
                or announced
            ):
                self.ports.governor.tell(
                    ReleaseSlots(
                        org_id=self.org_id, provider=self.tool.provider_name, count=count,
                        successes=successes, unavailable=unavailable, answered=answered, exempt=exempt,
                        refunds=refunds, sent_at=tuple(self._sent_at[exempt]), unspent=unspent,
                        unsent_units=unsent, usage=tuple(usage), announced=tuple(announced),
                    )
                )  # fmt: skip
                self._release[exempt] = [0, 0, 0, 0, 0]
                self._sent_at[exempt] = []
                self._unspent[exempt] = ZERO
                self._units[exempt] = ({}, [], [])

    # -- effects out --------------------------------------------------------------------

    def _store(self, message: Any) -> None:
        """Send a store command; its ``reply`` answers this actor with a fact message."""
        _ask(self.ports.store, message, message.reply)

    def claim(
        self, batch: int, mode: ClaimMode, stale_after_s: float | None, requests: list[ClaimRequest],
        running: frozenset[str] = frozenset(), patience_s: float = 0.0,
    ) -> None:  # fmt: skip
        self._sent[f"receipt_prepare:{batch}"] = now = time.monotonic()
        self._store(
            ClaimReceipts(
                org_id=self.org_id, requests=requests, owner=self.ports.owner, lease_ttl_s=self.lease_ttl_s,
                mode=mode, stale_after_s=stale_after_s, running=running,
                reply=Reply(self.ref, ReceiptsClaimed, batch=batch), retry_until=_until(patience_s, now),
            )
        )  # fmt: skip

    def read(self, batch: int, keys: list[str], patience_s: float = 0.0) -> None:
        self._store(
            ReadReceipts(
                org_id=self.org_id, keys=keys, reply=Reply(self.ref, ReceiptsRead, batch=batch),
                retry_until=_until(patience_s),
            )
        )  # fmt: skip

    def acquire(
        self, want: int, exempt: bool, immediate: bool = False, prices: tuple[Decimal, ...] = (),
        units: tuple[Mapping[str, float], ...] = (), patience_s: float | None = None,
    ) -> None:  # fmt: skip
        reply = Reply(self.ref, SlotsGranted, exempt=exempt)
        message = AcquireSlots(
            org_id=self.org_id, provider=self.tool.provider_name, want=want, reply=reply, exempt=exempt,
            immediate=immediate, prices=prices, units=units, patience_s=patience_s,
        )  # fmt: skip
        _ask(self.ports.governor, message, reply)

    def release_slots(
        self, count: int, exempt: bool = False, successes: int = 0, unavailable: int = 0, answered: int = 0,
        refunds: int = 0, sent_at: float | None = None, unspent: Decimal = ZERO,
        unsent_units: Mapping[str, float] | None = None,
        usage: tuple[float, Mapping[str, float]] | None = None,
        announced: tuple[float, tuple[Any, ...]] | None = None,
    ) -> None:  # fmt: skip
        if unsent_units or usage or announced:
            back, corrections, announcements = self._units[exempt]
            for unit, amount in (unsent_units or {}).items():
                back[unit] = back.get(unit, 0.0) + amount
            if usage is not None:
                corrections.append(usage)
            if announced is not None:
                announcements.append(announced)
        if unspent:
            self._unspent[exempt] = exact_sum((self._unspent[exempt], unspent))
        if sent_at is not None and successes:
            self._sent_at[exempt].extend([sent_at] * successes)
        totals = self._release[exempt]
        totals[0] += count
        totals[1] += successes
        totals[2] += unavailable
        totals[3] += answered
        totals[4] += refunds

    def backpressure(self, retry_after: Any, sent_at: float | None) -> None:
        telemetry = getattr(self.ports, "telemetry", None)
        if telemetry is not None:
            telemetry.backpressure(self.tool.tool_id, self.tool.provider_name)
        self.ports.governor.tell(
            BackpressureReported(
                org_id=self.org_id,
                provider=self.tool.provider_name,
                retry_after=plain_retry_after(retry_after),
                sent_at=sent_at,
            )
        )

    def mark_running(
        self,
        batch: int,
        leases: list[LeaseRef],
        patience_s: float = 0.0,
        records: tuple[BatchRecord, ...] = (),
    ) -> None:
        self._store(
            MarkRunning(
                org_id=self.org_id,
                leases=leases,
                owner=self.ports.owner,
                lease_ttl_s=self.lease_ttl_s,
                batches=records,
                reply=Reply(self.ref, RunningMarked, batch=batch),
                retry_until=_until(patience_s),
            )
        )

    def persist(self, batch: int, entries: list[Completion], input_hashes: dict[str, str]) -> None:
        self._sent[f"receipt_complete:{batch}"] = time.monotonic()
        if self.writer.takes(entries):  # the happy path: straight to the store
            reply = Reply(self.ref, CompletionsWritten, batch=batch)
            write = CompleteReceipts(
                org_id=self.org_id, completions=entries, owner=self.ports.owner, reply=reply
            )
            self.writer.write(batch, entries, input_hashes, lambda: self._store(write))
            return
        self._flush_completions(batch, entries, input_hashes)

    def _flush_completions(
        self, batch: int, entries: list[Completion], input_hashes: dict[str, str], failed: str = ""
    ) -> None:
        reply = Reply(self.ref, CompletionsPersisted, batch=batch)
        message = FlushCompletions(
            org_id=self.org_id, owner=self.ports.owner, entries=tuple(entries),
            tool_id=self.tool.tool_id, input_hashes=input_hashes, reply=reply, failed=failed,
        )  # fmt: skip
        _ask(self.ports.flusher, message, reply)

    def _written(self, message: CompletionsWritten) -> CompletionsPersisted | None:
        persisted, failed = self.writer.answered(message)
        if failed is not None:
            entries, input_hashes, error = failed
            self._flush_completions(message.batch, entries, input_hashes, failed=error)
        return persisted

    def record_failures(
        self, batch: int, failures: list[Failure], uncertain: bool = False, patience_s: float = 0.0
    ) -> None:
        record = RecordUncertain if uncertain else RecordFailures
        reply = Reply(self.ref, FailuresRecorded, batch=batch)
        self._store(
            record(
                org_id=self.org_id, failures=failures, owner=self.ports.owner, reply=reply,
                retry_until=_until(patience_s),
            )
        )  # fmt: skip

    def resolve(self, batch: int, key: str, action: str, output: Any = None) -> None:
        from stores.types import ResolveAction

        reply = Reply(self.ref, Resolved, batch=batch)
        self._store(
            ResolveReceipt(
                org_id=self.org_id,
                key=key,
                action=ResolveAction(action),
                output=output,
                note="reconciled with the provider",
                reply=reply,
            )
        )

    def release_receipts(self, batch: int, leases: list[LeaseRef], patience_s: float = 0.0) -> None:
        # best effort: a lease the store cannot release now simply expires
        reply = Reply(self.ref, ReceiptsReleased, batch=batch)
        self._store(
            ReleaseReceipts(
                org_id=self.org_id, leases=leases, owner=self.ports.owner, reply=reply,
                retry_until=_until(patience_s),
            )
        )  # fmt: skip

    def beat(self, batch: int, leases: list[LeaseRef]) -> None:
        if not self.ports.policy.heartbeats or not leases:
            return
        armed = self.beats.add(leases)  # registered with the heartbeat once held a while
        if not self.beats.delay_s:
            self._register()  # gevent: at once (see actors.heartbeat.deferred_beats)
        elif armed:
            self.later(self.beats.delay_s, _BeatDue())

    def _register(self) -> None:
        leases = self.beats.due()
        if not leases:
            return
        ref = self.ref
        self.ports.heartbeat.tell(
            RegisterLeases(
                token=_token(self.tool.tool_id, -next(self._beat_ids)), org_id=self.org_id,
                owner=self.ports.owner, leases=tuple(leases), lease_ttl_s=self.lease_ttl_s,
                deadline=float("inf"),
                on_lost=lambda keys: _tell_quietly(ref, LeasesLost(keys=tuple(keys))),
            )
        )  # fmt: skip

    def unbeat(self, keys: list[str]) -> None:
        if self.ports.policy.heartbeats:
            self._unbeat.extend(self.beats.drop(keys))

    def settled(self, key: str) -> None:
        """``key``'s group left: calls held behind it (a forced refresh) go at the end of
        this message."""
        self._settled_keys.add(key)

    def charge_retry(self, unit: int) -> None:
        self.ports.governor.tell(
            ChargeBudget(kind="retries", amount=1, reply=Reply(self.ref, RetryCharged, unit=unit))
        )

    def refund_retry(self) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # stopped: no budget to give back to
            self.ports.governor.tell(RefundBudget(kind="retries", amount=1))

    def later(self, delay_s: float, message: Any) -> None:
        self.ports.timers.call_later(delay_s, self._tell, message)

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
        _ask(self.ports.flusher, TripLatch(reason=reason, reply=reply), reply)

    def withdraw(self, ticket: Any, kind: Any, error: BaseException) -> bool:
        return self.ports.launch.withdraw(ticket, kind, error)


_TIMED = {ReceiptsClaimed: "receipt_prepare", CompletionsPersisted: "receipt_complete"}
"""Fact message type -> the phase whose time (since the request) it ends."""

_GATHER = 64
"""Most slot releases (or unregistrations) held back while more messages wait."""


@attrs.frozen(kw_only=True)
class _BeatDue:
    """Timer: register the leases held back (:mod:`actors.heartbeat.deferred_beats`)."""


def _until(patience_s: float, now: float | None = None) -> float:
    """A store request's ``retry_until`` for ``patience_s`` seconds from ``now`` (0: none)."""
    if patience_s <= 0:
        return 0.0
    return (time.monotonic() if now is None else now) + patience_s


def _token(tool_id: str, batch: int) -> int:
    return hash((tool_id, batch)) & 0x7FFFFFFFFFFF


def _ask(ref: Any, message: Any, reply: Any) -> None:
    """Send a request whose answer comes back through ``reply``; a dead actor answers it at once."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError as exc:
        reply.set_exception((type(exc), exc, None))


def _tell_quietly(ref: Any, message: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)
