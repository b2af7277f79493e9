"""The last check before a request leaves (both runtimes): what a call refused at its
worker gives back (budget and
stats, a retry's charge, its turn at the gate), callers who joined it or came after
the others left (served, not refused), and a batch whose every lease was lost (not sent:
it was paid twice)."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest

from actors import (
    BatchStrategy,
    CallCancelledError,
    LeaseLostError,
    Pacing,
    Policy,
    ProviderError,
    Tool,
    ToolTimeoutError,
)
from stores import ReceiptStatus, SqliteReceiptStore
from stores.types import FailureKind

from ..conftest import ORG, WAIT_S, outcome, until


class Batch:
    """A batch tool whose ``build`` runs ``hold(n)`` (n: the build's number, from 1)."""

    def __init__(self, hold: Any, fail: Any = None, tool_id: str = "lookup", **tool_kw: Any) -> None:
        self.hold = hold
        self.fail = fail
        self.builds = 0
        self.building = threading.Event()
        self.sent: list[tuple[int, list[int]]] = []  # (ctx.attempt, members)
        self.lock = threading.Lock()
        self.tool_id = tool_id
        self.tool_kw = tool_kw

    def build(self, inputs: list[Any]) -> Any:
        with self.lock:
            self.builds += 1
            n = self.builds
        self.building.set()
        self.hold(n)
        return list(inputs)

    def batch_fn(self, payload: Any, ctx: Any) -> Any:
        with self.lock:
            self.sent.append((ctx.attempt, [p["i"] for p in payload]))
        if self.fail is not None:
            self.fail(ctx)
        return [{"i": p["i"]} for p in payload]

    def single(self, input: Any, ctx: Any) -> Any:
        return self.batch_fn([input], ctx)[0]

    def tool(self) -> Tool:
        return Tool(
            tool_id=self.tool_id, fn=self.single,
            batch=BatchStrategy(batch_fn=self.batch_fn, max_batch_size=10, build=self.build), **self.tool_kw,
        )  # fmt: skip


# -- nothing sent (deadline passed during the build), yet charged and counted -------------


def test_send_deadline_passed_during_build_gives_the_budget_and_stats_back(make_system: Any) -> None:
    release = threading.Event()
    held = Batch(lambda n: release.wait(WAIT_S) if n == 1 else None)
    system = make_system([held.tool()], policy=Policy(batch_grace_s=0.05, max_provider_calls=1))
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}], timeout_s=0.3)
    assert all(isinstance(outcome(f), ToolTimeoutError) for f in futures)
    release.set()
    until(lambda: system.stats().get("requests", 1) == 0, "the attempt to come back unsent")
    assert held.sent == []
    stats = system.stats()
    assert (stats.get("provider_calls", 0), stats.get("batches", 0)) == (0, 0), (
        f"nothing was sent, stats say provider_calls={stats.get('provider_calls')} "
        f"batches={stats.get('batches')}"
    )
    later = outcome(system.proxy().execute("lookup", {"i": 3}))
    assert not isinstance(later, Exception), f"budget of 1 with nothing sent: {later!r}"


# -- a caller that joined (the unit's deadline extended for it) gets NotSentError ---------


@pytest.mark.waits
def test_send_a_joiner_within_its_timeout_is_served_not_refused(make_system: Any) -> None:
    held = Batch(lambda n: threading.Event().wait(0.8) if n == 1 else None)
    system = make_system([held.tool()], policy=Policy(batch_grace_s=0.01))
    first = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}], timeout_s=0.5)
    assert held.building.wait(WAIT_S)
    joiner = system.proxy().execute("lookup", {"i": 1}, timeout_s=10.0)  # joins the batch being built
    got = outcome(joiner)
    assert all(isinstance(outcome(f), ToolTimeoutError) for f in first)
    assert not isinstance(got, Exception), (
        f"the joiner was 0.8 s into its 10 s timeout_s and got {got!r}; sent: {held.sent}"
    )


# -- a batch whose every lease was lost while it waited is still sent (paid twice) --------


class _Hiccup:
    on = threading.Event()


class _RenewalHandle(SqliteReceiptStore):
    def renew_leases(self, *args: Any, **kwargs: Any) -> Any:
        if _Hiccup.on.is_set():
            raise sqlite3.OperationalError("injected: database is locked")
        return super().renew_leases(*args, **kwargs)


class _BusyRenewals(SqliteReceiptStore):
    def renewal_handle(self) -> SqliteReceiptStore:
        return _RenewalHandle(self.path)


