"""Leases a failed store write left this process holding are given back (actors/lifecycle/cleanup.py).

A claim that committed and then raised, or a release that raised, used to leave the
receipt ``queued`` under this process's lease until its TTL: every later call of that
key, here or in another worker, waited the lease out. Real SQLite files; both runtimes.
The lease TTL is two minutes, so only a released lease explains a prompt answer.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
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


@pytest.mark.scenario
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


# -- the same on Postgres: a claim whose connection is killed after it committed ------------

PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema of this test's own on the test Postgres, dropped after (skip without a
    server; fail in CI)."""
    try:
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=3).close()
    except Exception as exc:  # ImportError or psycopg.Error
        if os.environ.get("CI"):
            pytest.fail(f"Postgres unavailable in CI: {exc}", pytrace=False)
        pytest.skip(f"needs PostgreSQL at {PG_URL} (TOOLDISPATCH_TEST_PG): {exc}")
    schema = f"td_test_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_postgres_claim_killed_after_commit_leaves_no_lease_behind(
    make_system: Any, pg_schema: str
) -> None:
    import psycopg

    from stores import PostgresReceiptStore

    class KilledAfterCommit(PostgresReceiptStore):
        armed = False

        def claim_many(self, *args: Any, **kwargs: Any) -> Any:
            claims = super().claim_many(*args, **kwargs)
            if self.armed:
                self.armed = False
                raise psycopg.OperationalError("injected: server closed the connection unexpectedly")
            return claims

    runs: list[Any] = []
    store = KilledAfterCommit(PG_URL, schema=pg_schema)
    observer = PostgresReceiptStore(PG_URL, schema=pg_schema)
    try:
        system = make_system([_counting(runs)], policy=LONG_LEASE, store=store)  # type: ignore[arg-type]
        store.armed = True
        with pytest.raises(psycopg.OperationalError, match="closed the connection"):
            system.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S)
        end = time.monotonic() + WAIT_S
        rows = observer.query("SELECT status, lease_id FROM receipts")
        while rows and rows[0]["lease_id"] is not None and time.monotonic() < end:
            threading.Event().wait(0.1)
            rows = observer.query("SELECT status, lease_id FROM receipts")
        assert [(r["status"], r["lease_id"]) for r in rows] == [(ReceiptStatus.PENDING.value, None)]
        other = make_system([_counting(runs)], run_id="r2", policy=LONG_LEASE, store=observer)  # type: ignore[arg-type]
        assert other.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S).execution == "live"
        assert runs == [{"x": 1}]
    finally:
        for each in (store, observer):
            each.close()
