"""A stop whose bound runs out still answers every caller (defect 3's kind: never a future
that never resolves). pykka drops the told messages a stopped actor leaves unread, and
the lifecycle's requests travel as told messages with their reply slot inside: a store
or flusher that stopped with requests queued left those calls unanswered for good.
Real SQLite files; both runtimes."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from actors import Policy, Tool
from actors.tool import BatchStrategy
from stores import SqliteReceiptStore

WAIT_S = 15.0


class SlowClaims(SqliteReceiptStore):
    """A real store whose claims take a while (a busy database), so requests queue up."""

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        threading.Event().wait(0.2)
        return super().claim_many(*args, **kwargs)


class SlowWrites(SqliteReceiptStore):
    """A real store whose completions take a while, so outputs queue at the flusher."""

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        threading.Event().wait(0.3)
        return super().complete_many(*args, **kwargs)


def _outcomes(futures: list[Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    end = time.monotonic() + WAIT_S  # one bound for all: a caller never answered fails fast
    for future in futures:
        try:
            kind = type(future.get(timeout=max(0.0, end - time.monotonic()))).__name__
        except Exception as exc:
            kind = type(exc).__name__
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@pytest.mark.parametrize("store_class", [SlowClaims, SlowWrites], ids=["claims-queued", "writes-queued"])
def test_stop_past_its_bound_answers_every_caller(make_system: Any, db_path: Path, store_class: Any) -> None:
    store = store_class(db_path)
    try:
        tool = Tool(tool_id="api", fn=lambda i, c: i)
        system = make_system([tool], policy=Policy(batch_grace_s=0.0, max_concurrency=8), store=store)
        futures = []
        for n in range(40):  # one message each: a claim request each, queued at the store
            futures.append(system.proxy().execute("api", {"n": n}))
            threading.Event().wait(0.002)
        system.stop(timeout_s=0.2)  # runs out while requests wait at the store or flusher
        kinds = _outcomes(futures)
        assert "Timeout" not in kinds, f"callers never answered: {kinds}"
        # a paid result whose write the bound cut short is salvaged: ResultSalvagedError
        assert set(kinds) <= {"ToolResult", "CallCancelledError", "ResultSalvagedError"}, kinds
        assert sum(kinds.values()) == 40
    finally:
        store.close()


def test_stop_past_its_bound_keeps_every_paid_output_stored_or_salvaged(
    make_system: Any, db_path: Path
) -> None:
    runs: list[int] = []

    def fn(input: Any, ctx: Any) -> Any:
        runs.append(input["n"])
        return input

    store = SlowWrites(db_path)
    try:
        system = make_system([Tool(tool_id="api", fn=fn)], policy=Policy(batch_grace_s=0.0), store=store)
        futures = []
        for n in range(20):  # outputs arrive one by one and queue behind slow writes
            futures.append(system.proxy().execute("api", {"n": n}))
            threading.Event().wait(0.01)
        system.stop(timeout_s=0.2)
        kinds = _outcomes(futures)
        assert "Timeout" not in kinds, f"callers never answered: {kinds}"
        conn = sqlite3.connect(db_path)
        try:
            completed = {
                row[0] for row in conn.execute("SELECT output FROM receipts WHERE status = 'completed'")
            }
        finally:
            conn.close()
        kept = {orjson.loads(text)["n"] for text in completed}
        kept |= {entry.output["n"] for entry in system.salvage.entries()}
        assert set(runs) <= kept, f"paid and lost: {sorted(set(runs) - kept)}"
    finally:
        store.close()


def _salvaged_outputs(system: Any) -> list[Any]:
    return [entry.output for entry in system.salvage.entries()]


@pytest.mark.waits
def test_a_result_whose_write_waits_on_the_store_when_stop_runs_out_is_salvaged(
    make_system: Any, db_path: Path
) -> None:
    returned, release = threading.Event(), threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        release.wait(WAIT_S)
        returned.set()
        return {"answer": input["n"]}

    system = make_system([Tool(tool_id="api", fn=fn)], policy=Policy(batch_grace_s=0.0))
    future = system.proxy().execute("api", {"n": 7})
    blocker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        threading.Event().wait(0.3)  # claimed and running
        blocker.execute("BEGIN IMMEDIATE")  # another worker's long write holds the lock
        release.set()
        assert returned.wait(WAIT_S)
        threading.Event().wait(0.3)  # its write now waits on the lock
        system.stop(timeout_s=1.0)
        assert {"answer": 7} in _salvaged_outputs(system)  # on disk before stop returned
        assert _outcomes([future]).keys() <= {"ToolResult", "ResultSalvagedError"}
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def test_a_result_that_comes_back_after_stop_returned_is_salvaged(make_system: Any) -> None:
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    def slow(input: Any, ctx: Any) -> Any:
        started.set()
        release.wait(WAIT_S)
        return {"late": input["n"]}

    system = make_system([Tool(tool_id="api", fn=slow)], policy=Policy(batch_grace_s=0.0))
    future = system.proxy().execute("api", {"n": 3})
    assert started.wait(WAIT_S)
    system.stop(timeout_s=0.3)  # runs out: the tool is still running
    assert isinstance(_outcomes([future]), dict)
    release.set()
    end = time.monotonic() + WAIT_S
    while {"late": 3} not in _salvaged_outputs(system) and time.monotonic() < end:
        returned.wait(0.05)
    assert {"late": 3} in _salvaged_outputs(system), "a paid result came back after stop and was dropped"


class DownStore(SqliteReceiptStore):
    """Every completion write fails at once (the database went away); once ``hang`` is set,
    reads wait for it to clear (a read-back waiting out a connect timeout)."""

    hang = threading.Event()
    clear = threading.Event()

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("injected: the database went away")

    def get_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.hang.is_set():
            self.clear.wait(WAIT_S)
        return super().get_many(*args, **kwargs)


@pytest.mark.waits
def test_results_held_on_the_completion_ladder_are_salvaged_before_stop_returns(
    make_system: Any, db_path: Path
) -> None:
    """Results whose writes failed wait on the ladder (a 5 s back-off); the stop gives the
    ladder up, and its read-backs hang on the store: when the bound runs out, every paid
    result must be on disk before stop returns (the flusher's thread is a daemon stuck in
    the store; a host exits as soon as stop returns). Breaker: 4 of 20 were."""
    runs: list[int] = []
    store = DownStore(db_path)
    DownStore.hang.clear()
    DownStore.clear.clear()
    try:
        policy = Policy(batch_grace_s=0.0, completion_ladder_s=(5.0, 5.0), max_concurrency=16)
        system = make_system([Tool(tool_id="api", fn=lambda i, c: runs.append(i["n"]) or i)], policy=policy,
                             store=store)  # fmt: skip
        futures = [system.proxy().execute("api", {"n": n}) for n in range(12)]
        end = time.monotonic() + WAIT_S
        while len(runs) < 12 and time.monotonic() < end:
            threading.Event().wait(0.01)
        threading.Event().wait(0.3)  # their first writes failed: held on the ladder
        DownStore.hang.set()  # the stop's read-backs now wait on the store
        started = time.monotonic()
        system.stop(timeout_s=1.0)
        took = time.monotonic() - started
        kept = {entry.output["n"] for entry in system.salvage.entries()}  # on disk as stop returned
        assert set(runs) == set(range(12))
        assert set(runs) <= kept, f"paid and not on disk when stop returned: {sorted(set(runs) - kept)}"
        assert took < 5.0, f"stop took {took:.1f} s on a 1 s bound"
        assert "Timeout" not in _outcomes(futures)
        DownStore.clear.set()  # the store answers again: the flusher gets past its wait and stops
        end = time.monotonic() + WAIT_S
        flusher = system.ports.flusher
        while flusher.is_alive() and time.monotonic() < end:
            threading.Event().wait(0.05)
        assert not flusher.is_alive(), "the flusher never stopped (its stop was taken from its inbox)"
    finally:
        DownStore.clear.set()
        store.close()


@pytest.mark.parametrize("members", [1, 10, 25], ids=["chunks-of-1", "chunks-of-10", "chunks-of-25"])
@pytest.mark.waits
def test_a_batch_written_in_many_chunks_while_the_store_is_locked_is_salvaged_whole(
    make_system: Any, db_path: Path, members: int
) -> None:
    """One batch's 50 results are written in chunks (``completion_max_members``) while
    another process holds the file's write lock, and stop's bound runs out: every chunk
    must be salvaged, not only the one being written. The flusher let go of the buffered
    request before its chunks were registered, so chunks 2..k were invisible to stop's
    salvage (breaker: a 600-member batch, 100 lost)."""
    entered, release = threading.Event(), threading.Event()
    sent: list[int] = []

    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        entered.set()
        release.wait(WAIT_S)
        sent.extend(item["n"] for item in payload)
        return [{"n": item["n"]} for item in payload]

    tool = Tool(tool_id="t", fn=lambda i, c: batch_fn([i], c)[0],
                batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=50))  # fmt: skip
    policy = Policy(batch_grace_s=0.3, completion_max_members=members)
    system = make_system([tool], policy=policy)
    futures = system.proxy().execute_many("t", [{"n": n} for n in range(50)])
    blocker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        assert entered.wait(WAIT_S)  # claimed and sent: the batch is in the provider's hands
        blocker.execute("BEGIN IMMEDIATE")  # another worker's long write holds the lock
        release.set()
        end = time.monotonic() + WAIT_S
        while len(sent) < 50 and time.monotonic() < end:
            threading.Event().wait(0.01)
        threading.Event().wait(0.3)  # its writes now wait on the lock
        system.stop(timeout_s=1.0)
        kept = {output["n"] for output in _salvaged_outputs(system)}  # on disk before stop returned
        assert "Timeout" not in _outcomes(futures)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    conn = sqlite3.connect(db_path)
    try:
        stored = {
            orjson.loads(o)["n"]
            for (o,) in conn.execute("SELECT output FROM receipts WHERE status = 'completed'")
        }
    finally:
        conn.close()
    assert sorted(sent) == list(range(50))
    assert set(sent) <= kept | stored, f"paid and lost: {sorted(set(sent) - kept - stored)}"


def test_stop_from_a_futures_done_callback_keeps_every_paid_result(make_system: Any, db_path: Path) -> None:
    """ "Stop on the first result": a done callback runs on the thread that resolved the
    future, a tool queue actor's. Its stop waited on that very actor for its whole bound,
    and the results that came back meanwhile were never read: 4 of 5 paid results lost
    (breaker round 4). It now goes on on a thread of its own; a later stop() waits for it."""
    paid: list[str] = []
    lock = threading.Lock()

    def fn(input: Any, ctx: Any) -> Any:
        threading.Event().wait(0.05 if input["k"] == "first" else 0.4)
        with lock:
            paid.append(input["k"])
        return {"k": input["k"]}

    system = make_system([Tool(tool_id="paid", fn=fn, timeout_s=10.0)],
                         policy=Policy(batch_grace_s=0.01, max_concurrency=8))  # fmt: skip
    futures = system.proxy().execute_many("paid", [{"k": "first"}] + [{"k": f"r{i}"} for i in range(4)])
    took: list[float] = []

    def stop_now(future: Any) -> None:
        started = time.monotonic()
        system.stop(timeout_s=3.0)
        took.append(time.monotonic() - started)

    futures[0].add_done_callback(stop_now)
    _outcomes(futures)
    system.stop(timeout_s=WAIT_S)  # the host's own: waits for the one under way
    assert took and took[0] < 1.0, took  # the callback did not wait on its own actor
    conn = sqlite3.connect(db_path)
    try:
        stored = {
            orjson.loads(o)["k"]
            for (o,) in conn.execute("SELECT output FROM receipts WHERE status = 'completed'")
        }
    finally:
        conn.close()
    kept = stored | {output["k"] for output in _salvaged_outputs(system)}
    assert len(paid) == 5
    assert set(paid) <= kept, f"paid and lost: {sorted(set(paid) - kept)}"