@pytest.mark.waits
def test_send_a_batch_whose_leases_were_lost_before_it_was_sent_is_not_sent(
    make_system: Any, db_path: Any
) -> None:
    release = threading.Event()
    mine = Batch(lambda n: release.wait(WAIT_S), retry_safe=True)
    theirs = Batch(lambda n: None, retry_safe=True)
    policy = Policy(batch_grace_s=0.05, lease_ttl_s=1.0, timeout_s=30.0)
    store = _BusyRenewals(db_path)
    try:
        r1 = make_system([mine.tool()], run_id="r1", policy=policy, store=store)
        futures = r1.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
        assert mine.building.wait(WAIT_S)
        threading.Event().wait(0.4)  # its leases are registered with the heartbeat
        _Hiccup.on.set()  # renewals fail for a while: the leases lapse
        threading.Event().wait(1.5)
        r2 = make_system([theirs.tool()], run_id="r2", policy=policy)
        assert [outcome(f).execution for f in r2.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])] == [
            "live", "live",
        ]  # fmt: skip
        _Hiccup.on.clear()  # r1's next renewal finds both leases taken
        until(lambda: all(f.done for f in futures), "r1's callers to hear of the lost leases")
        release.set()
        threading.Event().wait(0.5)
        assert theirs.sent == [(1, [1, 2])]
        assert mine.sent == [], f"sent after every member's lease was lost (paid twice): {mine.sent}"
    finally:
        release.set()
        _Hiccup.on.clear()


# -- a retry withdrawn by a cancel and re-admitted goes out uncharged ----------------------


def test_send_max_retries_holds_across_a_withdrawn_retry(make_system: Any) -> None:
    release = threading.Event()

    def fail(ctx: Any) -> None:
        raise ProviderError("503", failure_kind=FailureKind.TRANSIENT)

    held = Batch(lambda n: release.wait(WAIT_S) if n == 2 else None, fail=fail, retry_safe=True)
    policy = Policy(batch_grace_s=0.05, max_retries=1, retry_attempts=5, retry_backoff_s=0.05)
    system = make_system([held.tool()], policy=policy)
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    until(lambda: held.builds >= 2, "the first retry's payload to be built")
    for future in futures:
        future.cancel()
    assert all(isinstance(outcome(f), CallCancelledError) for f in futures)
    again = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])  # joins before the worker reports
    threading.Event().wait(0.2)
    release.set()
    for future in again:
        outcome(future)
    retries_sent = len([a for a, _ in held.sent if a > 1])
    assert retries_sent <= 1, f"max_retries=1, retries sent: {retries_sent} ({held.sent})"


def test_send_a_retry_withdrawn_by_stop_is_not_counted_in_stats(make_system: Any) -> None:
    release = threading.Event()

    def fail(ctx: Any) -> None:
        raise ProviderError("503", failure_kind=FailureKind.TRANSIENT)

    held = Batch(lambda n: release.wait(WAIT_S) if n == 2 else None, fail=fail, retry_safe=True)
    system = make_system([held.tool()], policy=Policy(batch_grace_s=0.05, retry_backoff_s=0.05))
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    until(lambda: held.builds >= 2, "the first retry's payload to be built")
    threading.Timer(0.2, release.set).start()
    system.stop(timeout_s=WAIT_S)
    assert all(isinstance(outcome(f, 0), CallCancelledError) for f in futures)
    assert [a for a, _ in held.sent] == [1]  # the retry never went out
    stats = system.stats()
    assert stats.get("retries", 0) == 0, f"no retry was sent, stats say retries={stats.get('retries')}"


# -- callers refused by the stop at the worker are not counted cancelled -------------------


def test_send_calls_refused_at_the_gate_by_stop_are_counted_cancelled(
    make_system: Any, key_of: Any, read_receipts: Any
) -> None:
    sent: list[int] = []

    def fn(input: Any, ctx: Any) -> Any:
        sent.append(input["i"])
        return {"i": input["i"]}

    tool = Tool(tool_id="paced", fn=fn, pacing=Pacing(rps=50.0))
    system = make_system([tool], policy=Policy(batch_grace_s=0.0))
    assert system.proxy().execute("paced", {"i": 0}).get(timeout=WAIT_S).value == {"i": 0}
    gate = system.gates.get(ORG, "paced")
    gate.set_rate(0.2)
    assert system.proxy().execute("paced", {"i": 1}).get(timeout=WAIT_S).value == {"i": 1}
    waited = gate.waited_s
    future = system.proxy().execute("paced", {"i": 2})
    until(lambda: gate.waited_s > waited + 1.0, "the call to wait at its gate")
    system.stop(timeout_s=WAIT_S)
    assert isinstance(outcome(future, 0), CallCancelledError)
    assert sent == [0, 1]
    receipt = read_receipts([key_of(tool, {"i": 2})])[0]
    assert receipt is not None and receipt.status is ReceiptStatus.PENDING
    stats = system.stats()
    assert stats.get("cancelled", 0) == 1, f"1 call cancelled by the stop, stats say {stats.get('cancelled')}"


# -- senders withdrawn at the gate keep their booked turns (ghost bookings) ----------------


