"""The receipt store actor commits the fenced writes waiting in its inbox together.

A real SQLite file and a real store actor: its first call is held until the test has
queued more writes (and one other request behind them), so they wait together.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.messages import (
    CompleteReceipts,
    MarkRunning,
    ReadReceipts,
    RecordFailures,
    ReleaseReceipts,
    StoreCommand,
)
from actors.runtime.futures import new_future
from actors.store.actor import ReceiptStoreActor
from actors.store.client import StoreClient
from stores import ClaimRequest, Completion, LeaseRef, Owner, ReceiptStatus, SqliteReceiptStore

from ..conftest import WAIT_S
from ..conftest import RecordedReply as _Reply

ORG = "org-t"
ME = Owner("run-t", 1)


class _HeldStore(SqliteReceiptStore):
    """Holds its first ``get_many`` until released; counts group commits."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.release_first = threading.Event()
        self.groups: list[list[str]] = []

    def get_many(self, org_id: str, keys: Any) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release_first.wait(WAIT_S)
        return super().get_many(org_id, keys)

    def write_together(self, calls: Any) -> Any:
        self.groups.append([method for method, _, _ in calls])
        return super().write_together(calls)


def _key(n: int) -> str:
    return hashlib.sha256(f"k{n}".encode()).hexdigest()


@contextlib.contextmanager
def _held(store: _HeldStore, key: str) -> Iterator[Any]:
    """The store actor, its first call held (so the requests told next wait together);
    stopped and its store closed afterwards."""
    ref = ReceiptStoreActor.start(store)
    try:
        ref.tell(ReadReceipts(org_id=ORG, keys=[key], reply=_Reply()))
        assert store.entered.wait(WAIT_S)
        yield ref
    finally:
        ref.stop()
        store.close()


def _claimed(store: SqliteReceiptStore, n: int) -> tuple[list[str], list[LeaseRef]]:
    keys = [_key(i) for i in range(n)]
    claims = store.claim_many(ORG, [ClaimRequest(k, "play", "tool", k) for k in keys], ME, lease_ttl_s=60.0)
    return keys, [LeaseRef(k, c.receipt.lease_id or "") for k, c in zip(keys, claims, strict=True)]


def test_store_actor_commits_waiting_fenced_writes_together_and_answers_each(tmp_path: Path) -> None:
    store = _HeldStore(tmp_path / "r.db")
    keys, leases = _claimed(store, 6)
    ref = ReceiptStoreActor.start(store)
    try:
        holder = _Reply()
        ref.tell(ReadReceipts(org_id=ORG, keys=keys[:1], reply=holder))
        assert store.entered.wait(WAIT_S)
        # queued while the store is busy: marks, completions, a refused one, and a read behind them
        replies = [_Reply() for _ in range(4)]
        calls: list[StoreCommand] = [
            MarkRunning(org_id=ORG, leases=[leases[0], leases[1]], owner=ME, reply=replies[0]),
            CompleteReceipts(
                org_id=ORG, completions=[Completion(keys[2], leases[2].lease_id, {"n": 2})], owner=ME,
                reply=replies[1],
            ),
            ReleaseReceipts(
                org_id=ORG, leases=[LeaseRef(keys[3], "not-the-lease")], owner=ME, reply=replies[2]
            ),
            RecordFailures(org_id=ORG, failures=[], owner=ME, reply=replies[3]),
        ]  # fmt: skip
        for call in calls:
            ref.tell(call)
        read = new_future()  # an ask behind the writes: answered after them
        asked = ref.ask(ReadReceipts(org_id=ORG, keys=keys, reply=read), block=False)
        store.release_first.set()
        statuses = [r.status if r else None for r in read.get(timeout=WAIT_S)]
        assert asked.get(timeout=WAIT_S) is None
        for reply in replies:
            assert reply.done.wait(WAIT_S)
            assert reply.error is None
        assert store.groups == [
            ["mark_running_many", "complete_many", "release", "fail_many"]
        ]  # one transaction
        assert replies[0].value.applied == (keys[0], keys[1])
        assert replies[1].value.applied == (keys[2],)
        assert replies[2].value.applied == () and keys[3] in replies[2].value.refused
        assert statuses == [
            ReceiptStatus.RUNNING,
            ReceiptStatus.RUNNING,
            ReceiptStatus.COMPLETED,
            ReceiptStatus.QUEUED,
            ReceiptStatus.QUEUED,
            ReceiptStatus.QUEUED,
        ]
        assert ref.proxy().ops.get(timeout=WAIT_S) == 6  # every call counted (receipt_ops budget)
    finally:
        ref.stop()
        store.close()


def test_store_actor_a_failing_write_in_a_group_fails_only_its_own_caller(tmp_path: Path) -> None:
    store = _HeldStore(tmp_path / "r.db")
    keys, leases = _claimed(store, 3)
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as conn:  # the test's own
        conn.execute(
            f"CREATE TRIGGER boom BEFORE UPDATE ON receipts WHEN old.key = '{keys[1]}' "
            "BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
    with _held(store, keys[0]) as ref:
        replies = [_Reply() for _ in keys]
        for lease, reply in zip(leases, replies, strict=True):
            ref.tell(MarkRunning(org_id=ORG, leases=[lease], owner=ME, reply=reply))
        store.release_first.set()
        for reply in replies:
            assert reply.done.wait(WAIT_S)
        assert len(store.groups) == 1
        assert [r.error is None for r in replies] == [True, False, True]
        assert "boom" in str(replies[1].error)
        assert [r.value.applied for r in (replies[0], replies[2])] == [(keys[0],), (keys[2],)]


def test_store_actor_a_reply_that_raises_never_keeps_the_groups_other_replies_back(tmp_path: Path) -> None:
    class _Broken(_Reply):
        def set(self, value: Any = None) -> None:
            raise RuntimeError("this caller's reply slot is broken")

    store = _HeldStore(tmp_path / "r.db")
    keys, leases = _claimed(store, 3)
    with _held(store, keys[0]) as ref:
        replies = [_Broken(), _Reply(), _Reply()]
        for lease, reply in zip(leases, replies, strict=True):
            ref.tell(MarkRunning(org_id=ORG, leases=[lease], owner=ME, reply=reply))
        store.release_first.set()
        for reply in replies[1:]:
            assert reply.done.wait(WAIT_S)
        assert len(store.groups) == 1
        assert ref.is_alive()


def test_store_actor_a_write_with_odd_items_gets_its_own_error_and_the_others_go(tmp_path: Path) -> None:
    store = _HeldStore(tmp_path / "r.db")
    keys, leases = _claimed(store, 3)
    with _held(store, keys[0]) as ref:
        calls = [
            MarkRunning(org_id=ORG, leases=[leases[0]], owner=ME, reply=_Reply()),
            ReleaseReceipts(org_id=ORG, leases=None, owner=ME, reply=_Reply()),  # type: ignore[arg-type]
            MarkRunning(org_id=ORG, leases=[leases[1]], owner=ME, reply=_Reply()),
            MarkRunning(org_id=ORG, leases=(x for x in [leases[2]]), owner=ME, reply=_Reply()),  # type: ignore[arg-type]
        ]  # fmt: skip
        for call in calls:
            ref.tell(call)
        store.release_first.set()
        for call in calls:
            assert call.reply.done.wait(WAIT_S)
        assert calls[1].reply.error is not None
        assert [calls[0].reply.value.applied, calls[2].reply.value.applied] == [(keys[0],), (keys[1],)]
        assert ref.is_alive()
        assert StoreClient(ref).read(ORG, keys[:1]).get(timeout=WAIT_S)[0].status is ReceiptStatus.RUNNING
