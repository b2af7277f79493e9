"""The last checks before a request leaves hold until it leaves (issue 8, items 3 and 10).

A call is checked (the latch, a stop, its callers still wanting it) when its tool queue
hands it to the worker pool, and again on the worker right before the tool function or
the batch operation is called: between the two the worker may wait for its turn at the
provider's send gate (pacing, a Retry-After pause) or build a batch's payload. Whatever
happens there (the latch trips, the system stops, every caller cancels) sends nothing:
the callers get the refusal, the receipts go back to pending and the slot is free.

The windows are held open for real: a batch whose ``build`` waits until the event has
happened, a provider pause that keeps the sender at its gate. Each test fails when the
worker does not look again (the calls were sent after the trip, the stop, the cancel).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import pytest

from actors import (
    BatchStrategy,
    CallCancelledError,
    Pacing,
    PersistenceCircuitOpenError,
    Policy,
    Tool,
    ToolTimeoutError,
)
from stores import ReceiptStatus, SqliteReceiptStore

from ..conftest import ORG, WAIT_S, outcome, until


class FailingWrites(SqliteReceiptStore):
    """Completion writes fail while ``broken`` (the latch trips after the ladder)."""

    broken = True

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            raise sqlite3.OperationalError("injected: disk I/O error")
        return super().complete_many(*args, **kwargs)


class HeldBuild:
    """A batch strategy whose ``build`` waits (on the worker) until ``until()`` is true."""

    def __init__(self) -> None:
        self.building = threading.Event()
        self.until: Any = lambda: False
        self.timed_out = False
        self.sent: list[Any] = []
        self.lock = threading.Lock()

    def build(self, inputs: list[Any]) -> Any:
        self.building.set()
        until(lambda: self.until(), "the event the build waits for")
        return list(inputs)

    def batch_fn(self, payload: Any, ctx: Any) -> Any:
        with self.lock:
            self.sent.append(payload)
        return [{"i": item["i"], "ok": True} for item in payload]

    def single(self, input: Any, ctx: Any) -> Any:
        with self.lock:
            self.sent.append([input])
        return {"i": input["i"], "ok": True}

    def tool(self) -> Tool:
        return Tool(
            tool_id="lookup",
            fn=self.single,
            batch=BatchStrategy(batch_fn=self.batch_fn, max_batch_size=10, build=self.build),
        )


def _writer(input: Any, ctx: Any) -> Any:
    return {"written": input["x"]}


def test_send_latch_tripped_while_a_batch_payload_is_built_sends_nothing(
    make_system: Any, db_path: Any, key_of: Any, read_receipts: Any
) -> None:
    held = HeldBuild()
    store = FailingWrites(db_path)
    try:
        policy = Policy(batch_grace_s=0.05, completion_ladder_s=(0.01,))
        system = make_system([held.tool(), Tool(tool_id="writer", fn=_writer)], policy=policy, store=store)
        held.until = lambda: system.latch.tripped
        futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
        assert held.building.wait(WAIT_S), "the batch was never built"
        # another tool's output cannot be written: the flusher gives up and trips the latch
        writer = system.proxy().execute("writer", {"x": 1})
        assert writer.get(timeout=WAIT_S).value == {"written": 1}  # delivered, and salvaged
        outcomes = [outcome(f) for f in futures]
        assert held.sent == [], "the batch went out after the latch tripped"
        assert all(isinstance(o, PersistenceCircuitOpenError) for o in outcomes), outcomes
        assert system.stats()["refused_by_latch"] == 2
        keys = [key_of(held.tool(), {"i": i}) for i in (1, 2)]
        until(
            lambda: all(r is not None and r.status is ReceiptStatus.PENDING for r in read_receipts(keys)),
            "the receipts to be given back",
        )
    finally:
        store.close()


def test_send_stop_while_a_batch_payload_is_built_sends_nothing(
    make_system: Any, key_of: Any, read_receipts: Any
) -> None:
    held = HeldBuild()
    system = make_system([held.tool()])
    held.until = lambda: system.stopped
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    assert held.building.wait(WAIT_S), "the batch was never built"
    started = time.monotonic()
    system.stop(timeout_s=WAIT_S)
    assert time.monotonic() - started < WAIT_S / 2
    outcomes = [outcome(f, timeout=0) for f in futures]
    assert held.sent == [], "the batch went out after the system began to stop"
    assert all(isinstance(o, CallCancelledError) for o in outcomes), outcomes
    receipts = read_receipts([key_of(held.tool(), {"i": i}) for i in (1, 2)])
    assert [r.status if r else None for r in receipts] == [ReceiptStatus.PENDING] * 2


def test_send_cancel_while_a_batch_payload_is_built_sends_nothing(
    make_system: Any, key_of: Any, read_receipts: Any
) -> None:
    held = HeldBuild()
    system = make_system([held.tool()])
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    # the build goes on once every caller of the batch is answered (or after 3 s)
    held.until = lambda: all(f.done for f in futures) or held.timed_out
    assert held.building.wait(WAIT_S), "the batch was never built"
    for future in futures:
        future.cancel()
    timer = threading.Timer(3.0, lambda: setattr(held, "timed_out", True))
    timer.start()
    try:
        outcomes = [outcome(f) for f in futures]
    finally:
        timer.cancel()
    assert all(isinstance(o, CallCancelledError) for o in outcomes), outcomes
    until(lambda: system.stats().get("cancelled", 0) == 2, "the cancels to be counted")
    assert held.sent == [], "the batch went out after every caller cancelled"
    keys = [key_of(held.tool(), {"i": i}) for i in (1, 2)]
    until(
        lambda: all(r is not None and r.status is ReceiptStatus.PENDING for r in read_receipts(keys)),
        "the receipts to be given back",
    )
    # and the same calls made again run (nothing was left held)
    again = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    assert [f.get(timeout=WAIT_S).execution for f in again] == ["live", "live"]


def test_send_deadline_passed_while_a_batch_payload_is_built_sends_nothing(
    make_system: Any, key_of: Any, read_receipts: Any
) -> None:
    held = HeldBuild()
    system = make_system([held.tool()])
    futures = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}], timeout_s=0.3)
    held.until = lambda: all(f.done for f in futures)  # both callers timed out
    outcomes = [outcome(f) for f in futures]
    assert all(isinstance(o, ToolTimeoutError) for o in outcomes), outcomes
    keys = [key_of(held.tool(), {"i": i}) for i in (1, 2)]
    until(
        lambda: all(r is not None and r.status is ReceiptStatus.PENDING for r in read_receipts(keys)),
        "the receipts to be given back",
    )
    assert held.sent == [], "the batch went out after its deadline"
    held.until = lambda: True
    again = system.proxy().execute_many("lookup", [{"i": 1}, {"i": 2}])
    assert [f.get(timeout=WAIT_S).execution for f in again] == ["live", "live"]


# -- a sender held at its gate ----------------------------------------------------------------


class GateHold:
    """A paced tool whose second call waits at the send gate (the rate was cut meanwhile)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.lock = threading.Lock()

    def fn(self, input: Any, ctx: Any) -> Any:
        with self.lock:
            self.sent.append(input)
        return {"i": input["i"]}

    def tool(self) -> Tool:
        return Tool(tool_id="paced", fn=self.fn, pacing=Pacing(rps=50.0))


