"""The receipt store contract, batch requests (issue 26): what a batch request carried is
recorded with its members' running mark, before it is sent; a claim that takes over any
member takes the whole request, in the same transaction, or makes the members it could
take ``uncertain`` (every backend: conftest.BACKENDS).

Behaviour reference: ../shared/SEMANTICS.md (Execution: a key never changes between
attempts of one request) and stores/base.py (``mark_running_many``, ``claim_many``).
Time only moves when a test advances the store's FakeClock.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from typing import Any

import attrs
import psutil
import pytest

from stores import (
    BatchRecord,
    ClaimDisposition,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Owner,
    ReceiptStatus,
    ReceiptStore,
    RefusalReason,
    SqliteReceiptStore,
    current_process_identity,
)

from .conftest import (
    CLAIMED,
    ME,
    ORG,
    OTHER,
    TTL_S,
    F,
    N,
    R,
    claim,
    claim_one,
    get,
    key_of,
    lease_of,
    request_for,
)

THIRD = Owner("run-third", 1)
UNCERTAIN = ClaimDisposition.UNCERTAIN


def _record(keys: list[str], name: str = "batch") -> BatchRecord:
    return BatchRecord(
        key=key_of(name), tool_id="verify_email", members=tuple(keys),
        inputs=tuple(f'{{"email":"{k[:6]}@example.com"}}' for k in keys),
    )  # fmt: skip


def _sent(store: ReceiptStore, keys: list[str], owner: Owner = OTHER, name: str = "batch") -> BatchRecord:
    """``owner`` claims ``keys`` and marks them running as one batch request (recorded)."""
    record = _record(keys, name)
    leases = [lease_of(c) for c in claim(store, keys, owner)]
    report = store.mark_running_many(ORG, leases, owner, lease_ttl_s=TTL_S, batches=[record])
    assert report.ok
    for key in keys:
        receipt = get(store, key)
        assert receipt is not None and receipt.status is ReceiptStatus.RUNNING
        assert receipt.batch_key == record.key
    return record


def _stored_batch_keys(store: ReceiptStore, tmp_path: Any) -> set[str] | None:
    """The batch records the store keeps (None: a store this test cannot look into)."""
    if isinstance(store, SqliteReceiptStore):
        if store.path == ":memory:":
            return None
        with sqlite3.connect(store.path) as conn:
            return {row[0] for row in conn.execute("SELECT batch_key FROM batches")}
    return {row["batch_key"] for row in store.query("SELECT batch_key FROM batches")}  # type: ignore[attr-defined]


def test_capabilities_say_batch_records(store: ReceiptStore) -> None:
    assert store.capabilities.batch_records


def test_batch_record_refuses_a_member_named_twice_or_an_input_missing() -> None:
    with pytest.raises(ValueError, match="once"):
        BatchRecord(key="k", tool_id="t", members=("a", "a"), inputs=("1", "2"))
    with pytest.raises(ValueError, match="one input per member"):
        BatchRecord(key="k", tool_id="t", members=("a", "b"), inputs=("1",))


def test_takeover_of_one_member_takes_the_whole_request_in_its_order(
    store: ReceiptStore, fake_clock: Any
) -> None:
    keys = [key_of(f"m{i}") for i in range(4)]
    record = _sent(store, [keys[2], keys[0], keys[3], keys[1]])  # the request's own order
    fake_clock.advance(TTL_S + 1)  # the sender died: its leases ran out

    (answer,) = claim(store, [keys[0]], ME)

    assert answer.disposition is CLAIMED
    assert answer.batch == record
    assert [c.receipt.key for c in answer.members] == list(record.members)
    assert answer.receipt == next(c.receipt for c in answer.members if c.receipt.key == keys[0])
    for member in answer.members:
        assert member.disposition is CLAIMED
        receipt = member.receipt
        assert receipt.owner == ME and receipt.lease_expires_at == fake_clock() + TTL_S
        assert (receipt.generation, receipt.batch_key, receipt.attempts) == (1, record.key, 2)
        assert get(store, receipt.key) == receipt
    # the members not asked for are held: nobody else takes them, nor the request again
    for key in keys[1:]:
        assert claim_one(store, key, OTHER).disposition is ClaimDisposition.RUNNING
    # and they are written like any claim: marked running, completed under their leases
    leases = [lease_of(c) for c in answer.members]
    assert store.mark_running_many(ORG, leases, ME, lease_ttl_s=TTL_S).ok
    completions = [Completion(lease.key, lease.lease_id, {"n": i}) for i, lease in enumerate(leases)]
    assert store.complete_many(ORG, completions, ME).ok


def test_members_asked_together_are_answered_with_the_same_request(
    store: ReceiptStore, fake_clock: Any
) -> None:
    keys = [key_of(f"t{i}") for i in range(3)]
    record = _sent(store, keys)
    fake_clock.advance(TTL_S + 1)
    loose = key_of("loose")

    answers = claim(store, [keys[1], loose, keys[0], keys[1]], ME)

    assert [a.disposition for a in answers] == [CLAIMED] * 4
    assert answers[0] == answers[3]
    assert answers[0].members == answers[2].members
    assert answers[0].batch == answers[2].batch == record
    assert answers[1].batch is None and answers[1].members == ()
    assert {c.receipt.lease_id for c in answers[0].members} == {
        answers[0].receipt.lease_id, answers[2].receipt.lease_id, get(store, keys[2]).lease_id  # type: ignore[union-attr]
    }  # fmt: skip


def test_a_process_gone_on_this_host_is_taken_over_with_its_whole_request(store: ReceiptStore) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started_at = psutil.Process(dead.pid).create_time()
    dead.wait()
    gone = Owner("run-dead", 1, current_process_identity().host, dead.pid, started_at)
    keys = [key_of(f"g{i}") for i in range(3)]
    record = _sent(store, keys, gone)

    (answer,) = claim(store, [keys[1]], ME)  # the lease is live, but its holder is gone

    assert answer.disposition is CLAIMED and answer.batch == record
    assert [c.receipt.owner for c in answer.members] == [ME] * 3


def test_a_refused_member_records_no_batch(store: ReceiptStore, fake_clock: Any) -> None:
    a, b = key_of("ra"), key_of("rb")
    leases = [lease_of(c) for c in claim(store, [a, b], ME)]
    fake_clock.advance(TTL_S + 1)
    assert claim_one(store, b, OTHER).disposition is CLAIMED  # b's lease ran out and was taken

    report = store.mark_running_many(ORG, leases, ME, lease_ttl_s=TTL_S, batches=[_record([a, b])])

    assert report.applied == (a,) and report.refused[b].reason is RefusalReason.LEASE_LOST
    assert get(store, a).batch_key is None  # type: ignore[union-attr]
    assert get(store, b).batch_key is None  # type: ignore[union-attr]
    # formed again without b, the request is recorded
    again = _record([a], "alone")
    assert store.mark_running_many(ORG, leases[:1], ME, lease_ttl_s=TTL_S, batches=[again]).ok
    assert get(store, a).batch_key == again.key  # type: ignore[union-attr]


def test_a_request_recorded_twice_keeps_its_first_record(store: ReceiptStore, fake_clock: Any) -> None:
    keys = [key_of("x0"), key_of("x1")]
    record = _sent(store, keys, ME)
    leases = [LeaseRef(k, get(store, k).lease_id or "") for k in keys]  # type: ignore[union-attr]
    assert store.mark_running_many(ORG, leases, ME, lease_ttl_s=TTL_S, batches=[record]).ok  # a retry
    fake_clock.advance(TTL_S + 1)
    (answer,) = claim(store, [keys[1]], OTHER)
    assert answer.batch == record


@pytest.mark.parametrize("how", ["completed", "failed", "uncertain", "resolved", "purged", "live"])
def test_a_request_that_cannot_be_sent_again_whole_makes_its_members_uncertain(
    store: ReceiptStore, fake_clock: Any, how: str
) -> None:
    keys = [key_of(f"u{i}") for i in range(3)]
    a, b, c = keys
    record = _sent(store, keys)
    lease_b = LeaseRef(b, get(store, b).lease_id or "")  # type: ignore[union-attr]
    if how == "completed":  # b's answer stored (by its sender, before it died)
        assert store.complete_many(ORG, [Completion(b, lease_b.lease_id, {"v": 1})], OTHER).ok
    elif how == "failed":
        failure = Failure(b, lease_b.lease_id, "no", FailureKind.PERMANENT)
        assert store.fail_many(ORG, [failure], OTHER).ok
    elif how == "uncertain":
        failure = Failure(b, lease_b.lease_id, "cut off", FailureKind.TRANSIENT)
        assert store.mark_uncertain_many(ORG, [failure], OTHER).ok
    elif how == "resolved":  # an operator sent b again in another request
        failure = Failure(b, lease_b.lease_id, "cut off", FailureKind.TRANSIENT)
        assert store.mark_uncertain_many(ORG, [failure], OTHER).ok
        store.resolve(ORG, b, "rerun")  # type: ignore[arg-type]
    elif how == "purged":
        assert store.release(ORG, [lease_b], OTHER).ok
        assert store.purge(statuses=[ReceiptStatus.PENDING]) == 1
    fake_clock.advance(TTL_S + 1)
    if how == "live":  # every member taken by THIRD, then b alone kept alive by it
        taken = claim(store, [a], THIRD)[0]
        assert taken.batch == record
        fake_clock.advance(TTL_S - 1)
        lease = next(lease_of(m) for m in taken.members if m.receipt.key == b)
        assert store.renew_leases(ORG, [lease], THIRD, lease_ttl_s=TTL_S).ok
        fake_clock.advance(2)
    before_b = get(store, b)

    answers = claim(store, [a, b], ME)

    assert answers[0].disposition is UNCERTAIN and answers[0].batch is None
    error = answers[0].receipt.error or ""
    assert record.key[:16] in error and b[:16] in error and "resolve" in error
    assert answers[0].receipt == get(store, a)
    assert get(store, c).status is ReceiptStatus.UNCERTAIN  # type: ignore[union-attr]  # not asked: kept all the same
    assert get(store, c).error == error  # type: ignore[union-attr]
    if how == "purged":  # b is a new call now
        assert answers[1].disposition is CLAIMED and answers[1].receipt.generation == 1
    elif how != "resolved":  # b itself is what it was
        assert get(store, b) == before_b and answers[1].receipt == before_b
    assert all(r.lease_id is None or r.lease_expires_at is None for r in (get(store, a), get(store, c)))  # type: ignore[union-attr]


def test_a_new_generation_forgets_the_request(store: ReceiptStore, fake_clock: Any) -> None:
    keys = [key_of("n0"), key_of("n1")]
    _sent(store, keys)
    for key in keys:
        lease = LeaseRef(key, get(store, key).lease_id or "")  # type: ignore[union-attr]
        assert store.complete_many(ORG, [Completion(key, lease.lease_id, {"k": key})], OTHER).ok
    fake_clock.advance(1)

    (refresh,) = claim(store, [keys[0]], ME, mode=F)

    assert refresh.disposition is CLAIMED and refresh.batch is None
    assert (refresh.receipt.generation, refresh.receipt.batch_key) == (2, None)
    assert get(store, keys[1]).status is ReceiptStatus.COMPLETED  # type: ignore[union-attr]


def test_a_timed_out_request_is_retried_whole_under_its_generation(
    store: ReceiptStore, fake_clock: Any
) -> None:
    keys = [key_of("to0"), key_of("to1"), key_of("to2")]
    record = _sent(store, keys)
    failures = [
        Failure(k, get(store, k).lease_id or "", "timed out", FailureKind.TIMEOUT)  # type: ignore[union-attr]
        for k in keys
    ]
    assert store.fail_many(ORG, failures, OTHER).ok
    fake_clock.advance(1)

    assert claim_one(store, keys[1], ME).disposition is ClaimDisposition.FAILED  # normal mode
    (retry,) = claim(store, [keys[1]], ME, mode=R)

    assert retry.disposition is CLAIMED and retry.batch == record
    assert [(c.receipt.generation, c.receipt.batch_key) for c in retry.members] == [(1, record.key)] * 3


def test_a_failure_with_an_answer_starts_a_new_generation_alone(store: ReceiptStore, fake_clock: Any) -> None:
    keys = [key_of("fa0"), key_of("fa1")]
    _sent(store, keys)
    failures = [
        Failure(k, get(store, k).lease_id or "", "500", FailureKind.TRANSIENT)  # type: ignore[union-attr]
        for k in keys
    ]
    assert store.fail_many(ORG, failures, OTHER).ok

    (retry,) = claim(store, [keys[0]], ME, mode=R)

    assert retry.disposition is CLAIMED and retry.batch is None
    assert (retry.receipt.generation, retry.receipt.batch_key) == (2, None)
    assert get(store, keys[1]).status is ReceiptStatus.FAILED  # type: ignore[union-attr]


def test_a_released_request_is_sent_again_whole(store: ReceiptStore, fake_clock: Any) -> None:
    """A request recorded, then given back (stopped before it went, or a later attempt
    refused): its members' next claim still sends exactly that request."""
    keys = [key_of("rel0"), key_of("rel1")]
    record = _sent(store, keys)
    leases = [LeaseRef(k, get(store, k).lease_id or "") for k in keys]  # type: ignore[union-attr]
    assert store.release(ORG, leases, OTHER).ok
    assert get(store, keys[0]).batch_key == record.key  # type: ignore[union-attr]

    (answer,) = claim(store, [keys[1]], ME, mode=N)

    assert answer.batch == record and len(answer.members) == 2


