"""The lifecycle tests' harness: :class:`Driver` runs one :class:`actors.lifecycle.machine.Lifecycle`
with a fake clock and a recording ``Effects`` (:class:`FakeEffects`), no threads, no sleeps.

A test drives groups to one exit (claim error, mark_running error, failure-record
error, lease lost, cancel, stop, deadline, 429, retry budget refused, ...) by handing
the lifecycle the answers its effects asked for (``Lifecycle.handle``), as the tool
queue actor would (``pump`` and ``flush`` after every message, like
``ActorEffects.dispatch``). Then :meth:`Driver.assert_nothing_held` checks the exit
actions (STYLE.md, the life of a call): as many slots released as granted, every retry
budget charge spent on a retry sent or given back, every lease registered with the
heartbeat unregistered (or dropped by the heartbeat as lost), every claimed lease
completed, failed, released or lost, every call answered exactly once, and
``lifecycle.idle``.
"""

from __future__ import annotations

import collections
import itertools
from decimal import Decimal
from typing import Any

from actors.errors import CallCancelledError
from actors.flusher.actor import FlushOutcome, Latch
from actors.lifecycle.attempts import AttemptSpec, PlainValue
from actors.lifecycle.calls import Call, Group
from actors.lifecycle.machine import Lifecycle
from actors.messages import (
    CompletionsPersisted,
    FailuresRecorded,
    LatchTripped,
    LeasesLost,
    ReceiptsClaimed,
    ReceiptsRead,
    ReceiptsReleased,
    RetryCharged,
    RunningMarked,
    SlotsGranted,
    UnitFinished,
)
from actors.results import ToolResult
from actors.runtime.futures import new_future
from actors.tool import BatchStrategy, Policy, Tool
from actors.worker.launch import Launch
from stores.codec import encode_output
from stores.types import (
    Claim,
    ClaimDisposition,
    ClaimMode,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    RefusalReason,
)

ORG, SCOPE = "acme", "enrich"
TIMEOUT_S = 5.0


def noop(value: Any, ctx: Any) -> Any:
    return value


TOOL = Tool(tool_id="lookup", fn=noop)
SAFE = Tool(tool_id="safe", fn=noop, retry_safe=True)
BATCHED = Tool(tool_id="verify", fn=noop, batch=BatchStrategy(batch_fn=noop, max_batch_size=5))
LOCAL = Tool(tool_id="local", fn=noop, durable=False)


