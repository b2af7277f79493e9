"""The heartbeat actor with its renewer thread, on a real SQLite file.

What the split into an actor (registrations, lost leases, logs) and a native renewer
thread (the store writes) must keep: a lease found lost is reported to its owner, a
renewal that fails is retried before the lease lapses, counted and logged, and stopping
the actor ends the thread and closes its connection.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors import Policy
from actors.heartbeat.actor import HeartbeatActor
from actors.messages import RegisterLeases
from stores import ClaimRequest, SqliteReceiptStore
from stores.types import LeaseRef, Owner

from ..conftest import ORG, WAIT_S

OWNER = Owner("r1", 1)
LEASE_TTL_S = 0.6


def _claim(store: SqliteReceiptStore, key: str) -> LeaseRef:
    (claim,) = store.claim_many(ORG, [ClaimRequest(key, "enrich", "t", "h")], OWNER, lease_ttl_s=LEASE_TTL_S)
    return LeaseRef(key, claim.receipt.lease_id)


def _register(ref: Any, lease: LeaseRef, **extra: Any) -> None:
    ref.tell(
        RegisterLeases(
            token=1, org_id=ORG, owner=OWNER, leases=(lease,), lease_ttl_s=LEASE_TTL_S,
            deadline=float("inf"), **extra,
        )
    )  # fmt: skip


def _until(check: Callable[[], bool]) -> None:
    """Wait (bounded, yielding) until ``check()``; fails after WAIT_S."""
    end = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < end, "not reached in time"
        time.sleep(0.01)


def test_heartbeat_reports_a_lease_found_lost_to_its_owner(db_path: Path) -> None:
    store = SqliteReceiptStore(db_path)
    lease = _claim(store, "k1")
    lost = threading.Event()
    told: list[tuple[str, ...]] = []
    ref = HeartbeatActor.start(store, Policy().heartbeat_for)
    try:
        _register(ref, lease, lost=lost, on_lost=told.append)
        store.release(ORG, [lease], OWNER)  # the lease is gone: the next renewal is refused
        assert lost.wait(WAIT_S)
        _until(lambda: bool(told))
        proxy = ref.proxy()
        lost_keys = proxy.lost_keys().get(timeout=WAIT_S)
    finally:
        ref.stop(timeout=WAIT_S)
        store.close()
    assert told == [("k1",)]
    assert lost_keys == ["k1"]


def test_heartbeat_retries_a_failed_renewal_before_the_lease_lapses(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another connection holds the write lock until a renewal failed (busy): failures
    are counted and logged, and a retry lands once the lock is gone, before the lease
    lapses (retries come every quarter interval)."""
    store = SqliteReceiptStore(db_path, busy_timeout_s=0.02)
    lease = _claim(store, "k1")
    lost = threading.Event()
    blocker = sqlite3.connect(str(db_path), isolation_level=None, check_same_thread=False)
    ref = HeartbeatActor.start(store, Policy().heartbeat_for)
    caplog.set_level(logging.WARNING, logger="tooldispatch")
    try:
        _register(ref, lease, lost=lost)
        renewer = ref.proxy().renewer.get(timeout=WAIT_S)
        _until(lambda: renewer.leases.renewals >= 1)
        blocker.execute("BEGIN IMMEDIATE")
        _until(lambda: renewer.failures >= 1)  # the next renewal finds the file locked
        blocker.execute("ROLLBACK")
        failed_at_release = renewer.failures
        renewed_at_release = renewer.leases.renewals
        _until(lambda: renewer.leases.renewals > renewed_at_release)
        read_at = time.time()
        (receipt,) = store.get_many(ORG, ["k1"])
        _until(lambda: "lease renewal of 1 receipts failed" in caplog.text)
    finally:
        blocker.close()
        ref.stop(timeout=WAIT_S)
        store.close()
    assert failed_at_release >= 1
    assert not lost.is_set()
    assert receipt is not None and receipt.lease_id == lease.lease_id
    assert receipt.lease_expires_at is not None and receipt.lease_expires_at > read_at  # renewed, live


def test_heartbeat_stop_ends_the_renewer_thread_and_closes_its_connection(db_path: Path) -> None:
    store = SqliteReceiptStore(db_path)
    lease = _claim(store, "k1")
    ref = HeartbeatActor.start(store, Policy().heartbeat_for)
    _register(ref, lease)
    renewer = ref.proxy().renewer.get(timeout=WAIT_S)
    _until(lambda: renewer.leases.renewals >= 1)  # the thread opened its own connection
    assert _open_fds(db_path) == 2  # the test's store and the renewer's
    ref.stop(timeout=WAIT_S)
    assert renewer.running is False
    renewer.register(
        RegisterLeases(
            token=2, org_id=ORG, owner=OWNER, leases=(lease,), lease_ttl_s=LEASE_TTL_S,
            deadline=float("inf"),
        )
    )  # fmt: skip
    assert renewer.leases.entries == {}  # a registration after stop is ignored
    assert renewer.running is False
    store.close()
    assert _open_fds(db_path) == 0  # the renewer's own connection is closed too


def _open_fds(path: Path) -> int:
    """File descriptors of this process open on ``path`` (Linux /proc)."""
    target = str(path.resolve())
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue
    return count


def test_heartbeat_renews_an_in_memory_store_through_the_store_itself() -> None:
    """``:memory:`` is one database per connection: the renewer shares the store's
    (its work then runs inline on the renewer's thread, under the store's lock)."""
    store = SqliteReceiptStore(":memory:")
    assert store.renewal_handle() is store
    lease = _claim(store, "k1")
    (before,) = store.get_many(ORG, ["k1"])
    ref = HeartbeatActor.start(store, Policy().heartbeat_for)
    try:
        _register(ref, lease)
        renewer = ref.proxy().renewer.get(timeout=WAIT_S)
        _until(lambda: renewer.leases.renewals >= 2)
    finally:
        ref.stop(timeout=WAIT_S)
    (after,) = store.get_many(ORG, ["k1"])
    store.close()
    assert before is not None and after is not None
    assert after.lease_expires_at is not None and before.lease_expires_at is not None
    assert after.lease_expires_at > before.lease_expires_at
    assert renewer.running is False
