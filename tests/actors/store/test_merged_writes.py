"""Fenced writes of one kind waiting together go as one store call (``actors.store.merge``);
each request is answered with its own share of the report, in its own order.

Plain objects for the merging rules; a real Postgres store for the lanes, held busy so
the writes wait together.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from actors.messages import (
    ClaimReceipts,
    CompleteReceipts,
    FencedWrite,
    MarkRunning,
    ReadReceipts,
    ReleaseReceipts,
)
from actors.store.actor import Lanes, ReceiptStoreActor
from actors.store.merge import Merged, mergeable
from stores import (
    ClaimRequest,
    Completion,
    FenceReport,
    LeaseRef,
    Owner,
    PostgresReceiptStore,
    ReceiptStatus,
    Refusal,
    RefusalReason,
)

from ..calls.test_lease_cleanup import PG_URL, pg_schema
from ..conftest import WAIT_S
from ..conftest import RecordedReply as _Reply

__all__ = ["pg_schema"]

ORG = "org-m"
ME = Owner("run-m", 1)


def _claimed(store: Any, n: int) -> tuple[list[str], list[LeaseRef]]:
    keys = [f"{i:064x}" for i in range(n)]
    claims = store.claim_many(ORG, [ClaimRequest(k, "play", "tool", k) for k in keys], ME, lease_ttl_s=60.0)
    return keys, [LeaseRef(k, c.receipt.lease_id or "") for k, c in zip(keys, claims, strict=True)]


def _call(kind: type[FencedWrite], keys: list[str], owner: Owner = ME, **kwargs: Any) -> Any:
    items = [LeaseRef(k, f"l-{k}") for k in keys]
    field = "completions" if kind is CompleteReceipts else "leases"
    return kind(org_id=ORG, owner=owner, reply=_Reply(), **{field: items}, **kwargs)


def test_merge_same_kind_disjoint_keys_go_as_one_call_each_answered_its_share() -> None:
    a, b = _call(MarkRunning, ["k1", "k2"]), _call(MarkRunning, ["k3"])
    c = _call(ReleaseReceipts, ["k4"])
    merged = Merged(a)
    assert not merged.takes(c)  # another kind: a call of its own
    assert merged.takes(b)
    assert [i.key for i in merged.items] == ["k1", "k2", "k3"]
    refused = {"k2": Refusal(RefusalReason.LEASE_LOST, "taken")}
    merged.answer(FenceReport(("k3", "k1"), refused), None)
    assert (a.reply.value.applied, a.reply.value.refused) == (("k1",), refused)
    assert (b.reply.value.applied, b.reply.value.refused) == (("k3",), {})
    assert [i.key for i in a.leases] == ["k1", "k2"]  # the request's own list is untouched


def test_merge_never_joins_overlapping_keys_other_owners_or_options() -> None:
    calls = [
        _call(MarkRunning, ["k1"]),
        _call(MarkRunning, ["k1"]),  # the same key again: a request of its own
        _call(MarkRunning, ["k2"], owner=Owner("run-other", 1)),
        _call(MarkRunning, ["k3"], lease_ttl_s=5.0),
        _call(MarkRunning, ["k4", "k4"]),  # a key twice in one request
    ]
    for i, call in enumerate(calls):
        merged = Merged(call)
        assert not any(merged.takes(other) for other in calls[i + 1 :])


def test_merge_an_error_is_every_merged_requests_error() -> None:
    a, b = _call(CompleteReceipts, ["k1"]), _call(CompleteReceipts, ["k2"])
    one = Merged(a)
    assert one.takes(b)
    boom = ConnectionError("server closed the connection")
    one.answer(None, boom)
    assert a.reply.error is boom and b.reply.error is boom


def test_lanes_merge_waiting_writes_and_answer_each(pg_schema: str) -> None:
    held = {"hold-1": threading.Event(), "hold-2": threading.Event()}
    release = {"hold-1": threading.Event(), "hold-2": threading.Event()}
    seen: list[tuple[str, int]] = []

    class Held(PostgresReceiptStore):
        def get_many(self, org_id: str, keys: Any) -> Any:
            if keys[0] in held:  # holds one lane until the test lets it go
                held[keys[0]].set()
                assert release[keys[0]].wait(WAIT_S)
                return [None]
            return super().get_many(org_id, keys)

        def mark_running_many(self, org_id: str, leases: Any, owner: Any, **kw: Any) -> Any:
            seen.append(("mark_running_many", len(leases)))
            return super().mark_running_many(org_id, leases, owner, **kw)

    store = Held(PG_URL, schema=pg_schema, max_size=4)  # two lanes
    try:
        keys, leases = _claimed(store, 5)
        ref = ReceiptStoreActor.start(store)
        try:
            assert len(ref.proxy().lanes.get(timeout=WAIT_S).threads) == 2
            for hold in held:  # both lanes busy
                ref.tell(ReadReceipts(org_id=ORG, keys=[hold], reply=_Reply()))
                assert held[hold].wait(WAIT_S)
            stolen = LeaseRef(keys[2], "stolen")
            completion = Completion(keys[4], leases[4].lease_id, {"n": 4})
            calls: list[Any] = [
                MarkRunning(org_id=ORG, leases=[leases[0], leases[1]], owner=ME, reply=_Reply()),
                MarkRunning(org_id=ORG, leases=[stolen], owner=ME, reply=_Reply()),
                MarkRunning(org_id=ORG, leases=[leases[3]], owner=ME, reply=_Reply()),
                CompleteReceipts(org_id=ORG, completions=[completion], owner=ME, reply=_Reply()),
            ]
            for call in calls:
                ref.tell(call)
            time.sleep(0.1)  # all queued behind the held calls
            release["hold-1"].set()  # one lane takes them all
            for call in calls:
                assert call.reply.done.wait(WAIT_S)
            release["hold-2"].set()
            for call in calls:
                assert call.reply.done.wait(WAIT_S)
                assert call.reply.error is None
            assert seen == [("mark_running_many", 4)]  # three requests, one statement
            assert calls[0].reply.value.applied == (keys[0], keys[1])
            assert calls[1].reply.value.applied == () and keys[2] in calls[1].reply.value.refused
            assert calls[2].reply.value.applied == (keys[3],)
            assert calls[3].reply.value.applied == (keys[4],)
            statuses = [r.status for r in store.get_many(ORG, keys)]
            assert statuses == [ReceiptStatus.RUNNING, ReceiptStatus.RUNNING, ReceiptStatus.QUEUED,
                                ReceiptStatus.RUNNING, ReceiptStatus.COMPLETED]  # fmt: skip
        finally:
            ref.stop()
    finally:
        store.close()


def test_mergeable_only_lists_naming_distinct_keys() -> None:
    def call(items: Any) -> ReleaseReceipts:
        return ReleaseReceipts(org_id=ORG, leases=items, owner=ME, reply=_Reply())

    assert mergeable(call([LeaseRef("k1", "l1"), LeaseRef("k2", "l2")]))
    assert not mergeable(call(None))
    assert not mergeable(call(LeaseRef(k, "l") for k in ("k1", "k2")))  # a generator
    assert not mergeable(call([LeaseRef("k1", "l1"), LeaseRef("k1", "l2")]))
    assert not mergeable(call([{"key": "k1"}]))
    assert not mergeable(ReadReceipts(org_id=ORG, keys=[], reply=_Reply()))  # not a fenced write
    assert not mergeable(ClaimReceipts(org_id=ORG, requests=[], owner=ME, lease_ttl_s=1.0, reply=_Reply()))


def test_a_lane_takes_only_what_merges_with_its_call() -> None:
    class Recording:
        def __init__(self) -> None:
            self.calls: list[tuple[str, list[str]]] = []

        def mark_running_many(self, org_id: str, leases: Any, owner: Any, **kw: Any) -> FenceReport:
            self.calls.append(("mark_running_many", [lease.key for lease in leases]))
            return FenceReport(tuple(lease.key for lease in leases))

    store = Recording()
    lanes = Lanes(store, 0)  # type: ignore[arg-type]  # no threads: the test runs the lane
    first = _call(MarkRunning, ["k1"], lease_ttl_s=1.0)
    waiting = [
        _call(MarkRunning, ["k2"], lease_ttl_s=2.0),  # another tool's lease: no merge
        _call(MarkRunning, ["k3"], lease_ttl_s=1.0),
        _call(MarkRunning, ["k4"], lease_ttl_s=1.0),
    ]
    for call in waiting:
        lanes.inbox.put(call)
    assert lanes.run_merged(first)
    assert store.calls == [("mark_running_many", ["k1"]), ("mark_running_many", ["k2"])]
    assert lanes.inbox.qsize() == 2  # the rest wait for whichever lane is free first
    assert first.reply.value.applied == ("k1",) and waiting[0].reply.value.applied == ("k2",)


def test_lanes_a_request_with_odd_items_gets_its_own_error_and_the_lanes_go_on(pg_schema: str) -> None:
    store = PostgresReceiptStore(PG_URL, schema=pg_schema, max_size=4)
    try:
        keys, leases = _claimed(store, 2)
        ref = ReceiptStoreActor.start(store)
        try:
            calls = [
                ReleaseReceipts(org_id=ORG, leases=None, owner=ME, reply=_Reply()),
                MarkRunning(org_id=ORG, leases=[leases[0]], owner=ME, reply=_Reply()),
                MarkRunning(org_id=ORG, leases=(x for x in [leases[1]]), owner=ME, reply=_Reply()),
            ]  # fmt: skip
            for _ in range(3):  # more than there are lanes: each must still be alive
                for call in calls:
                    call.reply.done.clear()
                    ref.tell(call)
                for call in calls:
                    assert call.reply.done.wait(WAIT_S)
            assert calls[0].reply.error is not None  # release of None: its own error
            assert calls[1].reply.error is None and calls[1].reply.value.applied == (keys[0],)
            statuses = [r.status for r in store.get_many(ORG, keys)]
            assert statuses[0] is ReceiptStatus.RUNNING
        finally:
            ref.stop()
    finally:
        store.close()