class FakeEffects:
    """Records every effect the lifecycle asks for; answers nothing by itself."""

    def __init__(self) -> None:
        self.claims: dict[int, tuple[ClaimMode, list[Any]]] = {}
        self.reads: dict[int, list[str]] = {}
        self.acquires: list[tuple[int, bool]] = []
        self.slots_released = {False: 0, True: 0}
        self.reports: list[dict[str, int]] = []
        self.backpressures: list[Any] = []
        self.marks: dict[int, list[LeaseRef]] = {}
        self.records: dict[int, tuple[Any, ...]] = {}
        """Mark batch -> the batch requests it records (``stores.BatchRecord``)."""
        self.starts: list[AttemptSpec] = []
        self.persists: dict[int, list[Any]] = {}
        self.failures: dict[int, list[Any]] = {}
        self.released: list[LeaseRef] = []
        self.registered: collections.Counter[str] = collections.Counter()
        self.unregistered: collections.Counter[str] = collections.Counter()
        self.settled_keys: list[str] = []
        self.retry_charges: list[int] = []
        self.retry_refunds = 0
        self.timers: list[tuple[float, Any]] = []
        self.watched: set[str] = set()
        self.blocked: tuple[float, bool] | None = None
        self.latch: str | None = None
        self.tripped: list[str] = []
        self.answers: dict[int, list[Any]] = collections.defaultdict(list)
        self.requeued: list[Call] = []
        self.salvaged: list[tuple[str, str]] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.spent: list[Any] = []
        self.saved: list[Any] = []
        self.wasted: list[Any] = []
        self.waits: dict[str, float] = {}
        self.memo: dict[str, tuple[str, bool]] = {}
        self.owes: set[str] = set()
        self.release_batches: list[int] = []
        self.refunds = 0
        self.unspent = Decimal(0)
        self.prices: list[tuple[Decimal, ...]] = []
        self.running: dict[int, frozenset[str]] = {}
        """Claim batch -> keys to claim straight into running."""
        self.immediate: list[tuple[int, bool]] = []
        """Slots asked for before a claim (answered at once by the governor)."""
        self.trip_batches: list[int] = []
        self.uncertain: set[str] = set()
        self.reconciles: list[tuple[int, str]] = []
        self.resolves: list[tuple[int, str, str]] = []
        self.write_latch = Latch()
        """The latch the launch checks (the flusher's, in a system)."""
        self.launch = Launch(self.write_latch)
        self.hold_sends = False
        """Attempts wait before their send (a gate, a batch's build): withdrawable."""
        self.withdrawn: list[tuple[str, BaseException]] = []
        self.patience: dict[int, float] = {}
        """Store request batch -> how long it rides out an outage of the store (seconds)."""

    def claim(
        self, batch: int, mode: ClaimMode, stale_after_s: float | None, requests: list[Any],
        running: frozenset[str] = frozenset(), patience_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.claims[batch] = (mode, requests)
        self.running[batch] = running
        self.patience[batch] = patience_s

    def read(self, batch: int, keys: list[str], patience_s: float = 0.0) -> None:
        self.reads[batch] = keys
        self.patience[batch] = patience_s

    def acquire(
        self, want: int, exempt: bool, immediate: bool = False, prices: tuple[Decimal, ...] = (),
        units: tuple[Any, ...] = (), patience_s: float | None = None,
    ) -> None:  # fmt: skip
        (self.immediate if immediate else self.acquires).append((want, exempt))
        if not immediate:
            self.prices.append(prices)

    def release_slots(
        self, count: int, exempt: bool = False, successes: int = 0, unavailable: int = 0, answered: int = 0,
        refunds: int = 0, sent_at: float | None = None, unspent: Decimal = Decimal(0),
        unsent_units: Any = None, usage: Any = None, announced: Any = None,
    ) -> None:  # fmt: skip
        self.slots_released[exempt] += count
        self.refunds += refunds
        self.unspent += unspent
        self.reports.append({"successes": successes, "unavailable": unavailable, "answered": answered})

    def backpressure(self, retry_after: Any, sent_at: float | None) -> None:
        self.backpressures.append(retry_after)

    def mark_running(
        self, batch: int, leases: list[LeaseRef], patience_s: float = 0.0, records: tuple[Any, ...] = ()
    ) -> None:
        self.marks[batch] = leases
        self.patience[batch] = patience_s
        self.records[batch] = records

    def start(self, spec: AttemptSpec) -> None:
        self.starts.append(spec)
        if not self.hold_sends:  # its worker sends at once (takes its ticket)
            assert self.launch.take(spec.ticket) is None

    def persist(self, batch: int, entries: list[Any], input_hashes: dict[str, str]) -> None:
        self.persists[batch] = entries

    def record_failures(
        self, batch: int, failures: list[Any], uncertain: bool = False, patience_s: float = 0.0
    ) -> None:
        self.failures[batch] = failures
        self.patience[batch] = patience_s
        if uncertain:
            self.uncertain.update(f.key for f in failures)

    def release_receipts(self, batch: int, leases: list[LeaseRef], patience_s: float = 0.0) -> None:
        self.released.extend(leases)
        self.release_batches.append(batch)
        self.patience[batch] = patience_s

    def reconcile(self, batch: int, group: Group) -> None:
        self.reconciles.append((batch, group.key))

    def resolve(self, batch: int, key: str, action: str, output: Any = None) -> None:
        self.resolves.append((batch, key, action))

    def beat(self, batch: int, leases: list[LeaseRef]) -> None:
        self.registered.update(lease.key for lease in leases)

    def unbeat(self, keys: list[str]) -> None:
        self.unregistered.update(keys)

    def settled(self, key: str) -> None:
        self.settled_keys.append(key)

    def charge_retry(self, unit: int) -> None:
        self.retry_charges.append(unit)

    def refund_retry(self) -> None:
        self.retry_refunds += 1

    def later(self, delay_s: float, message: Any) -> None:
        self.timers.append((delay_s, message))

    def watch(self, keys: list[str]) -> None:
        self.watched.update(keys)

    def unwatch(self, keys: list[str]) -> None:
        self.watched.difference_update(keys)

    def blocked_until(self, now: float) -> tuple[float, bool] | None:
        return self.blocked

    def latch_reason(self) -> str | None:
        return self.latch

    def trip_latch(self, reason: str, batch: int) -> None:
        self.tripped.append(reason)
        self.trip_batches.append(batch)

    def withdraw(self, ticket: Any, kind: Any, error: BaseException) -> bool:
        done = self.launch.withdraw(ticket, kind, error)
        if done:
            self.withdrawn.append((kind, error))
        return done

    def answer(self, call: Call, outcome: Any) -> None:
        self.answers[id(call)].append(outcome)

    def requeue(self, call: Call, error: BaseException) -> None:
        self.requeued.append(call)

    def salvage(self, group: Group, output: Any, error: str) -> None:
        self.salvaged.append((group.key, error))

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def spend(self, costs: Any) -> None:
        self.spent.extend(costs)

    def save(self, cost: Any) -> None:
        self.saved.append(cost)

    def waited(self, reason: str, seconds: float) -> None:
        self.waits[reason] = self.waits.get(reason, 0.0) + seconds

    def waste(self, costs: Any, reason: str) -> None:
        self.wasted.extend((cost, reason) for cost in costs)

    def remember(self, key: str, text: str, cached: bool, cost: Any = None) -> None:
        self.memo[key] = (text, cached)

    def forget(self, key: str) -> None:
        self.memo.pop(key, None)
        self.owes.discard(key)

    def owe(self, key: str) -> None:
        self.owes.add(key)

    def owed(self, key: str) -> bool:
        taken = key in self.owes
        self.owes.discard(key)
        return taken

    def salvage_path(self) -> str:
        return "/tmp/salvage.jsonl"


class Driver:
    """A lifecycle, its fake effects and a fake clock, answered like the real actors would."""

    def __init__(
        self, tool: Tool = TOOL, policy: Policy | None = None, width: int = 4, owner: Owner | None = None,
        straight: bool = False,
    ) -> None:  # fmt: skip
        self.straight = straight
        """Slots asked for before a claim are left for the test to answer (``grant_now``);
        else the governor says at once "ask the usual way" (-1)."""
        self.tool = tool
        self.now = 100.0
        self.fx = FakeEffects()
        self.policy = policy or Policy(timeout_s=TIMEOUT_S, retry_backoff_s=0.5)
        self.life = Lifecycle(tool, self.policy, ORG, SCOPE, self.fx, width, owner)  # type: ignore[arg-type]
        self.life.state.clock = lambda: self.now  # waits begin on the fake clock
        self.release_errors: list[BaseException] = []
        """Errors the store answers the next releases with (then they succeed)."""
        self.calls: list[Call] = []
        self.granted = {False: 0, True: 0}
        self.grants_answered = 0
        self.retries_charged = 0
        self.unsent_retries = 0
        """Retry budget charges the governor took (each buys one attempt sent, or comes back)."""
        self.lost: set[str] = set()
        self.claimed_leases: dict[str, LeaseRef] = {}
        self._leases = itertools.count(1)
        self._batches_seen: set[int] = set()

    # -- inputs --------------------------------------------------------------------------

    def call(self, key: str, *, mode: ClaimMode = ClaimMode.NORMAL, nested: bool = False) -> Call:
        call = Call(
            tool=self.tool, input={"k": key}, key=key, input_hash=f"h-{key}", credential_digest="",
            mode=mode, stale_after_s=None, timeout_s=TIMEOUT_S, future=new_future(), submitted_at=self.now,
        )  # fmt: skip
        call.nested = nested
        self.calls.append(call)
        return call

    def drain(self, *keys: str, **kwargs: Any) -> list[Call]:
        """One call per key leaves the queue (``Lifecycle.drained``)."""
        calls = [self.call(k, **kwargs) for k in keys]
        self.life.drained([Group.of(c) for c in calls], self.now)
        if self.fx.immediate and not self.straight:
            self.grant_now(-1)
        self.pump()
        return calls

    def grant_now(self, n: int) -> None:
        """The governor answers slots asked for before a claim: ``n`` (0: no room, -1: paced)."""
        self.fx.immediate.pop(0)
        self.granted[False] += max(0, n)
        self.life.handle(SlotsGranted(value=n, error=None), self.now)
        self.pump()

    def attach(self, key: str) -> Call:
        """A call of a key already in flight joins its group (``ToolQueue.submit``)."""
        from actors.lifecycle.calls import Role

        call = self.call(key)
        self.life.groups[key].join(call, Role.ATTACHED)
        return call

    def tick(self, seconds: float) -> None:
        self.now += seconds

    def pump(self) -> None:
        """The end of an actor message: ask for slots, send what was gathered (outputs,
        releases), and let the store and the flusher acknowledge releases and latch trips."""
        self.life.pump(self.now)
        for _ in range(20):
            self.life.flush()
            progressed = False
            while self.fx.release_batches:
                error = self.release_errors.pop(0) if self.release_errors else None
                batch = self.fx.release_batches.pop(0)
                self.life.handle(ReceiptsReleased(batch=batch, value=None, error=error), self.now)
                progressed = True
            while self.fx.trip_batches:
                batch = self.fx.trip_batches.pop(0)
                self.life.handle(LatchTripped(batch=batch, value=None, error=None), self.now)
                progressed = True
            if not progressed:
                break
            self.life.pump(self.now)

    # -- answers -------------------------------------------------------------------------

    def receipt(self, key: str, status: ReceiptStatus, **fields: Any) -> Receipt:
        return Receipt(
            key=key, org_id=ORG, scope=SCOPE, tool_id=self.tool.tool_id, status=status, input_hash=f"h-{key}",
            **fields,
        )  # fmt: skip

    def last_claim(self) -> tuple[int, ClaimMode, list[str]]:
        if self.fx.immediate and not self.straight:
            self.grant_now(-1)
        batch = max(self.fx.claims)
        mode, requests = self.fx.claims[batch]
        return batch, mode, [r.key for r in requests]

    def answer_claim(
        self, dispositions: dict[str, ClaimDisposition] | None = None, **receipts: Receipt
    ) -> None:
        """Answer the latest claim: CLAIMED unless ``dispositions`` says otherwise."""
        batch, _, keys = self.last_claim()
        assert batch not in self._batches_seen, "claim answered twice"
        self._batches_seen.add(batch)
        claims = []
        for key in keys:
            disposition = (dispositions or {}).get(key, ClaimDisposition.CLAIMED)
            receipt = receipts.get(key)
            if receipt is None and disposition is ClaimDisposition.CLAIMED:
                lease = f"lease-{next(self._leases)}"
                started = key in self.fx.running.get(batch, ())  # claimed straight into running
                status = ReceiptStatus.RUNNING if started else ReceiptStatus.QUEUED
                receipt = self.receipt(key, status, lease_id=lease, attempts=1)
            elif receipt is None and disposition is ClaimDisposition.REUSED:
                receipt = self.receipt(key, ReceiptStatus.COMPLETED, output={"stored": key})
            elif receipt is None:
                receipt = self.receipt(key, ReceiptStatus.RUNNING, lease_id="theirs")
            if disposition is ClaimDisposition.CLAIMED:
                assert receipt.lease_id is not None
                self.claimed_leases[key] = LeaseRef(key, receipt.lease_id)
            claims.append(Claim(disposition, receipt))
        self.life.handle(ReceiptsClaimed(batch=batch, value=claims, error=None), self.now)
        self.pump()

    def fail_claim(self, error: BaseException) -> None:
        batch, _, _ = self.last_claim()
        self._batches_seen.add(batch)
        self.life.handle(ReceiptsClaimed(batch=batch, value=None, error=error), self.now)
        self.pump()

    def grant(self, n: int | None = None, exempt: bool = False) -> None:
        """The governor answers the oldest open request with ``n`` slots (default: all wanted)."""
        want, was_exempt = self.fx.acquires[self.grants_answered]
        assert was_exempt is exempt
        self.grants_answered += 1
        n = want if n is None else n
        self.granted[exempt] += n
        self.life.handle(SlotsGranted(value=n, error=None, exempt=exempt), self.now)
        self.pump()

    def refuse(self, error: BaseException, exempt: bool = False) -> None:
        self.grants_answered += 1
        self.life.handle(SlotsGranted(value=None, error=error, exempt=exempt), self.now)
        self.pump()

    def open_acquires(self) -> int:
        return len(self.fx.acquires) - self.grants_answered

    def mark(self, refused: tuple[str, ...] = (), error: BaseException | None = None) -> None:
        batch = max(self.fx.marks)
        assert batch not in self._batches_seen, "mark_running answered twice"
        self._batches_seen.add(batch)
        report = None
        if error is None:
            self.lost.update(refused)  # the store refused: the lease is someone else's now
            refusals = {k: Refusal(RefusalReason.LEASE_LOST, "taken") for k in refused}
            report = FenceReport(refused=refusals)
        self.life.handle(RunningMarked(batch=batch, value=report, error=error), self.now)
        self.pump()

    def finish(
        self, value: Any = "ok", error: BaseException | None = None, spec: AttemptSpec | None = None,
        sent: bool = True, costs: tuple[Any, ...] = (), replayed: bool = False, sent_at: float | None = None,
    ) -> None:  # fmt: skip
        """The worker reports the latest (or ``spec``'s) attempt (``sent``: False when its
        request never went out, as a send gate reports a turn after the deadline; ``costs``:
        its members' costs, as the worker works them out from the tool's price; ``replayed``: the
        provider answered from its record of the request's idempotency key; ``sent_at``: when it
        went out, default now)."""
        spec = spec or self.fx.starts[-1]
        self.unsent_retries += not sent and spec.attempt > 1
        members = None
        if error is None:
            members = [
                (encode_output(value if value != "ok" else {"v": k}), None) for k in spec.context.receipt_keys
            ]
        self.life.handle(
            UnitFinished(
                unit=spec.unit,
                attempt=spec.attempt,
                members=members,
                error=error,
                sent_at=(self.now if sent_at is None else sent_at) if sent else None,
                costs=costs,
                replayed=replayed,
            ),
            self.now,
        )
        self.pump()

    def persisted(
        self, kind: str = "persisted", error: BaseException | None = None, **per_key: FlushOutcome
    ) -> None:
        """The flusher answers the latest persist request."""
        batch = max(self.fx.persists)
        assert batch not in self._batches_seen, "persist answered twice"
        self._batches_seen.add(batch)
        entries = self.fx.persists[batch]
        outcomes = None if error else {e.key: per_key.get(e.key, FlushOutcome(kind)) for e in entries}  # type: ignore[arg-type]
        self.life.handle(CompletionsPersisted(batch=batch, value=outcomes, error=error), self.now)
        self.pump()

    def failures_recorded(self, error: BaseException | None = None) -> None:
        batch = max(self.fx.failures)
        assert batch not in self._batches_seen, "fail_many answered twice"
        self._batches_seen.add(batch)
        report = None if error else FenceReport()
        self.life.handle(FailuresRecorded(batch=batch, value=report, error=error), self.now)
        self.pump()

    def leases_lost(self, *keys: str) -> None:
        """The heartbeat found these leases taken (it drops them from its registrations)."""
        self.lost.update(keys)
        self.life.handle(LeasesLost(keys=keys), self.now)
        self.pump()

    def fire(self, kind: type) -> Any:
        """Fire the oldest pending timer of ``kind`` (its delay passes on the clock)."""
        for i, (delay, message) in enumerate(self.fx.timers):
            if isinstance(message, kind):
                del self.fx.timers[i]
                self.tick(delay)
                self.life.handle(message, self.now)
                self.pump()
                return message
        raise AssertionError(f"no {kind.__name__} timer is pending: {self.fx.timers}")

    def read(self, **receipts: Receipt | None) -> None:
        batch = max(self.fx.reads)
        self._batches_seen.add(batch)
        keys = self.fx.reads[batch]
        self.life.handle(
            ReceiptsRead(batch=batch, value=[receipts.get(k) for k in keys], error=None), self.now
        )
        self.pump()

    def retry_charged(self, error: BaseException | None = None) -> None:
        unit = self.fx.retry_charges.pop(0)
        self.retries_charged += error is None
        self.life.handle(RetryCharged(unit=unit, value=error is None, error=error), self.now)
        self.pump()

    def stop(self) -> int:
        refused = self.life.stop(self.now)
        self.pump()
        return refused

    def cancel(self, call: Call) -> bool:
        removed = self.life.cancel(call, self.now)
        self.pump()
        return removed

    # -- what callers got ----------------------------------------------------------------

    def outcome(self, call: Call) -> Any:
        answers = self.fx.answers[id(call)]
        assert len(answers) == 1, f"call {call.key} answered {len(answers)} times: {answers}"
        return answers[0]

    def answered(self, call: Call) -> bool:
        return bool(self.fx.answers[id(call)])

    # -- the exit invariant --------------------------------------------------------------

    def assert_nothing_held(self) -> None:
        # the governor answers every request still open (it grants what was asked)
        while self.open_acquires():
            exempt = self.fx.acquires[self.grants_answered][1]
            self.grant(exempt=exempt)
        life, fx = self.life, self.fx
        assert life.idle, f"groups {list(life.groups)} / units {list(life.units)} still held"
        assert not life.pending and not life.pending_exempt
        assert life.holding == 0
        assert fx.slots_released == self.granted, f"released {fx.slots_released}, granted {self.granted}"
        retries_sent = sum(1 for spec in fx.starts if spec.attempt > 1) - self.unsent_retries
        assert self.retries_charged == retries_sent + fx.retry_refunds, (
            f"{self.retries_charged} retry charges: {retries_sent} retries sent, {fx.retry_refunds} refunded"
        )
        for key, n in fx.registered.items():
            assert fx.unregistered[key] + (key in self.lost) >= n, f"lease of {key} still renewed"
        completed = {e.key for entries in fx.persists.values() for e in entries}
        failed = {f.key for records in fx.failures.values() for f in records}
        released = {lease.key for lease in fx.released}
        for key in self.claimed_leases:
            assert key in completed | failed | released | self.lost, f"claimed receipt {key} left held"
        for call in self.calls:
            self.outcome(call)  # exactly once


def value_of(outcome: Any) -> Any:
    """The value of a ``ToolResult`` answer (fails on anything else)."""
    assert isinstance(outcome, ToolResult), outcome
    return outcome.value


def run_to_running(d: Driver, *keys: str) -> list[Call]:
    """One call per key, claimed, granted and marked: its attempt is out."""
    calls = d.drain(*keys)
    d.answer_claim()
    d.grant()
    d.mark()
    return calls


def plain(value: Any) -> Any:
    """A non-durable tool's member outcome, as its worker hands it over."""
    return PlainValue(value)


def stopped_outcome(d: Driver, call: Call) -> Any:
    """The answer of a call refused by a stop (fails unless it is ``CallCancelledError``)."""
    outcome = d.outcome(call)
    assert isinstance(outcome, CallCancelledError), outcome
    return outcome
