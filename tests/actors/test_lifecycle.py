"""State-machine tests of :class:`actors.lifecycle.machine.Lifecycle`: a fake clock, a recording
``Effects``, no threads, no sleeps.

Each test drives groups to one exit (claim error, mark_running error, failure-record
error, lease lost, cancel, stop, deadline, 429, retry budget refused, ...) by calling the
lifecycle's methods with the answers its effects asked for, as the tool queue actor would
(``pump`` after every message, like ``ActorEffects.dispatch``). Then
:meth:`Driver.assert_nothing_held` checks the exit actions (STYLE.md, the life of a call):
as many slots released as granted, every retry budget charge spent on a retry sent or
given back, every lease registered with the heartbeat unregistered
(or dropped by the heartbeat as lost), every claimed lease completed, failed, released or
lost, every call answered exactly once, and ``lifecycle.idle``.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

import pytest

from actors.errors import (
    BudgetExceededError,
    CallCancelledError,
    LeaseLostError,
    NotSentError,
    PersistenceCircuitOpenError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitedError,
    ReceiptPersistenceError,
    ReceiptWaitTimeoutError,
    RecordedFailureError,
    StoreError,
    ToolTimeoutError,
)
from actors.flusher.actor import FlushOutcome, Latch
from actors.lifecycle.attempts import AttemptSpec
from actors.lifecycle.calls import Call, Group, GroupState
from actors.lifecycle.machine import Lifecycle
from actors.messages import CleanupDue, DeadlineDue, PollDue, RetryDue, UnitFinished
from actors.results import ToolResult
from actors.runtime.futures import new_future
from actors.tool import BatchStrategy, Policy, Tool
from actors.worker.launch import Launch
from stores.codec import encode_output
from stores.types import (
    Claim,
    ClaimDisposition,
    ClaimMode,
    FailureKind,
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


def _noop(value: Any, ctx: Any) -> Any:
    return value


TOOL = Tool(tool_id="lookup", fn=_noop)
SAFE = Tool(tool_id="safe", fn=_noop, retry_safe=True)
BATCHED = Tool(tool_id="verify", fn=_noop, batch=BatchStrategy(batch_fn=_noop, max_batch_size=5))
LOCAL = Tool(tool_id="local", fn=_noop, durable=False)


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
        self.starts: list[AttemptSpec] = []
        self.persists: dict[int, list[Any]] = {}
        self.failures: dict[int, list[Any]] = {}
        self.released: list[LeaseRef] = []
        self.registered: collections.Counter[str] = collections.Counter()
        self.unregistered: collections.Counter[str] = collections.Counter()
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
        self.memo: dict[str, tuple[str, bool]] = {}
        self.release_batches: list[int] = []
        self.refunds = 0
        self.running: dict[int, frozenset[str]] = {}
        """Claim batch -> keys to claim straight into running."""
        self.immediate: list[tuple[int, bool]] = []
        """Slots asked for before a claim (answered at once by the governor)."""
        self.trip_batches: list[int] = []
        self.uncertain: set[str] = set()
        self.reconciles: list[tuple[int, str]] = []
        self.resolves: list[tuple[int, str, str]] = []
        self.launch = Launch(Latch())
        self.hold_sends = False
        """Attempts wait before their send (a gate, a batch's build): withdrawable."""
        self.withdrawn: list[tuple[str, BaseException]] = []

    def claim(
        self, batch: int, mode: ClaimMode, stale_after_s: float | None, requests: list[Any],
        running: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        self.claims[batch] = (mode, requests)
        self.running[batch] = running

    def read(self, batch: int, keys: list[str]) -> None:
        self.reads[batch] = keys

    def acquire(self, want: int, exempt: bool, immediate: bool = False) -> None:
        (self.immediate if immediate else self.acquires).append((want, exempt))

    def release_slots(
        self, count: int, exempt: bool = False, successes: int = 0, unavailable: int = 0, answered: int = 0,
        refunds: int = 0, sent_at: float | None = None,
    ) -> None:  # fmt: skip
        self.slots_released[exempt] += count
        self.refunds += refunds
        self.reports.append({"successes": successes, "unavailable": unavailable, "answered": answered})

    def backpressure(self, retry_after: Any, sent_at: float | None) -> None:
        self.backpressures.append(retry_after)

    def mark_running(self, batch: int, leases: list[LeaseRef]) -> None:
        self.marks[batch] = leases

    def start(self, spec: AttemptSpec) -> None:
        self.starts.append(spec)
        if not self.hold_sends:  # its worker sends at once (takes its ticket)
            assert self.launch.take(spec.ticket) is None

    def persist(self, batch: int, entries: list[Any], input_hashes: dict[str, str]) -> None:
        self.persists[batch] = entries

    def record_failures(self, batch: int, failures: list[Any], uncertain: bool = False) -> None:
        self.failures[batch] = failures
        if uncertain:
            self.uncertain.update(f.key for f in failures)

    def release_receipts(self, batch: int, leases: list[LeaseRef]) -> None:
        self.released.extend(leases)
        self.release_batches.append(batch)

    def reconcile(self, batch: int, group: Group) -> None:
        self.reconciles.append((batch, group.key))

    def resolve(self, batch: int, key: str, action: str, output: Any = None) -> None:
        self.resolves.append((batch, key, action))

    def beat(self, batch: int, leases: list[LeaseRef]) -> None:
        self.registered.update(lease.key for lease in leases)

    def unbeat(self, keys: list[str]) -> None:
        self.unregistered.update(keys)

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

    def remember(self, key: str, text: str, cached: bool) -> None:
        self.memo[key] = (text, cached)

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
        self.life.on_granted(n, None, self.now)
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
                self.life.on_released(self.fx.release_batches.pop(0), self.now, error)
                progressed = True
            while self.fx.trip_batches:
                self.life.on_latch_tripped(self.fx.trip_batches.pop(0), self.now)
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
        self.life.on_claimed(batch, claims, None, self.now)
        self.pump()

    def fail_claim(self, error: BaseException) -> None:
        batch, _, _ = self.last_claim()
        self._batches_seen.add(batch)
        self.life.on_claimed(batch, None, error, self.now)
        self.pump()

    def grant(self, n: int | None = None, exempt: bool = False) -> None:
        """The governor answers the oldest open request with ``n`` slots (default: all wanted)."""
        want, was_exempt = self.fx.acquires[self.grants_answered]
        assert was_exempt is exempt
        self.grants_answered += 1
        n = want if n is None else n
        self.granted[exempt] += n
        self.life.on_granted(n, None, self.now, exempt=exempt)
        self.pump()

    def refuse(self, error: BaseException, exempt: bool = False) -> None:
        self.grants_answered += 1
        self.life.on_granted(None, error, self.now, exempt=exempt)
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
        self.life.on_marked(batch, report, error, self.now)
        self.pump()

    def finish(
        self, value: Any = "ok", error: BaseException | None = None, spec: AttemptSpec | None = None,
        sent: bool = True,
    ) -> None:  # fmt: skip
        """The worker reports the latest (or ``spec``'s) attempt (``sent``: False when its
        request never went out, as a send gate reports a turn after the deadline)."""
        spec = spec or self.fx.starts[-1]
        self.unsent_retries += not sent and spec.attempt > 1
        members = None
        if error is None:
            members = [
                (encode_output(value if value != "ok" else {"v": k}), None) for k in spec.context.receipt_keys
            ]
        self.life.on_finished(
            UnitFinished(
                unit=spec.unit,
                attempt=spec.attempt,
                members=members,
                error=error,
                sent_at=self.now if sent else None,
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
        self.life.on_persisted(batch, outcomes, error, self.now)
        self.pump()

    def failures_recorded(self, error: BaseException | None = None) -> None:
        batch = max(self.fx.failures)
        assert batch not in self._batches_seen, "fail_many answered twice"
        self._batches_seen.add(batch)
        self.life.on_failures_recorded(batch, None if error else FenceReport(), error, self.now)
        self.pump()

    def leases_lost(self, *keys: str) -> None:
        """The heartbeat found these leases taken (it drops them from its registrations)."""
        self.lost.update(keys)
        self.life.on_leases_lost(keys, self.now)
        self.pump()

    def fire(self, kind: type) -> Any:
        """Fire the oldest pending timer of ``kind`` (its delay passes on the clock)."""
        for i, (delay, message) in enumerate(self.fx.timers):
            if isinstance(message, kind):
                del self.fx.timers[i]
                self.tick(delay)
                if isinstance(message, PollDue):
                    self.life.on_poll(message.keys, self.now)
                elif isinstance(message, DeadlineDue):
                    for unit in message.units:
                        self.life.on_deadline(unit, self.now)
                elif isinstance(message, RetryDue):
                    self.life.on_retry_due(message.unit, self.now)
                self.pump()
                return message
        raise AssertionError(f"no {kind.__name__} timer is pending: {self.fx.timers}")

    def read(self, **receipts: Receipt | None) -> None:
        batch = max(self.fx.reads)
        self._batches_seen.add(batch)
        keys = self.fx.reads[batch]
        self.life.on_read(batch, [receipts.get(k) for k in keys], None, self.now)
        self.pump()

    def retry_charged(self, error: BaseException | None = None) -> None:
        unit = self.fx.retry_charges.pop(0)
        self.retries_charged += error is None
        self.life.on_retry_charged(unit, error, self.now)
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


def _value(outcome: Any) -> Any:
    assert isinstance(outcome, ToolResult), outcome
    return outcome.value


def _run_to_running(d: Driver, *keys: str) -> list[Call]:
    calls = d.drain(*keys)
    d.answer_claim()
    d.grant()
    d.mark()
    return calls


# -- the happy paths ---------------------------------------------------------------------


def test_lifecycle_claim_admit_mark_run_persist_answers_live_and_holds_nothing() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    assert [s.unit for s in d.fx.starts] == [1] or len(d.fx.starts) == 1
    assert d.life.groups["a"].state is GroupState.RUNNING
    d.finish({"v": 1})
    assert not d.answered(call)  # answered once persisted, not before
    assert d.fx.slots_released[False] == 0  # the slot is free only once the result is written
    d.persisted()
    result = d.outcome(call)
    assert (_value(result), result.execution) == ({"v": 1}, "live")
    assert d.fx.memo["a"][1] is False
    d.assert_nothing_held()


def test_lifecycle_reused_and_followers_share_one_answer_each() -> None:
    d = Driver()
    owner = d.call("a")
    group = Group.of(owner)
    from actors.lifecycle.calls import Role

    follower = d.call("a")
    group.join(follower, Role.FOLLOWER)
    d.life.drained([group], d.now)
    d.answer_claim({"a": ClaimDisposition.REUSED})
    assert [_value(d.outcome(c)) for c in (owner, follower)] == [{"stored": "a"}] * 2
    assert {d.outcome(c).execution for c in (owner, follower)} == {"cached"}
    assert d.fx.acquires == []  # nothing admitted
    d.assert_nothing_held()


def test_lifecycle_unbatched_tool_runs_non_durable_without_receipts() -> None:
    d = Driver(LOCAL)
    (call,) = d.drain("a")
    assert d.fx.claims == {}
    d.grant()
    assert d.fx.marks == {}
    spec = d.fx.starts[-1]
    d.life.on_finished(
        UnitFinished(unit=spec.unit, attempt=spec.attempt, members=[(_plain({"x": 1}), None)], error=None),
        d.now,
    )
    assert _value(d.outcome(call)) == {"x": 1}
    d.assert_nothing_held()


def _plain(value: Any) -> Any:
    from actors.lifecycle.attempts import PlainValue

    return PlainValue(value)


def test_lifecycle_nested_calls_take_exempt_slots_and_give_them_back() -> None:
    d = Driver()
    (call,) = d.drain("a", nested=True)
    d.answer_claim()
    assert d.fx.acquires == [(1, True)]
    d.grant(exempt=True)
    d.mark()
    d.finish()
    d.persisted()
    assert d.fx.slots_released == {False: 0, True: 1}
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_width_bounds_slots_asked_and_a_freed_slot_admits_the_next_at_once() -> None:
    d = Driver(width=2)
    calls = d.drain("a", "b", "c", "d")
    d.answer_claim()
    assert d.fx.acquires == [(2, False)]
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2
    d.finish(spec=d.fx.starts[0])
    d.persisted()  # a's result written: its slot is free, the next unit is asked for at once
    assert d.fx.acquires[-1] == (1, False)
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 3
    for spec in d.fx.starts[1:]:
        d.finish(spec=spec)
        d.persisted()
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert [_value(d.outcome(c)) for c in calls] == [{"v": k} for k in "abcd"]
    d.assert_nothing_held()


# -- store errors at each step -------------------------------------------------------------


def test_lifecycle_claim_error_answers_every_caller_and_holds_nothing() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.fail_claim(StoreError("disk I/O error"))
    assert all(isinstance(d.outcome(c), StoreError) for c in calls)
    assert d.fx.acquires == []
    d.assert_nothing_held()


def test_lifecycle_mark_running_error_releases_slot_receipt_and_heartbeat() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.answer_claim()
    d.grant()
    d.mark(error=StoreError("database is locked"))
    assert all(isinstance(d.outcome(c), StoreError) for c in calls)
    assert d.fx.starts == []  # never sent
    assert {lease.key for lease in d.fx.released} == {"a", "b"}
    d.assert_nothing_held()


def test_lifecycle_mark_running_refusing_one_lease_runs_the_others() -> None:
    d = Driver(BATCHED)
    a, b = d.drain("a", "b")
    d.answer_claim()
    d.grant()
    d.mark(refused=("a",))
    assert isinstance(d.outcome(a), LeaseLostError)
    assert d.fx.starts[-1].context.receipt_keys == ("b",)
    d.finish()
    d.persisted()
    assert _value(d.outcome(b)) == {"v": "b"}
    d.assert_nothing_held()


def test_lifecycle_failure_record_error_trips_the_latch_and_carries_both_causes() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish(error=ProviderError("bad request"))
    assert d.fx.slots_released[False] == 0  # held until the failure is written
    d.failures_recorded(error=StoreError("disk full"))
    error = d.outcome(call)
    assert isinstance(error, ReceiptPersistenceError) and "bad request" in str(error)
    assert d.fx.tripped
    d.assert_nothing_held()


def test_lifecycle_completion_flusher_error_salvages_and_answers() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish({"paid": True})
    d.persisted(error=RuntimeError("flusher crashed"))
    assert _value(d.outcome(call)) == {"paid": True}  # the caller still gets what was paid for
    assert [k for k, _ in d.fx.salvaged] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_refused_output_is_answered_salvaged_and_its_receipt_failed() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish({"big": "x"})
    d.persisted(a=FlushOutcome("refused", error="too large", reason="output_too_large"))
    assert _value(d.outcome(call)) == {"big": "x"}
    ((record,),) = d.fx.failures.values()
    assert record.failure_kind is FailureKind.OUTPUT_TOO_LARGE
    d.failures_recorded()
    d.assert_nothing_held()


# -- leases --------------------------------------------------------------------------------


def test_lifecycle_lease_lost_while_claimed_answers_at_once_and_returns_the_late_grant() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    assert d.open_acquires() == 1
    d.leases_lost("a")
    assert isinstance(d.outcome(call), LeaseLostError)
    d.grant()  # the governor's answer arrives after: the slot goes straight back
    assert d.fx.starts == []
    d.assert_nothing_held()


def test_lifecycle_lease_lost_while_running_answers_now_and_salvages_the_late_result() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.leases_lost("a")
    assert isinstance(d.outcome(call), LeaseLostError)
    late = d.attach("a")  # ToolQueue refuses lost groups; a direct join still never hangs
    d.finish({"late": True})
    assert d.fx.slots_released[False] == 0  # still held: the result is being written
    d.persisted(a=FlushOutcome("lease_lost", error="taken"))
    assert isinstance(d.outcome(late), LeaseLostError)
    assert d.fx.counts["salvaged"] == 1
    d.assert_nothing_held()


def test_lifecycle_lease_lost_while_persisting_is_judged_by_the_write() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish()
    d.leases_lost("a")  # a renewal refused while the completion is out
    assert not d.answered(call)  # the write's report decides
    d.persisted(a=FlushOutcome("lease_lost", error="taken"))
    assert isinstance(d.outcome(call), LeaseLostError)
    d.assert_nothing_held()


def test_lifecycle_a_renewal_racing_the_completion_is_not_a_lost_lease() -> None:
    # the receipt completed a moment before a renewal of it ran: the renewal is refused
    # (it is not queued/running any more), but the call's result stands
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish()
    d.leases_lost("a")
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    assert d.fx.counts["lease_lost"] == 0
    d.lost.discard("a")
    d.assert_nothing_held()


# -- cancel at each state ------------------------------------------------------------------


def test_lifecycle_cancel_while_claiming_releases_the_claim_when_it_lands() -> None:
    d = Driver()
    (call,) = d.drain("a")
    assert d.cancel(call)
    assert isinstance(d.outcome(call), CallCancelledError)
    d.answer_claim()
    assert [lease.key for lease in d.fx.released] == ["a"]
    assert d.fx.acquires == []
    d.assert_nothing_held()


def test_lifecycle_cancel_while_waiting_on_another_owner_stops_the_wait() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    assert d.life.groups["a"].state is GroupState.WAITING
    assert d.cancel(call)
    assert isinstance(d.outcome(call), CallCancelledError)
    d.fire(PollDue)  # the timer finds nothing to read
    assert d.fx.reads == {}
    d.assert_nothing_held()


def test_lifecycle_cancel_while_waiting_for_a_slot_releases_the_receipt() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    assert d.cancel(call)
    assert isinstance(d.outcome(call), CallCancelledError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.grant()
    assert d.fx.starts == []
    d.assert_nothing_held()


@pytest.mark.parametrize("nested", [False, True], ids=["slot", "exempt"])
def test_lifecycle_a_grant_beyond_what_still_waits_gives_its_charges_back(nested: bool) -> None:
    # Slots asked for two calls; one is cancelled before the governor answers. The grant
    # charged both to the provider_calls budget: the slot nobody used comes back with its
    # charge, else every cancelled wait would spend the budget for good.
    d = Driver()
    keep, gone = d.drain("a", "b", nested=nested)
    d.answer_claim()
    assert d.fx.acquires[-1] == (2, nested)
    assert d.cancel(gone)
    d.grant(exempt=nested)
    d.mark()
    assert len(d.fx.starts) == 1
    assert d.fx.refunds == 1
    d.finish()
    d.persisted()
    assert _value(d.outcome(keep)) == {"v": "a"}
    assert d.fx.refunds == 1  # the call that went out keeps its charge
    d.assert_nothing_held()


def test_lifecycle_cancel_while_marking_running_is_never_sent() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    assert d.cancel(call)
    d.mark()
    assert d.fx.starts == []
    assert isinstance(d.outcome(call), CallCancelledError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_cancel_while_running_is_refused_and_the_result_still_answers() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    assert not d.cancel(call)  # sent: persisted as usual
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_cancel_one_of_two_callers_keeps_the_execution() -> None:
    d = Driver()
    (owner,) = d.drain("a")
    other = d.attach("a")
    d.answer_claim()
    assert d.cancel(owner)
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert isinstance(d.outcome(owner), CallCancelledError)
    assert _value(d.outcome(other)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_cancel_during_retry_backoff_releases_everything() -> None:
    d = Driver(SAFE)
    (call,) = _run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    assert d.fx.retry_charges
    assert d.cancel(call)
    d.retry_charged()
    assert len(d.fx.starts) == 1
    d.assert_nothing_held()


# -- stop at each state --------------------------------------------------------------------


def _stopped_outcome(d: Driver, call: Call) -> Any:
    outcome = d.outcome(call)
    assert isinstance(outcome, CallCancelledError), outcome
    return outcome


def test_lifecycle_stop_before_drain_refuses_at_once() -> None:
    d = Driver()
    d.stop()
    (call,) = d.drain("a")
    _stopped_outcome(d, call)
    assert d.fx.claims == {}
    d.assert_nothing_held()


def test_lifecycle_stop_while_claiming_releases_the_claim_when_it_lands() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.stop()
    d.answer_claim()
    _stopped_outcome(d, call)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_stop_while_waiting_on_another_owner_refuses_it() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    assert d.stop() == 1
    _stopped_outcome(d, call)
    d.fire(PollDue)
    assert d.fx.reads == {}
    d.assert_nothing_held()


def test_lifecycle_stop_while_waiting_for_a_slot_releases_and_returns_the_late_grant() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.answer_claim()
    assert d.stop() == 2
    for call in calls:
        _stopped_outcome(d, call)
    d.refuse(CallCancelledError("the dispatcher is stopping"))  # the governor's stop
    assert d.fx.starts == []
    assert {lease.key for lease in d.fx.released} == {"a", "b"}
    d.assert_nothing_held()


def test_lifecycle_stop_while_marking_running_is_never_sent() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    d.stop()
    d.mark()
    assert d.fx.starts == []
    _stopped_outcome(d, call)
    d.assert_nothing_held()


def test_lifecycle_stop_while_running_lets_the_call_finish_and_persist() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    assert d.stop() == 0
    assert not d.life.idle
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_stop_during_retry_backoff_sends_nothing_more() -> None:
    d = Driver(SAFE)
    (call,) = _run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.stop()
    _stopped_outcome(d, call)
    d.retry_charged()
    for _ in range(len([t for t in d.fx.timers if isinstance(t[1], RetryDue)])):
        d.fire(RetryDue)
    assert len(d.fx.starts) == 1
    d.assert_nothing_held()


def test_lifecycle_stop_while_persisting_still_answers_the_result() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish()
    d.stop()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


# -- deadlines -----------------------------------------------------------------------------


def test_lifecycle_deadline_while_running_keeps_the_slot_until_the_late_result_is_persisted() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.fire(DeadlineDue)
    assert isinstance(d.outcome(call), ToolTimeoutError)
    assert d.fx.slots_released[False] == 0  # still running: the slot, lease and heartbeat stay
    assert d.fx.unregistered["a"] == 0
    again = d.attach("a")  # a new call of that key attaches to the running execution
    d.finish({"late": 1})
    assert d.fx.failures == {}  # the late result is not thrown away
    d.persisted()
    assert (_value(d.outcome(again)), d.outcome(again).execution) == ({"late": 1}, "in_flight")
    assert d.fx.memo["a"][0] == encode_output({"late": 1})
    d.assert_nothing_held()


def test_lifecycle_a_429_readmission_gets_a_whole_timeout_at_its_next_send() -> None:
    # a 429 means the call was not served: its deadline starts again when it is next sent
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="1"))
    d.retry_charged()
    d.tick(TIMEOUT_S + 1)  # the pause outlasted the first deadline
    d.fire(DeadlineDue)  # that old deadline is void now
    assert not d.answered(call)
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2 and d.fx.starts[-1].context.timeout_s == TIMEOUT_S
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_send_gate_paused_after_a_429_readmission_waits_for_the_pause() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="30"))
    d.retry_charged()
    d.fx.blocked = (d.now + 60.0, False)  # the provider paused after this grant
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 1 and d.open_acquires() == 1  # not sent: asked again
    d.fx.blocked = None
    d.tick(60.0)
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_send_gate_paused_before_the_first_send_readmits() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.fx.blocked = (d.now + 1.0, False)
    d.grant()
    d.mark()
    assert d.fx.starts == [] and d.fx.slots_released[False] == 1  # slot back, asked again
    assert d.fx.refunds == 1  # nothing went out under it: its provider_calls charge comes back
    assert d.open_acquires() == 1
    d.fx.blocked = None
    d.tick(1.0)
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_closed_circuit_at_send_refuses_and_releases() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.fx.blocked = (d.now + 5.0, True)
    d.grant()
    d.mark()
    assert isinstance(d.outcome(call), ProviderUnavailableError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_deadline_during_retry_backoff_is_never_readmitted_after_its_failure() -> None:
    d = Driver(SAFE)
    (call,) = _run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.fire(DeadlineDue)  # the deadline passes while the retry's budget charge is out
    assert len(d.fx.failures) == 1  # its failure is being recorded
    d.retry_charged()  # the charge answers before the failure write does
    while any(isinstance(m, RetryDue) for _, m in d.fx.timers):
        d.fire(RetryDue)
    assert d.open_acquires() == 0, "a unit whose failure is being recorded asked for a slot again"
    assert len(d.fx.marks) == 1 and len(d.fx.starts) == 1
    d.failures_recorded()
    assert len(d.fx.failures) == 1
    assert isinstance(d.outcome(call), ConnectionError)
    d.assert_nothing_held()


# -- retries and backpressure --------------------------------------------------------------


def test_lifecycle_429_readmits_after_charging_the_retry_budget() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="2"))
    assert d.fx.backpressures == ["2"]
    assert d.fx.slots_released[False] == 1  # the slot goes back while it waits
    d.retry_charged()
    d.grant()
    d.mark()
    assert [s.attempt for s in d.fx.starts] == [1, 2]
    d.finish()
    d.persisted()
    assert (_value(d.outcome(call)), d.outcome(call).execution) == ({"v": "a"}, "live")
    assert d.fx.counts["provider_calls"] == 1 and d.fx.counts["requests"] == 2
    d.assert_nothing_held()


def test_lifecycle_429_past_its_readmissions_records_the_rate_limit() -> None:
    d = Driver(policy=Policy(timeout_s=TIMEOUT_S, retry_attempts=1))
    (call,) = _run_to_running(d, "a")
    d.finish(error=RateLimitedError())
    d.retry_charged()
    d.grant()
    d.mark()
    d.finish(error=RateLimitedError())
    ((record,),) = d.fx.failures.values()
    assert record.failure_kind is FailureKind.RATE_LIMITED
    d.failures_recorded()
    assert isinstance(d.outcome(call), RateLimitedError)
    d.assert_nothing_held()


def _retry_running(d: Driver) -> Call:
    """A call whose first attempt failed transiently, its retry charged and sent."""
    (call,) = _run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    d.mark()
    return call


def test_lifecycle_a_retry_that_went_out_spends_its_charge() -> None:
    d = Driver(SAFE, policy=Policy(timeout_s=TIMEOUT_S, retry_backoff_s=0.5, retry_attempts=2))
    call = _retry_running(d)
    d.finish(error=ConnectionError("reset again"))  # sent, failed: the retry was paid for
    d.failures_recorded()
    assert isinstance(d.outcome(call), ConnectionError)
    assert d.fx.retry_refunds == 0
    d.assert_nothing_held()


def test_lifecycle_a_retry_its_send_gate_never_sent_gives_its_charge_back() -> None:
    d = Driver(SAFE)
    call = _retry_running(d)
    d.finish(error=NotSentError("its turn came after its deadline"), sent=False)
    d.pump()
    assert d.fx.retry_refunds == 1
    if d.fx.failures:
        d.failures_recorded()
    assert isinstance(d.outcome(call), BaseException)
    d.assert_nothing_held()


def test_lifecycle_a_429_readmission_stopped_before_its_send_gives_its_charge_back() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="5"))
    d.retry_charged()  # queued for a slot again, the retry paid for
    d.stop()
    _stopped_outcome(d, call)
    assert d.fx.retry_refunds == 1
    d.assert_nothing_held()