@pytest.mark.waits
def test_send_a_withdrawn_sender_gives_its_turn_at_the_gate_back(make_system: Any) -> None:
    sent: list[int] = []

    def fn(input: Any, ctx: Any) -> Any:
        sent.append(input["i"])
        return {"i": input["i"]}

    tool = Tool(tool_id="paced", fn=fn, pacing=Pacing(rps=50.0))
    system = make_system([tool], policy=Policy(batch_grace_s=0.0))
    assert system.proxy().execute("paced", {"i": 0}).get(timeout=WAIT_S).value == {"i": 0}
    gate = system.gates.get(ORG, "paced")
    gate.set_rate(0.2)  # one call in 5 s, as after a 429's cut
    assert system.proxy().execute("paced", {"i": 1}).get(timeout=WAIT_S).value == {"i": 1}
    waited = gate.waited_s
    waiting = system.proxy().execute_many("paced", [{"i": 10}, {"i": 11}, {"i": 12}])
    until(lambda: gate.waited_s > waited + 20.0, "three calls to book turns at the gate")
    for future in waiting:
        future.cancel()
    assert all(isinstance(outcome(f), CallCancelledError) for f in waiting)
    # the turns those three booked (5, 10, 15 s from now) are nobody's now
    fresh = outcome(system.proxy().execute("paced", {"i": 2}, timeout_s=8.0), timeout=12.0)
    assert not isinstance(fresh, Exception), (
        f"the first free turn is ~5 s away, within the call's 8 s; got {fresh!r} "
        f"(the gate is booked {gate.next_turn - time.monotonic():.0f} s ahead by withdrawn senders)"
    )


def test_send_a_caller_who_came_after_the_others_timed_out_is_served(make_system: Any) -> None:
    release = threading.Event()
    held = Batch(lambda n: release.wait(WAIT_S) if n == 1 else None)
    system = make_system([held.tool()], policy=Policy(batch_grace_s=0.05))
    first = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}], timeout_s=0.3)
    assert all(isinstance(outcome(f), ToolTimeoutError) for f in first)
    late = system.proxy().execute("lookup", {"i": 1}, timeout_s=10.0)  # joins the unit still held
    release.set()
    got = outcome(late)
    assert not isinstance(got, Exception), got
    assert got.execution == "live" and got.value == {"i": 1}
    assert system.proxy().execute("lookup", {"i": 1}).get(timeout=WAIT_S).execution == "cached"


def test_send_a_caller_who_came_after_every_cancel_gets_a_live_result(make_system: Any) -> None:
    held = Batch(lambda n: None)
    release = threading.Event()
    held.hold = lambda n: release.wait(WAIT_S) if n == 1 else None
    system = make_system([held.tool()], policy=Policy(batch_grace_s=0.05))
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    assert held.building.wait(WAIT_S)
    for future in futures:
        future.cancel()
    assert all(isinstance(outcome(f), CallCancelledError) for f in futures)
    again = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])  # before the worker reports
    release.set()
    assert [(r.execution, r.value) for r in map(outcome, again)] == [("live", {"i": 1}), ("live", {"i": 2})]
    assert held.sent == [(1, [1, 2])]


@pytest.mark.waits
def test_send_a_batch_whose_leases_lapsed_before_it_was_sent_goes_once_whole_from_the_run_that_took_it(
    make_system: Any, db_path: Any
) -> None:
    """r1's request of 1, 2, 3 is recorded (it may go at any moment), then its leases
    lapse. r2, asked for 1 and 2, takes the whole recorded request (3 too) and sends it,
    exactly, under its key (issue 26); r1 then finds every lease taken and sends nothing:
    nothing is paid twice."""
    release = threading.Event()
    mine = Batch(lambda n: release.wait(WAIT_S) if n == 1 else None, retry_safe=True)
    theirs = Batch(lambda n: None, retry_safe=True)
    policy = Policy(batch_grace_s=0.05, lease_ttl_s=1.0, timeout_s=30.0)
    store = _BusyRenewals(db_path)
    try:
        r1 = make_system([mine.tool()], run_id="r1", policy=policy, store=store)
        futures = r1.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}, {"i": 3}])
        assert mine.building.wait(WAIT_S)
        threading.Event().wait(0.4)  # its leases are registered with the heartbeat
        _Hiccup.on.set()  # renewals fail for a while: the leases lapse
        threading.Event().wait(1.5)
        r2 = make_system([theirs.tool()], run_id="r2", policy=policy)
        got = [outcome(f) for f in r2.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])]
        assert [g.execution for g in got] == ["live", "live"], got
        _Hiccup.on.clear()  # r1's next renewal finds the leases of 1 and 2 taken
        until(lambda: futures[0].done and futures[1].done, "r1's callers of 1 and 2 to hear of it")
        assert all(isinstance(outcome(f), LeaseLostError) for f in futures[:2])
        release.set()
        third = outcome(futures[2])
        threading.Event().wait(0.3)
        assert [(attempt, sorted(members)) for attempt, members in theirs.sent] == [(1, [1, 2, 3])]
        assert isinstance(third, LeaseLostError)  # r2 holds it now (and stored its output)
        paid_twice = sorted({i for _, members in mine.sent for i in members} & {1, 2, 3})
        assert paid_twice == [], (
            f"r1 sent {mine.sent} after losing the leases of 1 and 2 before the send: "
            f"{paid_twice} paid twice (r2 sent {theirs.sent}); third: {third!r}"
        )
    finally:
        release.set()
        _Hiccup.on.clear()