def test_purge_keeps_records_still_needed_and_drops_the_rest(
    store: ReceiptStore, fake_clock: Any, tmp_path: Any
) -> None:
    done = [key_of("d0"), key_of("d1")]
    live = [key_of("l0"), key_of("l1")]
    timed_out = [key_of("t0"), key_of("t1")]
    finished = _sent(store, done, name="finished")
    waiting = _sent(store, live, name="waiting")
    retried = _sent(store, timed_out, name="retried")
    for key in done:
        lease = get(store, key).lease_id or ""  # type: ignore[union-attr]
        assert store.complete_many(ORG, [Completion(key, lease, 1)], OTHER).ok
    failures = [Failure(k, get(store, k).lease_id or "", "t", FailureKind.TIMEOUT) for k in timed_out]  # type: ignore[union-attr]
    assert store.fail_many(ORG, failures, OTHER).ok
    fake_clock.advance(10)

    assert store.purge(older_than_s=60, statuses=[]) == 0
    stored = _stored_batch_keys(store, tmp_path)
    if stored is not None:
        assert stored == {finished.key, waiting.key, retried.key}  # none old enough
    assert store.purge(older_than_s=5, statuses=[]) == 0

    stored = _stored_batch_keys(store, tmp_path)
    if stored is not None:
        assert stored == {waiting.key, retried.key}
    fake_clock.advance(TTL_S)
    assert claim(store, [live[0]], ME)[0].batch == waiting
    assert claim(store, [timed_out[0]], ME, mode=R)[0].batch == retried


