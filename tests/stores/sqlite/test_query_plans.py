"""Statements that name receipts by key find them by primary key, never by a scan.

SQLite has no statistics on a store's file (no ANALYZE), so a term such as
``status = 'completed'`` beside ``key IN (...)`` could lead its planner to the status index:
every completed receipt of the file read to answer one key (a lone call's read of a cold
rerun took 250 µs at 2,000 receipts and 5 ms at 30,000, against 8 µs by key). Every
statement the store runs for the keyed operations of the contract is captured here as
executed (its values bound) and its plan asked of SQLite itself.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stores import (
    BatchRecord,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Owner,
    SqliteReceiptStore,
)

ORG = "org-a"
OWNER = Owner("run-a")


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SqliteReceiptStore, list[str]]]:
    """A store on a file of 300 receipts (completed, failed, running) whose statements are
    recorded as SQLite executes them."""
    statements: list[str] = []
    connect: Callable[..., sqlite3.Connection] = sqlite3.connect

    def tracing(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", tracing)
    store = SqliteReceiptStore(tmp_path / "receipts.db")
    try:
        keys = [f"k{i:03d}" for i in range(300)]
        claims = store.claim_many(
            ORG, [ClaimRequest(k, "play", "tool", "h") for k in keys], OWNER, lease_ttl_s=60
        )
        leases = {c.receipt.key: c.receipt.lease_id for c in claims}
        store.complete_many(ORG, [Completion(k, leases[k], {"k": k}) for k in keys[:200]], OWNER)
        store.fail_many(
            ORG, [Failure(k, leases[k], "no", FailureKind.PERMANENT) for k in keys[200:250]], OWNER
        )
        statements.clear()
        yield store, statements
    finally:
        store.close()


def _plans(path: Path, statements: list[str]) -> dict[str, list[str]]:
    """Each statement that reads or changes receipts named through json_each, with SQLite's
    plan of it (an INSERT's conflict lookups are by primary key by construction)."""
    conn = sqlite3.connect(path)
    try:
        return {
            sql: [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
            for sql in statements
            if "json_each" in sql and "receipts" in sql and not sql.lstrip().upper().startswith("INSERT")
        }
    finally:
        conn.close()


def _by_key(plans: dict[str, list[str]]) -> None:
    assert plans, "no keyed statement was captured"
    for sql, plan in plans.items():
        on_receipts = [step for step in plan if " receipts" in f" {step}" and "json_each" not in step]
        assert on_receipts, (sql, plan)
        for step in on_receipts:
            assert "(org_id=? AND key=?)" in step, f"{' '.join(sql.split())[:160]}\n  plan: {plan}"


def test_a_cold_rerun_read_finds_each_key_by_primary_key(traced: Any, tmp_path: Path) -> None:
    store, statements = traced
    found = store.read_reusable(ORG, ["k001"])
    assert set(found) == {"k001"}
    assert len(store.read_reusable(ORG, [f"k{i:03d}" for i in range(0, 300, 7)])) == len(range(0, 200, 7))
    _by_key(_plans(tmp_path / "receipts.db", statements))


@pytest.mark.parametrize("mode", [ClaimMode.NORMAL, ClaimMode.RETRY_FAILED, ClaimMode.FORCE_REFRESH])
def test_claims_and_reads_find_each_key_by_primary_key(traced: Any, tmp_path: Path, mode: ClaimMode) -> None:
    store, statements = traced
    keys = ["k001", "k201", "k260", "new-1"]
    store.claim_many(
        ORG, [ClaimRequest(k, "play", "tool", "h") for k in keys], Owner("run-b"), lease_ttl_s=60, mode=mode
    )
    store.get_many(ORG, keys)
    _by_key(_plans(tmp_path / "receipts.db", statements))


def test_a_batch_request_recorded_and_taken_over_finds_each_key_by_primary_key(
    traced: Any, tmp_path: Path
) -> None:
    """The statements of batch records (issue 26): the mark that records a request, the
    claim that takes it over whole (its record and every member's row read)."""
    store, statements = traced
    keys = [f"b{i}" for i in range(3)]
    claims = store.claim_many(
        ORG, [ClaimRequest(k, "play", "tool", "h") for k in keys], OWNER, lease_ttl_s=-1.0
    )
    record = BatchRecord(key="batch-1", tool_id="tool", members=tuple(keys), inputs=("1", "2", "3"))
    leases = [LeaseRef(c.receipt.key, c.receipt.lease_id or "") for c in claims]
    assert store.mark_running_many(ORG, leases, OWNER, batches=[record]).ok  # leases run out: taken over
    (taken,) = store.claim_many(
        ORG, [ClaimRequest("b1", "play", "tool", "h")], Owner("run-b"), lease_ttl_s=60
    )
    assert taken.batch == record
    _by_key(_plans(tmp_path / "receipts.db", statements))
