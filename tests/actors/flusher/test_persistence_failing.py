"""Receipt persistence failing for real: the completion ladder gives up, the latch trips,
outputs are salvaged and replayed; a failure whose recording fails trips the latch too.

No mocks: the store is a real SQLite file opened with a tiny busy timeout, and a plain
sqlite3 connection holds ``BEGIN EXCLUSIVE`` on it while the tool runs, so every write
the dispatcher attempts fails with "database is locked" (reads still work in WAL mode).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from actors import (
    DispatchSystem,
    Pacing,
    PersistenceCircuitOpenError,
    Policy,
    ReceiptPersistenceError,
    RunInfo,
    SalvageLog,
    Tool,
)
from stores import SqliteReceiptStore
from stores.types import ReceiptStatus

LADDER_S = (0.01, 0.02, 0.03)
BUSY_TIMEOUT_S = 0.05
WAIT_S = 15.0


class WriteLock:
    """An exclusive write lock on a SQLite file, held by a plain sqlite3 connection."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=5.0, check_same_thread=False)
        self.held = False

    def take(self) -> None:
        self.conn.execute("BEGIN EXCLUSIVE")
        self.held = True

    def release(self) -> None:
        if self.held:
            self.conn.execute("ROLLBACK")
            self.held = False

    def close(self) -> None:
        self.release()
        self.conn.close()


class LockingTool:
    """A tool that, once running, waits until the test has locked the store, then
    returns (or raises). Counts its provider calls."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises = raises
        self.started = threading.Event()
        self.locked = threading.Event()
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, inp: Any, ctx: Any) -> Any:
        with self._lock:
            self.calls += 1
        self.started.set()
        assert self.locked.wait(WAIT_S), "the test never locked the store"
        if self.raises is not None:
            raise self.raises
        return {"echo": inp, "paid": True}


@contextmanager
def locked_during_call(db: str, tool: LockingTool) -> Iterator[WriteLock]:
    """Take the write lock once the tool runs (after mark-running); release on exit."""
    lock = WriteLock(db)
    try:
        assert tool.started.wait(WAIT_S), "the tool never started"
        lock.take()
        tool.locked.set()
        yield lock
    finally:
        tool.locked.set()
        lock.close()


def _shut(*systems: DispatchSystem) -> None:
    """Stop each system, then close its store (a system never closes its store)."""
    for system in systems:
        system.stop()
        system.store.close()


def _statuses(db: str) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT status, count(*) FROM receipts GROUP BY status").fetchall())
    finally:
        conn.close()


def _system(db: str, tool: LockingTool, salvage_path: str, run_id: str = "r1") -> DispatchSystem:
    return DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=tool)],
        store=SqliteReceiptStore(db, busy_timeout_s=BUSY_TIMEOUT_S),
        run=RunInfo(run_id=run_id, org_id="acme", scope="persistence"),
        policy=Policy(completion_ladder_s=LADDER_S, salvage_path=salvage_path),
    )


def test_completion_past_ladder_salvages_trips_latch_and_replays(tmp_path: Path) -> None:
    db = str(tmp_path / "receipts.db")
    salvage_path = str(tmp_path / "salvage.jsonl")
    tool = LockingTool()
    before = time.time()
    system = _system(db, tool, salvage_path)
    reader = SqliteReceiptStore(db)  # opened before the lock: opening writes
    try:
        future = system.proxy().execute("enrich", {"row": 1})
        with locked_during_call(db, tool) as lock:
            result = future.get(timeout=WAIT_S)

            # The caller still gets what was paid for.
            assert result.value == {"echo": {"row": 1}, "paid": True}
            assert result.execution == "live"
            stats = system.stats()
            assert stats["latch_tripped"] is True
            assert stats["salvaged"] == 1

            # The salvage file holds it, with enough to find and replay it.
            (entry,) = SalvageLog(salvage_path).entries()
            assert entry.receipt_key == result.receipt_key
            assert entry.tool_id == "enrich"
            assert entry.output == {"echo": {"row": 1}, "paid": True}
            assert entry.completion_attempts >= len(LADDER_S) + 1
            assert before <= entry.first_error_at <= time.time()
            assert "locked" in entry.error

            # Nothing reached the store.
            (stored,) = reader.get_many("acme", [result.receipt_key])
            assert stored.status is ReceiptStatus.RUNNING
            assert (
                entry.generation == stored.generation and entry.replaces is None
            )  # a first run replaces nothing
            lock.release()

        # The store works again, but the latch stays tripped: a call that would start a
        # provider call is refused and counted, and its receipt is not left claimed.
        refused_future = system.proxy().execute("enrich", {"row": 2})
        with pytest.raises(PersistenceCircuitOpenError):
            refused_future.get(timeout=WAIT_S)
        stats = system.stats()
        assert tool.calls == 1
        assert stats["provider_calls"] == 1
        assert stats["refused_by_latch"] == 1
        assert stats["latch_refused"] == 1

        report = system.replay_salvage()
    finally:
        _shut(system)

    assert report.completed == 1
    assert report.kept == 0
    assert SalvageLog(salvage_path).entries() == []
    (stored,) = reader.get_many("acme", [result.receipt_key])
    assert stored.status is ReceiptStatus.COMPLETED
    assert stored.output == {"echo": {"row": 1}, "paid": True}
    # The refused call's claim was given back, not left queued.
    assert _statuses(db) == {"completed": 1, "pending": 1}
    reader.close()

    # A fresh system finds the replayed receipt: no provider call.
    fresh_tool = LockingTool()
    fresh_tool.locked.set()
    fresh = _system(db, fresh_tool, str(tmp_path / "fresh-salvage.jsonl"), run_id="r2")
    try:
        again = fresh.proxy().execute("enrich", {"row": 1}).get(timeout=WAIT_S)
        fresh_stats = fresh.stats()
    finally:
        _shut(fresh)
    assert again.execution == "cached"
    assert again.value == {"echo": {"row": 1}, "paid": True}
    assert fresh_tool.calls == 0
    assert fresh_stats["provider_calls"] == 0


def test_failure_recording_failure_raises_persistence_error_with_cause(tmp_path: Path) -> None:
    db = str(tmp_path / "receipts.db")
    boom = ValueError("provider said no")
    tool = LockingTool(raises=boom)
    system = _system(db, tool, str(tmp_path / "salvage.jsonl"))
    try:
        future = system.proxy().execute("enrich", {"row": 1})
        with locked_during_call(db, tool):
            with pytest.raises(ReceiptPersistenceError) as caught:
                future.get(timeout=WAIT_S)
            stats = system.stats()
    finally:
        _shut(system)

    assert caught.value.cause is boom
    assert "provider said no" in str(caught.value)
    assert stats["latch_tripped"] is True
    assert tool.calls == 1


class CountingStore(SqliteReceiptStore):
    """The real SQLite store, counting its ``complete_many`` calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completes = 0

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        self.completes += 1
        return super().complete_many(*args, **kwargs)


