"""A SQLite write that fails reports its own error and leaves the store usable.

SQLite may end a transaction by itself (a full disk, an I/O error, a ``RAISE(ROLLBACK)``
trigger): a ROLLBACK after that would fail with "cannot rollback - no transaction is
active" and hide the real error. A COMMIT may fail with the transaction still open (a
deferred constraint): without a ROLLBACK every later write would fail with "cannot start
a transaction within a transaction". Real files; triggers and tables added through a
connection of the test's own make those happen, with what only a connection itself can
set (foreign keys enforced, a ROLLBACK that fails) given to the store's connection by
the class ``sqlite3.connect`` makes it of while the store opens.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from pathlib import Path
from typing import Any, TypeVar

import pytest

from stores import ClaimRequest, LeaseRef, Owner, ReceiptStatus, SqliteReceiptStore, StoreError

ORG = "org-e"
ME = Owner("run-e", 1)


def _claimed(store: SqliteReceiptStore, *names: str) -> list[LeaseRef]:
    keys = [hashlib.sha256(n.encode()).hexdigest() for n in names]
    claims = store.claim_many(ORG, [ClaimRequest(k, "play", "tool", k) for k in keys], ME, lease_ttl_s=60.0)
    return [LeaseRef(k, c.receipt.lease_id or "") for k, c in zip(keys, claims, strict=True)]


def _edit(store: SqliteReceiptStore, *statements: str) -> None:
    """Run ``statements`` on the store's file through a connection of the test's own."""
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as conn:
        for statement in statements:
            conn.execute(statement)


C = TypeVar("C", bound=sqlite3.Connection)


def _opened_with(
    path: Path, monkeypatch: pytest.MonkeyPatch, factory: type[C]
) -> tuple[SqliteReceiptStore, C]:
    """A store on ``path`` whose connection ``sqlite3.connect`` makes as a ``factory``
    (connections opened later, a reconnect's, are plain), and that connection."""
    opened: list[C] = []
    connect = sqlite3.connect

    def connect_as(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, factory=factory, **kwargs)
        opened.append(conn)
        return conn

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect_as)
        store = SqliteReceiptStore(path)
    (conn,) = opened
    return store, conn


def _rolled_back_by_sqlite(store: SqliteReceiptStore, key: str) -> None:
    _edit(
        store,
        f"CREATE TRIGGER boom BEFORE UPDATE ON receipts WHEN old.key = '{key}' "
        "BEGIN SELECT RAISE(ROLLBACK, 'boom: the transaction is gone'); END",
    )


class _ForeignKeysOn(sqlite3.Connection):
    """A connection that enforces foreign keys (a setting of each connection)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA foreign_keys = ON")


def _commit_fails(store: SqliteReceiptStore, key: str) -> None:
    """A deferred foreign key broken by the write: SQLite refuses the COMMIT and keeps the
    transaction open (the store's connection is a :class:`_ForeignKeysOn`)."""
    _edit(
        store,
        "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
        "CREATE TABLE child (ref INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
        f"CREATE TRIGGER orphan AFTER UPDATE ON receipts WHEN old.key = '{key}' "
        "BEGIN INSERT INTO child (ref) VALUES (42); END",
    )


def _undo(store: SqliteReceiptStore) -> None:
    _edit(store, "DROP TRIGGER IF EXISTS boom", "DROP TRIGGER IF EXISTS orphan")


def test_a_write_sqlite_rolled_back_reports_its_own_error(tmp_path: Path) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        a, b = _claimed(store, "a", "b")
        _rolled_back_by_sqlite(store, a.key)
        with pytest.raises(StoreError, match="boom: the transaction is gone"):
            store.mark_running_many(ORG, [a], ME)
        _undo(store)
        assert store.mark_running_many(ORG, [a, b], ME).applied == (a.key, b.key)


@pytest.mark.parametrize("together", [False, True], ids=["alone", "together"])
def test_a_failed_commit_is_rolled_back_and_the_next_write_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    store, _ = _opened_with(tmp_path / "r.db", monkeypatch, _ForeignKeysOn)
    with store:
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


class _RollbackFails(sqlite3.Connection):
    """A connection whose ROLLBACK (and ROLLBACK TO) fail once ``armed``."""

    armed = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self.armed and sql.startswith("ROLLBACK"):
            raise sqlite3.OperationalError("disk I/O error (during rollback)")
        return super().execute(sql, *args)


def _fails_midway(store: SqliteReceiptStore, key: str) -> None:
    """RAISE(FAIL) keeps the rows the statement changed before it: only a rollback undoes them."""
    _edit(
        store,
        f"CREATE TRIGGER boom BEFORE UPDATE ON receipts WHEN old.key = '{key}' "
        "BEGIN SELECT RAISE(FAIL, 'boom'); END",
    )


@pytest.mark.parametrize("together", [False, True], ids=["alone", "together"])
def test_a_rollback_that_fails_never_commits_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    store, conn = _opened_with(tmp_path / "r.db", monkeypatch, _RollbackFails)
    with store:
        first, second, other = _claimed(store, "a", "b", "c")
        _fails_midway(store, max(first.key, second.key))  # the later row of the statement
        conn.armed = True
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
        with pytest.raises(sqlite3.ProgrammingError):  # closed (its transaction discarded), reopened
            conn.execute("SELECT 1")
        keys = [first.key, second.key, other.key]
        assert [r.status for r in store.get_many(ORG, keys)] == [ReceiptStatus.QUEUED] * 3  # nothing kept
        _undo(store)
        assert store.mark_running_many(ORG, [first, second, other], ME).applied == tuple(
            k for k in keys
        )  # the next write goes, on the connection opened again