def test_a_claim_never_takes_a_member_request_for_another_tool(store: ReceiptStore, fake_clock: Any) -> None:
    keys = [key_of("o0"), key_of("o1")]
    _sent(store, keys)
    fake_clock.advance(TTL_S + 1)
    other_tool = ClaimRequest(keys[0], "play", "another_tool", request_for(keys[0]).input_hash)

    (answer,) = store.claim_many(ORG, [other_tool], ME, lease_ttl_s=TTL_S)

    assert answer.disposition is UNCERTAIN and "another call" in (answer.receipt.error or "")


@pytest.mark.parametrize("lapsed", [False, True])
def test_a_takeover_sent_again_after_it_committed_is_answered_with_its_request(
    store: ReceiptStore, fake_clock: Any, lapsed: bool
) -> None:
    """A claim that took a recorded request over, sent again with its first attempt's lease
    ids (its answer lost with its connection), is answered as the first was: the whole
    request, its members as they stand, nothing written. Answered without the request,
    the caller would send the member in a new batch: a new key, paid for twice."""
    keys = [key_of(f"again{i}") for i in range(3)]
    record = _sent(store, [keys[1], keys[0], keys[2]])
    fake_clock.advance(TTL_S + 1)
    request = attrs.evolve(request_for(keys[0]), lease_id="c0ffee" * 5 + "01")
    (first,) = store.claim_many(ORG, [request], ME, lease_ttl_s=TTL_S)
    assert first.batch == record
    stood = [get(store, key) for key in record.members]
    fake_clock.advance(TTL_S + 1.0 if lapsed else 1.0)

    (again,) = store.claim_many(ORG, [request], ME, lease_ttl_s=TTL_S)

    assert again.disposition is CLAIMED and again.batch == record
    assert again.receipt == first.receipt
    assert [c.receipt for c in again.members] == stood == [c.receipt for c in first.members]
    assert [get(store, key) for key in record.members] == stood  # nothing written


