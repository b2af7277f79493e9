"""A SQLite write that fails reports its own error and leaves the store usable.

SQLite may end a transaction by itself (a full disk, an I/O error, a ``RAISE(ROLLBACK)``
trigger): a ROLLBACK after that would fail with "cannot rollback - no transaction is
active" and hide the real error. A COMMIT may fail with the transaction still open (a
deferred constraint): without a ROLLBACK every later write would fail with "cannot start
a transaction within a transaction". Real files; triggers and a deferred foreign key on
the store's own connection make those happen.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stores import ClaimRequest, LeaseRef, Owner, ReceiptStatus, SqliteReceiptStore, StoreError

ORG = "org-e"
ME = Owner("run-e", 1)


def _claimed(store: SqliteReceiptStore, *names: str) -> list[LeaseRef]:
    keys = [hashlib.sha256(n.encode()).hexdigest() for n in names]
    claims = store.claim_many(ORG, [ClaimRequest(k, "play", "tool", k) for k in keys], ME, lease_ttl_s=60.0)
    return [LeaseRef(k, c.receipt.lease_id or "") for k, c in zip(keys, claims, strict=True)]


def _rolled_back_by_sqlite(store: SqliteReceiptStore, key: str) -> None:
    assert store._conn is not None
    store._conn.execute(
        f"CREATE TEMP TRIGGER boom BEFORE UPDATE ON receipts WHEN old.key = '{key}' "
        "BEGIN SELECT RAISE(ROLLBACK, 'boom: the transaction is gone'); END"
    )


def _commit_fails(store: SqliteReceiptStore, key: str) -> None:
    """A deferred foreign key broken by the write: SQLite refuses the COMMIT and keeps the
    transaction open."""
    conn = store._conn
    assert conn is not None
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TABLE child (ref INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
    conn.execute(
        f"CREATE TEMP TRIGGER orphan AFTER UPDATE ON receipts WHEN old.key = '{key}' "
        "BEGIN INSERT INTO child (ref) VALUES (42); END"
    )


def _undo(store: SqliteReceiptStore) -> None:
    assert store._conn is not None
    store._conn.execute("DROP TRIGGER IF EXISTS boom")
    store._conn.execute("DROP TRIGGER IF EXISTS orphan")


def test_a_write_sqlite_rolled_back_reports_its_own_error(tmp_path: Path) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        a, b = _claimed(store, "a", "b")
        _rolled_back_by_sqlite(store, a.key)
        with pytest.raises(StoreError, match="boom: the transaction is gone"):
            store.mark_running_many(ORG, [a], ME)
        _undo(store)
        assert store.mark_running_many(ORG, [a, b], ME).applied == (a.key, b.key)


@pytest.mark.parametrize("together", [False, True], ids=["alone", "together"])
def test_a_failed_commit_is_rolled_back_and_the_next_write_goes(tmp_path: Path, together: bool) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        a, b = _claimed(store, "a", "b")
        _commit_fails(store, a.key)
        if together:
            outcomes = store.write_together(
                [("mark_running_many", (ORG, [a], ME), {}), ("mark_running_many", (ORG, [b], ME), {})]
            )
            errors = [error for _, error in outcomes]
        else:
            with pytest.raises(StoreError) as raised:
                store.mark_running_many(ORG, [a], ME)
            errors = [raised.value]
        assert all(isinstance(e, StoreError) and "FOREIGN KEY" in str(e) for e in errors), errors
        assert [r.status for r in store.get_many(ORG, [a.key, b.key])] == [ReceiptStatus.QUEUED] * 2
        _undo(store)
        assert store.mark_running_many(ORG, [a, b], ME).applied == (a.key, b.key)


class _RollbackFails:
    """The store's connection, except that ROLLBACK (and ROLLBACK TO) fail."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("ROLLBACK"):
            raise sqlite3.OperationalError("disk I/O error (during rollback)")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _fails_midway(store: SqliteReceiptStore, key: str) -> None:
    """RAISE(FAIL) keeps the rows the statement changed before it: only a rollback undoes them."""
    assert store._conn is not None
    store._conn.execute(
        f"CREATE TEMP TRIGGER boom BEFORE UPDATE ON receipts WHEN old.key = '{key}' "
        "BEGIN SELECT RAISE(FAIL, 'boom'); END"
    )


@pytest.mark.parametrize("together", [False, True], ids=["alone", "together"])
def test_a_rollback_that_fails_never_commits_a_failed_write(tmp_path: Path, together: bool) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        first, second, other = _claimed(store, "a", "b", "c")
        _fails_midway(store, max(first.key, second.key))  # the later row of the statement
        store._conn = _RollbackFails(store._conn)  # type: ignore[assignment,arg-type]
        if together:
            outcomes = store.write_together(
                [
                    ("mark_running_many", (ORG, [other], ME), {}),
                    ("mark_running_many", (ORG, [first, second], ME), {}),
                ]
            )
            assert all(isinstance(error, StoreError) for _, error in outcomes), outcomes
        else:
            with pytest.raises(StoreError, match="boom"):
                store.mark_running_many(ORG, [first, second], ME)
        assert not isinstance(store._conn, _RollbackFails)  # closed (its transaction discarded), reopened
        keys = [first.key, second.key, other.key]
        assert [r.status for r in store.get_many(ORG, keys)] == [ReceiptStatus.QUEUED] * 3  # nothing kept
        assert store.mark_running_many(ORG, [first, second, other], ME).applied == tuple(
            k for k in keys
        )  # the next write goes (the trigger lived on the closed connection)