def test_completion_first_write_by_the_lifecycle_counts_as_the_ladders_first_attempt(tmp_path: Path) -> None:
    """A tool queue actor writes its outputs itself (the happy path); when that write
    fails, the flusher's ladder goes on from it instead of starting over: one write per
    rung plus the read-back's, as when the flusher made the first write."""
    db = str(tmp_path / "receipts.db")
    salvage_path = str(tmp_path / "salvage.jsonl")
    tool = LockingTool()
    store = CountingStore(db, busy_timeout_s=BUSY_TIMEOUT_S)
    system = DispatchSystem.start(
        tools=[Tool(tool_id="enrich", fn=tool)],
        store=store,
        run=RunInfo(run_id="r1", org_id="acme", scope="persistence"),
        policy=Policy(completion_ladder_s=LADDER_S, salvage_path=salvage_path),
    )
    try:
        future = system.proxy().execute("enrich", {"row": 1})
        with locked_during_call(db, tool):
            result = future.get(timeout=WAIT_S)
            assert system.stats()["latch_tripped"] is True
    finally:
        _shut(system)
    assert result.value == {"echo": {"row": 1}, "paid": True}
    (entry,) = SalvageLog(salvage_path).entries()
    # the first write, one per rung of the ladder, then the read-back's write of a
    # receipt still ours and running
    assert store.completes == 1 + len(LADDER_S) + 1
    assert entry.completion_attempts == store.completes


class SlowCompletes(CountingStore):
    """Each ``complete_many`` takes 50 ms (a remote database's round trip and commit)."""

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return super().complete_many(*args, **kwargs)


def test_completion_outputs_that_come_back_while_a_write_is_out_share_the_next(tmp_path: Path) -> None:
    """Outputs that come back while a write is out are gathered into the next one (group
    commit): 64 unbatched calls coming back 2 ms apart against 50 ms writes are stored
    in a few transactions, not one each (one each cut fresh calls on Postgres 5x)."""
    calls = 64

    def fn(input: Any, ctx: Any) -> Any:
        time.sleep(0.002 * input["i"])
        return input

    store = SlowCompletes(str(tmp_path / "receipts.db"), busy_timeout_s=BUSY_TIMEOUT_S)
    system = DispatchSystem.start(
        tools=[Tool(tool_id="api", fn=fn, pacing=Pacing(max_concurrency=calls))],
        store=store,
        run=RunInfo(run_id="r1", org_id="acme", scope="persistence"),
        policy=Policy(max_concurrency=calls, batch_grace_s=0.01),
    )
    try:
        futures = system.proxy().execute_many("api", [{"i": i} for i in range(calls)])
        assert [f.get(timeout=WAIT_S).value for f in futures] == [{"i": i} for i in range(calls)]
    finally:
        _shut(system)
    assert store.completes <= calls // 4
