"""Group commit of the SQLite store (``write_together``): several fenced writes, one
transaction, each call answered as if it had run alone.

Real SQLite files; a trigger added to the file through a connection of the test's own
makes one statement fail (``RAISE(ABORT)``: that statement alone) or end the whole
transaction (``RAISE(ROLLBACK)``), and a second connection holding the write lock makes
the transaction unable to start.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from stores import (
    ClaimRequest,
    Completion,
    FenceReport,
    LeaseRef,
    Owner,
    ReceiptStatus,
    SqliteReceiptStore,
    StoreError,
)
from stores.base import FENCED_WRITES

ORG = "org-t"
ME = Owner("run-t", 1)


def _key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _claimed(store: SqliteReceiptStore, *names: str) -> dict[str, LeaseRef]:
    keys = [_key(n) for n in names]
    claims = store.claim_many(ORG, [ClaimRequest(k, "play", "tool", k) for k in keys], ME, lease_ttl_s=60.0)
    return {n: LeaseRef(k, c.receipt.lease_id or "") for n, k, c in zip(names, keys, claims, strict=True)}


def _status(store: SqliteReceiptStore, name: str) -> ReceiptStatus:
    (receipt,) = store.get_many(ORG, [_key(name)])
    assert receipt is not None
    return receipt.status


def _edit(store: SqliteReceiptStore, statement: str) -> None:
    """Run ``statement`` on the store's file through a connection of the test's own."""
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as conn:
        conn.execute(statement)


def _trigger(store: SqliteReceiptStore, name: str, action: str) -> None:
    _edit(
        store,
        f"CREATE TRIGGER boom BEFORE UPDATE ON receipts WHEN old.key = '{_key(name)}' "
        f"BEGIN SELECT RAISE({action}, 'boom'); END",
    )


def test_write_together_answers_each_call_as_if_alone(tmp_path: Path) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        leases = _claimed(store, "a", "b", "c")
        stranger = LeaseRef(leases["b"].key, "not-the-lease")
        outcomes = store.write_together(
            [
                ("mark_running_many", (ORG, [leases["a"]], ME), {}),
                ("complete_many", (ORG, [Completion(stranger.key, stranger.lease_id, {"x": 1})], ME), {}),
                ("release", (ORG, [leases["c"]], ME), {}),
            ]
        )
        assert [error for _, error in outcomes] == [None, None, None]
        running, completed, released = (value for value, _ in outcomes)
        assert isinstance(running, FenceReport) and running.applied == (leases["a"].key,)
        assert completed.applied == () and stranger.key in completed.refused  # not our lease
        assert released.applied == (leases["c"].key,)
        assert [_status(store, n) for n in "abc"] == [
            ReceiptStatus.RUNNING,
            ReceiptStatus.QUEUED,
            ReceiptStatus.PENDING,
        ]


def test_write_together_one_calls_error_fails_that_call_alone(tmp_path: Path) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        leases = _claimed(store, "a", "b", "c")
        _trigger(store, "b", "ABORT")
        outcomes = store.write_together(
            [
                ("mark_running_many", (ORG, [leases["a"]], ME), {}),
                ("mark_running_many", (ORG, [leases["b"]], ME), {}),
                (
                    "complete_many",
                    (ORG, [Completion(leases["c"].key, leases["c"].lease_id, {"ok": 1})], ME),
                    {},
                ),
            ]
        )
        assert outcomes[0][1] is None and outcomes[2][1] is None
        assert isinstance(outcomes[1][1], StoreError) and "boom" in str(outcomes[1][1])
        assert [_status(store, n) for n in "abc"] == [
            ReceiptStatus.RUNNING,
            ReceiptStatus.QUEUED,
            ReceiptStatus.COMPLETED,
        ]
        # the store goes on as usual afterwards
        _edit(store, "DROP TRIGGER boom")
        assert store.mark_running_many(ORG, [leases["b"]], ME).applied == (leases["b"].key,)


def test_write_together_a_transaction_rolled_back_fails_every_call(tmp_path: Path) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        leases = _claimed(store, "a", "b", "c")
        _trigger(store, "b", "ROLLBACK")  # ends the whole transaction, "a" included
        outcomes = store.write_together([("mark_running_many", (ORG, [leases[n]], ME), {}) for n in "abc"])
        assert all(value is None and isinstance(error, StoreError) for value, error in outcomes)
        assert [_status(store, n) for n in "abc"] == [ReceiptStatus.QUEUED] * 3  # none took effect


def test_write_together_that_cannot_start_fails_every_call_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with SqliteReceiptStore(path, busy_timeout_s=0.2) as store:
        leases = _claimed(store, "a", "b")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            outcomes = store.write_together([("mark_running_many", (ORG, [leases[n]], ME), {}) for n in "ab"])
            other.execute("ROLLBACK")
        finally:
            other.close()
        assert all(isinstance(error, StoreError) and "locked" in str(error) for _, error in outcomes)
        assert [_status(store, n) for n in "ab"] == [ReceiptStatus.QUEUED] * 2


def test_write_together_takes_fenced_writes_only(tmp_path: Path) -> None:
    with SqliteReceiptStore(tmp_path / "r.db") as store:
        leases = _claimed(store, "a")
        with pytest.raises(ValueError, match="claim_many"):
            store.write_together(
                [
                    ("mark_running_many", (ORG, [leases["a"]], ME), {}),
                    ("claim_many", (ORG, [], ME), {"lease_ttl_s": 1.0}),
                ]
            )
        assert _status(store, "a") is ReceiptStatus.QUEUED  # nothing ran
        assert "claim_many" not in FENCED_WRITES


class _WaitsFirst(SqliteReceiptStore):
    """A subclass whose fenced write waits a moment first, as a busy database or a
    subclass adding a delay would (a patched ``Event.wait`` under gevent)."""

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        threading.Event().wait(0.01)
        return super().complete_many(*args, **kwargs)


def test_write_together_runs_a_subclass_that_waits_without_deadlocking(tmp_path: Path) -> None:
    # under gevent the group runs on a pool thread; the subclass's wait gives that thread
    # a hub, and the write inside it must still run there, not wait on another pool thread
    with _WaitsFirst(tmp_path / "r.db") as store:
        leases = _claimed(store, "a", "b")
        done: list[Any] = []
        worker = threading.Thread(
            target=lambda: done.append(
                store.write_together(
                    [
                        (
                            "complete_many",
                            (ORG, [Completion(leases[n].key, leases[n].lease_id, {"n": n})], ME),
                            {},
                        )
                        for n in "ab"
                    ]
                )
            ),
            daemon=True,
        )
        worker.start()
        worker.join(10.0)
        assert done, "write_together deadlocked"
        assert [error for _, error in done[0]] == [None, None]
        assert [_status(store, n) for n in "ab"] == [ReceiptStatus.COMPLETED] * 2