def test_lifecycle_retry_budget_refused_releases_the_receipt_unrecorded() -> None:
    d = Driver(SAFE)
    (call,) = _run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.retry_charged(BudgetExceededError("retries budget of 0 is spent"))
    assert isinstance(d.outcome(call), BudgetExceededError)
    assert d.fx.failures == {}
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_transient_error_is_retried_then_succeeds() -> None:
    d = Driver(SAFE)
    call = _retry_running(d)
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_governor_refusal_gives_every_waiting_unit_back() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.answer_claim()
    d.refuse(BudgetExceededError("provider_calls budget of 0 is spent"))
    assert all(isinstance(d.outcome(c), BudgetExceededError) for c in calls)
    assert {lease.key for lease in d.fx.released} == {"a", "b"}
    d.assert_nothing_held()


# -- the latch -----------------------------------------------------------------------------


@pytest.mark.parametrize("tripped_at", ["before_admission", "after_grant"])
def test_lifecycle_tripped_latch_starts_no_provider_call(tripped_at: str) -> None:
    d = Driver()
    calls = d.drain("a", "b")
    if tripped_at == "before_admission":
        d.fx.latch = "completion failed"
        d.answer_claim()
        assert d.fx.acquires == []
    else:
        d.answer_claim()
        d.grant()
        d.fx.latch = "completion failed"
        d.mark()
    assert d.fx.starts == []
    assert all(isinstance(d.outcome(c), PersistenceCircuitOpenError) for c in calls)
    assert d.fx.counts["refused_by_latch"] == 2
    d.assert_nothing_held()