def _complete(store: ReceiptStore, keys: list[str], owner: Owner, value: Any) -> None:
    for key in keys:
        lease = get(store, key).lease_id or ""  # type: ignore[union-attr]
        assert store.complete_many(ORG, [Completion(key, lease, value)], owner).ok


@pytest.mark.parametrize("batched", [True, False], ids=["batch-request", "lone-call"])
def test_a_lost_refresh_restored_by_a_plain_claim_is_sent_again_under_its_key(
    store: ReceiptStore, fake_clock: Any, tmp_path: Any, batched: bool
) -> None:
    """A forced refresh whose request went (recorded running), its owner then lost, and a
    plain claim that gives its receipts their last good output back: the next forced
    refresh sends that same request again (same generation, same batch record, so the
    same idempotency key: the provider replays it, no new charge), the record kept by a
    purge meanwhile. Then, refreshed, the one after starts a new generation."""
    keys = [key_of(f"lr{i}-{batched}") for i in range(3)]
    if batched:
        _sent(store, keys, OTHER, name=f"first-{batched}")
    else:
        claim(store, keys, OTHER)
    _complete(store, keys, OTHER, "old")
    fake_clock.advance(1)
    if batched:
        refresh = _record([keys[2], keys[0], keys[1]], name=f"refresh-{batched}")
        leases = [lease_of(c) for c in claim(store, keys, OTHER, mode=F)]
        assert store.mark_running_many(ORG, leases, OTHER, lease_ttl_s=TTL_S, batches=[refresh]).ok
    else:
        leases = [lease_of(c) for c in claim(store, keys, OTHER, mode=F)]
        assert store.mark_running_many(ORG, leases, OTHER, lease_ttl_s=TTL_S).ok
    assert {get(store, k).generation for k in keys} == {2}  # type: ignore[union-attr]
    fake_clock.advance(TTL_S + 1)  # the refresh's owner is lost

    plain = claim(store, keys, ME)  # a plain run: the last good output stands
    assert [(c.disposition, c.receipt.output) for c in plain] == [(ClaimDisposition.REUSED, "old")] * 3
    fake_clock.advance(TTL_S + 10)
    store.purge(older_than_s=5, statuses=[])
    if batched:
        stored = _stored_batch_keys(store, tmp_path)
        assert stored is None or refresh.key in stored

    forced = claim(store, keys, ME, mode=F)

    assert all(c.disposition is CLAIMED for c in forced)
    assert [c.receipt.generation for c in forced] == [2, 2, 2]  # the lost refresh's key
    if batched:
        assert all(c.batch == refresh for c in forced)
        assert [c.receipt.key for c in forced[0].members] == list(refresh.members)
    else:
        assert all(c.batch is None for c in forced)
    assert all(c.receipt.error is None for c in forced)
    _complete(store, keys, ME, "new")
    fake_clock.advance(1)
    again = claim(store, keys, THIRD, mode=F)
    assert [(c.receipt.generation, c.batch) for c in again] == [(3, None)] * 3
