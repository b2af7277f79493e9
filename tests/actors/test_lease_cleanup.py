"""Leases a failed store write left this process holding are given back (actors/_cleanup.py).

A claim that committed and then raised, or a release that raised, used to leave the
receipt ``queued`` under this process's lease until its TTL: every later call of that
key, here or in another worker, waited the lease out. Real SQLite files; both runtimes.
The lease TTL is two minutes, so only a released lease explains a prompt answer.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import Policy, SuspendedError, Tool
from stores import SqliteReceiptStore
from stores.types import ReceiptStatus

WAIT_S = 15.0
LONG_LEASE = Policy(batch_grace_s=0.01, lease_ttl_s=120.0, receipt_poll_max_s=0.2)


class CommitThenRaise(SqliteReceiptStore):
    """A real store whose next claim commits, then raises (a connection lost after COMMIT)."""

    armed = False

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        claims = super().claim_many(*args, **kwargs)
        if self.armed:
            self.armed = False
            raise sqlite3.OperationalError("injected: the connection dropped after COMMIT")
        return claims


class ReleaseFails(SqliteReceiptStore):
    """A real store whose next ``failures`` releases raise before touching the file."""

    failures = 0

    def release(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("injected: database is locked")
        return super().release(*args, **kwargs)


def _rows(db_path: Path) -> list[tuple[str, str | None]]:
    conn = sqlite3.connect(db_path)
    try:
        return list(conn.execute("SELECT status, lease_id FROM receipts"))
    finally:
        conn.close()


def _wait_released(db_path: Path) -> list[tuple[str, str | None]]:
    """The receipts once none is leased any more (bounded: a lapsed wait fails the test)."""
    end = time.monotonic() + WAIT_S
    rows = _rows(db_path)
    while any(lease is not None for _, lease in rows) and time.monotonic() < end:
        threading.Event().wait(0.1)
        rows = _rows(db_path)
    return rows


def _counting(runs: list[Any]) -> Tool:
    def fn(input: Any, ctx: Any) -> Any:
        runs.append(input)
        return {"ok": input["x"]}

    return Tool(tool_id="api", fn=fn)


@pytest.mark.parametrize("who", ["same system", "another worker"])
def test_a_claim_that_committed_then_raised_leaves_no_lease_behind(
    make_system: Any, db_path: Path, who: str
) -> None:
    runs: list[Any] = []
    store = CommitThenRaise(db_path)
    try:
        system = make_system([_counting(runs)], policy=LONG_LEASE, store=store)
        store.armed = True
        with pytest.raises(sqlite3.OperationalError, match="after COMMIT"):
            system.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S)
        assert _wait_released(db_path) == [(ReceiptStatus.PENDING.value, None)]
        again = (
            system if who == "same system" else make_system([_counting(runs)], run_id="r2", policy=LONG_LEASE)
        )
        result = again.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S)  # not after the 120 s lease
        assert (result.value, result.execution) == ({"ok": 1}, "live")
        assert runs == [{"x": 1}]
        assert system.stats()["orphan_leases_released"] == 1
    finally:
        store.close()


@pytest.mark.parametrize("failures", [1, 2])
def test_a_release_that_failed_is_retried_so_the_next_worker_does_not_wait_out_the_lease(
    make_system: Any, db_path: Path, failures: int
) -> None:
    def suspended(input: Any, ctx: Any) -> Any:
        raise SuspendedError("paused by the provider")

    store = ReleaseFails(db_path)
    try:
        system = make_system([Tool(tool_id="api", fn=suspended)], policy=LONG_LEASE, store=store)
        store.failures = failures
        with pytest.raises(SuspendedError):  # answered at once, not after the retries
            system.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S)
        assert _wait_released(db_path) == [(ReceiptStatus.PENDING.value, None)]
        runs: list[Any] = []
        other = make_system([_counting(runs)], run_id="r2", policy=LONG_LEASE)
        assert other.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S).value == {"ok": 1}
        assert system.stats()["lease_cleanup_failed"] == 0
    finally:
        store.close()