# -- waiting on another owner --------------------------------------------------------------


def test_lifecycle_wait_on_another_owner_polls_by_timer_and_takes_its_output() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs"))
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 1}))
    outcome = d.outcome(call)
    assert (_value(outcome), outcome.execution) == ({"theirs": 1}, "in_flight")
    assert d.fx.counts["waiting_on_owner"] == 0  # the gauge went back down
    d.assert_nothing_held()


def test_lifecycle_wait_times_out_after_its_attempts() -> None:
    d = Driver(policy=Policy(timeout_s=TIMEOUT_S, receipt_wait_max_attempts=2))
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    running = d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs")
    d.fire(PollDue)
    d.read(a=running)
    d.fire(PollDue)
    d.read(a=running)  # the last poll claims (the store judges the lease)
    d.answer_claim({"a": ClaimDisposition.RUNNING}, a=running)
    assert isinstance(d.outcome(call), ReceiptWaitTimeoutError)
    d.assert_nothing_held()


def test_lifecycle_read_answer_goes_to_its_own_key_when_a_waiter_left_meanwhile() -> None:
    d = Driver()
    first, second = d.drain("a", "b")
    d.answer_claim({"a": ClaimDisposition.RUNNING, "b": ClaimDisposition.RUNNING})
    d.fire(PollDue)  # one read of a and b
    assert d.cancel(first)  # a leaves before the read answers
    d.read(a=d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs"),
           b=d.receipt("b", ReceiptStatus.COMPLETED, output={"b": 1}))  # fmt: skip
    assert _value(d.outcome(second)) == {"b": 1}
    d.assert_nothing_held()


