"""A claim of settled receipts is answered by a plain read (issue 8: a cold rerun).

Receipts that are completed (reused), failed (normal mode) or uncertain need no write:
the store answers them from a read without taking its write lock, and claims only the
rest. Shown with another connection holding the write lock: a rerun of completed keys
answers at once on both backends; a key that needs a lease still waits for the lock.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stores import (
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    Owner,
    SqliteReceiptStore,
    StoreError,
)

ORG = "org-a"
OWNER = Owner("run-a")
BOUND_S = 10.0
"""Generous bound for "does not wait for the lock" (a blocked claim never returns)."""


def _requests(keys: list[str]) -> list[ClaimRequest]:
    return [ClaimRequest(k, "play", "tool", "h") for k in keys]


def _settle(store: Any) -> None:
    """k-done completed, k-fail failed (permanent)."""
    claims = store.claim_many(ORG, _requests(["k-done", "k-fail"]), OWNER, lease_ttl_s=60)
    done, failed = (c.receipt for c in claims)
    store.complete_many(ORG, [Completion("k-done", done.lease_id, {"n": 1})], OWNER)
    store.fail_many(ORG, [Failure("k-fail", failed.lease_id, "no", FailureKind.PERMANENT)], OWNER)


def _claim_in_thread(store: Any, keys: list[str], mode: ClaimMode = ClaimMode.NORMAL) -> tuple[Any, Any]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["claims"] = store.claim_many(ORG, _requests(keys), Owner("run-b"), lease_ttl_s=60, mode=mode)
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_sqlite_rerun_claim_does_not_take_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "receipts.db"
    store = SqliteReceiptStore(path, busy_timeout_s=0.2)
    try:
        _settle(store)
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # another process's write transaction
        try:
            claims = store.claim_many(ORG, _requests(["k-done", "k-fail"]), OWNER, lease_ttl_s=60)
            assert [c.disposition for c in claims] == [ClaimDisposition.REUSED, ClaimDisposition.FAILED]
            assert claims[0].receipt.output == {"n": 1}
            with pytest.raises(StoreError, match="locked"):  # a miss needs the lock
                store.claim_many(ORG, _requests(["k-done", "k-new"]), OWNER, lease_ttl_s=60)
            with pytest.raises(StoreError, match="locked"):  # a forced refresh writes
                store.claim_many(
                    ORG, _requests(["k-done"]), OWNER, lease_ttl_s=60, mode=ClaimMode.FORCE_REFRESH
                )
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        claims = store.claim_many(
            ORG, _requests(["k-fail", "k-done", "k-new"]), OWNER, lease_ttl_s=60, mode=ClaimMode.RETRY_FAILED
        )
        assert [c.disposition for c in claims] == [
            ClaimDisposition.CLAIMED, ClaimDisposition.REUSED, ClaimDisposition.CLAIMED,
        ]  # fmt: skip
        assert claims[0].receipt.attempts == 2
    finally:
        store.close()


def test_postgres_rerun_claim_does_not_wait_for_a_table_writer(pg_url: str, pg_schema: str) -> None:
    import psycopg

    import stores

    store = stores.PostgresReceiptStore(pg_url, schema=pg_schema, max_size=3)
    try:
        _settle(store)
        with psycopg.connect(pg_url) as locker:  # blocks writes, not reads
            locker.execute(f'LOCK TABLE "{pg_schema}".receipts IN EXCLUSIVE MODE')
            thread, out = _claim_in_thread(store, ["k-done", "k-fail"])
            thread.join(BOUND_S)
            assert not thread.is_alive(), "a claim of settled receipts waited for the writer"
            assert [c.disposition for c in out["claims"]] == [
                ClaimDisposition.REUSED, ClaimDisposition.FAILED,
            ]  # fmt: skip
            waiting, got = _claim_in_thread(store, ["k-done", "k-new"])  # a miss writes: it waits
            waiting.join(0.2)
            assert waiting.is_alive() and not got
            locker.rollback()
        waiting.join(BOUND_S)
        assert [c.disposition for c in got["claims"]] == [ClaimDisposition.REUSED, ClaimDisposition.CLAIMED]
    finally:
        store.close()


def test_read_settled_and_read_reusable_answer_as_a_claim_would(store: Any, fake_clock: Any) -> None:
    _settle(store)  # k-done completed {"n": 1}, k-fail failed (permanent)
    held = store.claim_many(ORG, _requests(["k-held"]), OWNER, lease_ttl_s=60)[0].receipt
    keys = ["k-done", "k-fail", "k-held", "k-new"]
    answers, rest = store.read_settled(ORG, _requests(keys))
    assert {k: c.disposition for k, c in answers.items()} == {
        "k-done": ClaimDisposition.REUSED, "k-fail": ClaimDisposition.FAILED,
    }  # fmt: skip
    assert [r.key for r in rest] == ["k-held", "k-new"]  # a lease to judge, or nothing stored
    answers, rest = store.read_settled(ORG, _requests(keys), mode=ClaimMode.RETRY_FAILED)
    assert list(answers) == ["k-done"] and [r.key for r in rest] == ["k-fail", "k-held", "k-new"]
    answers, rest = store.read_settled(ORG, _requests(keys), mode=ClaimMode.FORCE_REFRESH)
    assert answers == {} and len(rest) == 4
    assert store.read_reusable(ORG, keys) == {"k-done": ("h", '{"n":1}', None)}
    fake_clock.advance(30)
    assert store.read_reusable(ORG, keys, stale_after_s=10) == {}  # the store's clock judges
    assert store.read_reusable(ORG, keys, stale_after_s=60) == {"k-done": ("h", '{"n":1}', None)}
    answers, rest = store.read_settled(ORG, _requests(["k-done"]), stale_after_s=10)
    assert answers == {} and [r.key for r in rest] == ["k-done"]
    assert store.read_reusable("org-b", keys) == {}  # never another org's
    # nothing was written: the held lease is as it was, the rest still absent
    assert store.get_many(ORG, ["k-held", "k-new"]) == [held, None]


def test_sqlite_plain_read_does_not_wait_behind_a_write_that_waits_for_the_lock(tmp_path: Path) -> None:
    """A caller's plain read (a cold rerun's, on the caller's thread) is answered from the
    last commit while the store's own write waits for the file's lock (another process's
    transaction): it never queues behind that write."""
    path = tmp_path / "receipts.db"
    store = SqliteReceiptStore(path, busy_timeout_s=BOUND_S)
    try:
        _settle(store)
        (claim,) = store.claim_many(ORG, _requests(["k-late"]), OWNER, lease_ttl_s=60)
        writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        writer.execute("BEGIN IMMEDIATE")  # another process's write transaction
        writing = threading.Thread(
            target=store.complete_many,
            args=(ORG, [Completion("k-late", claim.receipt.lease_id, {"n": 2})], OWNER),
            daemon=True,
        )
        try:
            writing.start()
            time.sleep(0.2)  # the store's write now waits for the lock
            assert writing.is_alive()
            started = time.monotonic()
            found = store.read_reusable(ORG, ["k-done", "k-late", "k-fail"])
            waited = time.monotonic() - started
            assert set(found) == {"k-done"}  # the last commit: k-late is still running
            assert waited < BOUND_S / 2, f"the read waited {waited:.1f} s behind the write"
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        writing.join(BOUND_S)
        assert set(store.read_reusable(ORG, ["k-done", "k-late"])) == {"k-done", "k-late"}
    finally:
        store.close()