def _held_at_gate(system: Any) -> Any:
    """The rate is cut to one call in 5 s (as the governor does after a 429): a first call
    goes at once, the next waits at its gate for its turn. Returns the waiting call's future."""
    assert system.proxy().execute("paced", {"i": 0}).get(timeout=WAIT_S).value == {"i": 0}
    gate = system.gates.get(ORG, "paced")
    gate.set_rate(0.2)
    assert system.proxy().execute("paced", {"i": 1}).get(timeout=WAIT_S).value == {"i": 1}
    waited = gate.waited_s
    future = system.proxy().execute("paced", {"i": 2})
    until(lambda: gate.waited_s > waited + 1.0, "the third call to wait at its gate")
    return future


@pytest.mark.parametrize("event", ["latch", "stop", "cancel"])
def test_send_held_at_the_gate_then_refused_sends_nothing(
    make_system: Any, db_path: Any, key_of: Any, read_receipts: Any, event: str
) -> None:
    hold = GateHold()
    store = FailingWrites(db_path)
    store.broken = False
    try:
        policy = Policy(batch_grace_s=0.0, completion_ladder_s=(0.01,))
        system = make_system([hold.tool(), Tool(tool_id="writer", fn=_writer)], policy=policy, store=store)
        future = _held_at_gate(system)
        started = time.monotonic()
        if event == "latch":
            store.broken = True  # another tool's output cannot be written: the latch trips
            system.proxy().execute("writer", {"x": 1}).get(timeout=WAIT_S)
            expected: type[BaseException] = PersistenceCircuitOpenError
        elif event == "stop":
            system.stop(timeout_s=WAIT_S)
            expected = CallCancelledError
        else:
            future.cancel()
            expected = CallCancelledError
        got = outcome(future)
        took = time.monotonic() - started
        assert hold.sent == [{"i": 0}, {"i": 1}], f"a call held at its gate went out after the {event}"
        assert isinstance(got, expected), got
        assert took < 4.0, f"answered {took:.1f} s after the {event}: when its turn came"
        if event != "stop":
            key = key_of(hold.tool(), {"i": 2})
            until(
                lambda: (r := read_receipts([key])[0]) is not None and r.status is ReceiptStatus.PENDING,
                "the receipt to be given back",
            )
    finally:
        store.close()