def test_lifecycle_change_notification_reads_at_once_and_counts_no_attempt() -> None:
    d = Driver(policy=Policy(timeout_s=TIMEOUT_S, receipt_wait_max_attempts=2))
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    assert d.fx.watched == {"a"}
    running = d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs")
    for _ in range(5):  # other keys of the org changed: a is still held
        d.life.on_changed(["a"], d.now)
        d.read(a=running)
    assert [m for _, m in d.fx.timers if isinstance(m, PollDue)] == [PollDue(keys=("a",))]  # no new timer
    assert not d.answered(call)  # no attempt spent: the wait has not timed out
    d.life.on_changed(["a"], d.now)
    d.life.on_changed(["a"], d.now)  # a read is already out: no second one now...
    d.life.on_changed(["a"], d.now)
    assert len(d.fx.reads) == 6
    d.read(a=running)  # ...but one more after it (it may predate the change)
    assert len(d.fx.reads) == 7
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 1}))
    outcome = d.outcome(call)
    assert (_value(outcome), outcome.execution) == ({"theirs": 1}, "in_flight")
    assert d.fx.watched == set()
    d.fire(PollDue)  # the fallback timer finds nothing to read
    assert len(d.fx.reads) == 7
    d.assert_nothing_held()


def test_lifecycle_woken_reclaim_that_waits_again_keeps_one_timer() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    d.life.on_changed(["a"], d.now)
    d.read(a=d.receipt("a", ReceiptStatus.PENDING))  # released: claim again
    d.answer_claim({"a": ClaimDisposition.RUNNING})  # someone else took it first
    assert len([m for _, m in d.fx.timers if isinstance(m, PollDue)]) == 1
    assert d.fx.watched == {"a"}
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 2}))
    assert _value(d.outcome(call)) == {"theirs": 2}
    assert d.fx.watched == set()
    d.assert_nothing_held()


def test_lifecycle_recorded_failure_not_retryable_is_reported() -> None:
    d = Driver()
    (call,) = d.drain("a")
    failed = d.receipt("a", ReceiptStatus.FAILED, error="bad input", failure_kind=FailureKind.PERMANENT)
    d.answer_claim({"a": ClaimDisposition.FAILED}, a=failed)
    assert isinstance(d.outcome(call), RecordedFailureError)
    d.assert_nothing_held()


def test_lifecycle_not_sent_error_releases_the_receipt() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    d.mark()
    d.finish(error=NotSentError("not sent"))
    assert isinstance(d.outcome(call), NotSentError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


# -- leases a failed store write left held (actors/_cleanup.py) ----------------------------

ME = Owner("r1", 1, "host-a", 4242, 1.0)


def _held_by(
    d: Driver, key: str, lease: str, owner: Owner = ME, status: ReceiptStatus = ReceiptStatus.QUEUED
) -> Receipt:
    return d.receipt(
        key, status, lease_id=lease, lease_owner_run_id=owner.run_id, lease_owner_attempt=owner.run_attempt,
        lease_owner_host=owner.host, lease_owner_pid=owner.pid, lease_owner_started_at=owner.started_at,
    )  # fmt: skip


def _cleanup_timer(d: Driver) -> tuple[float, CleanupDue]:
    (found,) = [(delay, m) for delay, m in d.fx.timers if isinstance(m, CleanupDue)]
    d.fx.timers.remove(found)
    return found


def _fire_cleanup(d: Driver) -> float:
    delay, message = _cleanup_timer(d)
    d.tick(delay)
    d.life.on_cleanup_due(message.keys, message.leases, message.attempt, d.now)
    d.pump()
    return delay


def _refused_at_send(d: Driver) -> tuple[Call, LeaseRef]:
    """A call claimed, then refused at send (its provider's circuit is open): released."""
    (call,) = d.drain("a")
    d.answer_claim()
    d.fx.blocked = (d.now + 5.0, True)
    d.grant()
    d.mark()
    return call, d.claimed_leases["a"]


def test_lifecycle_a_failed_release_answers_at_once_and_is_retried_until_it_lands() -> None:
    d = Driver(owner=ME)
    d.release_errors = [StoreError("database is locked"), StoreError("database is locked")]
    call, lease = _refused_at_send(d)
    assert isinstance(d.outcome(call), ProviderUnavailableError)  # nobody waits on the cleanup
    assert d.fx.released == [lease]
    assert [_fire_cleanup(d), _fire_cleanup(d)] == [1.0, 3.0]  # the ladder: 1 s, then 3 s
    assert d.fx.released == [lease] * 3  # the third release landed: no more timers
    assert not [m for _, m in d.fx.timers if isinstance(m, CleanupDue)]
    assert d.fx.counts["lease_cleanup_failed"] == 0
    d.assert_nothing_held()


def test_lifecycle_a_release_that_keeps_failing_is_given_up_after_the_ladder() -> None:
    d = Driver(owner=ME)
    d.release_errors = [StoreError("disk I/O error")] * 10
    _refused_at_send(d)
    assert [_fire_cleanup(d) for _ in range(3)] == [1.0, 3.0, 9.0]
    assert not [m for _, m in d.fx.timers if isinstance(m, CleanupDue)]
    assert d.fx.counts["lease_cleanup_failed"] == 1  # the lease then lapses at its TTL
    assert len(d.fx.released) == 4


def test_lifecycle_a_claim_that_raised_reads_back_and_releases_what_it_left_us() -> None:
    d = Driver(owner=ME)
    calls = d.drain("a", "b", "c", "d")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    assert all(isinstance(d.outcome(c), StoreError) for c in calls)  # answered at once
    assert sorted(d.fx.reads[max(d.fx.reads)]) == ["a", "b", "c", "d"]
    other_run = Owner("r2", 1, "host-a", 4242, 1.0)
    other_process = Owner("r1", 1, "host-a", 999, 1.0)  # a worker started with our run id
    d.read(
        a=_held_by(d, "a", "L-a"),
        b=_held_by(d, "b", "L-b", other_run),
        c=_held_by(d, "c", "L-c", other_process),
        d=d.receipt("d", ReceiptStatus.COMPLETED, output={"v": 1}),
    )
    assert d.fx.released == [LeaseRef("a", "L-a")]  # only ours, from this process
    assert d.fx.counts["orphan_leases_released"] == 1
    d.assert_nothing_held()


def test_lifecycle_a_read_back_never_releases_a_lease_a_live_group_holds() -> None:
    d = Driver(owner=ME)
    d.drain("a")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    orphan_read = max(d.fx.reads)
    d.drain("a")  # the caller asks again before the read-back is answered: claimed anew
    d.answer_claim()
    fresh = d.claimed_leases["a"]
    d.life.on_read(orphan_read, [_held_by(d, "a", fresh.lease_id)], None, d.now)
    d.pump()
    assert d.fx.released == []


def test_lifecycle_a_read_back_that_fails_is_retried() -> None:
    d = Driver(owner=ME)
    d.drain("a")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    d.life.on_read(max(d.fx.reads), None, StoreError("still down"), d.now)
    d.pump()
    assert _fire_cleanup(d) == 1.0
    d.read(a=_held_by(d, "a", "L-a", status=ReceiptStatus.RUNNING))
    assert d.fx.released == [LeaseRef("a", "L-a")]


def test_lifecycle_without_an_owner_a_failed_claim_reads_nothing_back() -> None:
    d = Driver()
    d.drain("a")
    d.fail_claim(StoreError("connection lost after COMMIT"))
    assert d.fx.reads == {}


def test_lifecycle_a_send_held_at_the_workers_gate_when_the_circuit_opens_is_refused_and_given_back() -> None:
    d = Driver()
    (call,) = _run_to_running(d, "a")
    spec = d.fx.starts[-1]
    d.fx.blocked = (d.now + 5.0, True)  # the circuit opened while the worker waited for its turn
    d.life.on_finished(
        UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=NotSentError("gate closed")),
        d.now,
    )  # no sent_at: nothing went out
    d.pump()
    d.grant()  # admitted again; its send meets the open circuit
    d.mark()
    assert isinstance(d.outcome(call), ProviderUnavailableError)
    assert [lease.key for lease in d.fx.released] == ["a"]  # given back, not recorded failed
    assert d.fx.failures == {}
    assert d.fx.refunds == 2  # neither grant sent anything: both charges come back
    d.assert_nothing_held()


SAFE_BATCHED = Tool(
    tool_id="verify-safe", fn=_noop, retry_safe=True, batch=BatchStrategy(batch_fn=_noop, max_batch_size=5)
)


@pytest.mark.parametrize("leaves", ["cancelled", "lease_lost"])
def test_lifecycle_a_sent_batch_retries_whole_under_the_key_the_provider_saw(leaves: str) -> None:
    # The first request may have been served (its answer lost): a retry without one member
    # would carry another batch key, and the provider would bill the others again.
    d = Driver(SAFE_BATCHED)
    calls = _run_to_running(d, "a", "b", "c")
    first = d.fx.starts[-1]
    d.finish(error=ConnectionError("reset after sending"))
    if leaves == "cancelled":
        assert d.cancel(calls[1])
    else:
        d.leases_lost("b")
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    d.mark()
    retry = d.fx.starts[-1]
    assert retry.attempt == 2
    assert retry.context.receipt_keys == first.context.receipt_keys
    assert retry.context.idempotency_key == first.context.idempotency_key
    d.finish()
    d.persisted()
    assert [_value(d.outcome(c)) for c in (calls[0], calls[2])] == [{"v": "a"}, {"v": "c"}]
    assert isinstance(d.outcome(calls[1]), CallCancelledError if leaves == "cancelled" else LeaseLostError)
    assert {e.key for entries in d.fx.persists.values() for e in entries} == {"a", "b", "c"}
    d.assert_nothing_held()


@pytest.mark.parametrize("again", ["retry", "429"])
def test_lifecycle_a_sent_batch_whose_lease_is_refused_at_the_next_mark_still_goes_whole(again: str) -> None:
    """The lease of one member of a batch sent before is found taken when the batch is
    marked running again (after a retry's back-off, a 429's re-admission): the member
    rides along, answered LeaseLostError, so the request keeps the key the provider saw.
    Dropping it (as for a batch never sent) changed the key, and the provider billed the
    others again (breaker round 3)."""
    d = Driver(SAFE_BATCHED)
    calls = _run_to_running(d, "a", "b", "c")
    first = d.fx.starts[-1]
    if again == "429":
        d.finish(error=RateLimitedError(retry_after="1"))
        d.retry_charged()
    else:
        d.finish(error=ConnectionError("reset after sending"))
        d.retry_charged()
        d.fire(RetryDue)
    d.grant()
    d.mark(refused=("b",))
    assert isinstance(d.outcome(calls[1]), LeaseLostError)  # answered now, not when the batch ends
    retry = d.fx.starts[-1]
    assert retry is not first
    assert retry.context.receipt_keys == first.context.receipt_keys
    assert retry.context.idempotency_key == first.context.idempotency_key
    d.finish()
    d.persisted()
    assert [_value(d.outcome(c)) for c in (calls[0], calls[2])] == [{"v": "a"}, {"v": "c"}]
    assert {e.key for entries in d.fx.persists.values() for e in entries} == {"a", "b", "c"}
    d.assert_nothing_held()


def test_lifecycle_a_sent_batch_whose_every_lease_is_refused_at_the_next_mark_is_not_sent_again() -> None:
    d = Driver(SAFE_BATCHED)
    calls = _run_to_running(d, "a", "b")
    d.finish(error=ConnectionError("reset after sending"))
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    sends = len(d.fx.starts)
    d.mark(refused=("a", "b"))
    assert len(d.fx.starts) == sends  # nobody's leases: the owners now run them
    assert all(isinstance(d.outcome(c), LeaseLostError) for c in calls)
    d.assert_nothing_held()


@pytest.mark.parametrize("again", ["retry", "429"])
def test_lifecycle_a_unit_a_nested_call_joined_while_it_held_a_slot_goes_again_on_a_borrowed_one(
    again: str,
) -> None:
    """A running tool's nested call joined this unit while it ran; its next attempt (a
    retry, a 429's re-admission) borrows the waiting parent's slot, as a nested call
    does, instead of queueing for a slot of the ceiling the parent holds one of."""
    from actors.lifecycle.calls import Role

    d = Driver(SAFE)
    (call,) = _run_to_running(d, "a")
    nested = d.call("a", nested=True)
    d.life.groups["a"].join(nested, Role.ATTACHED)  # as ToolQueue.submit, then nested_joined
    d.life.nested_joined("a")
    if again == "429":
        d.finish(error=RateLimitedError(retry_after="1"))
        d.retry_charged()
    else:
        d.finish(error=ProviderError("503", failure_kind=FailureKind.TRANSIENT))
        d.retry_charged()
        d.fire(RetryDue)
    assert d.fx.acquires[-1] == (1, True)  # exempt: not behind the ceiling its parent holds
    d.grant(exempt=True)
    d.mark()
    d.finish()
    d.persisted()
    assert _value(d.outcome(call)) == _value(d.outcome(nested)) == {"v": "a"}
    assert d.fx.slots_released == {False: 1, True: 1}
    d.assert_nothing_held()
