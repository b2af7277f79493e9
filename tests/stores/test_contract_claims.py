"""The receipt store contract, claims: the dispositions table, fencing, fenced writes, leases
and the store clock (every backend: conftest.BACKENDS).

Behaviour reference: ../shared/SEMANTICS.md (Claims, Leases) and stores/base.py.
Time only moves when a test advances the store's FakeClock.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from stores import (
    ClaimDisposition,
    ClaimMode,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Owner,
    ReceiptStatus,
    ReceiptStore,
    RefusalReason,
)

from .conftest import (
    CLAIMED,
    IN_FLIGHT,
    ME,
    OPS,
    ORG,
    OTHER,
    TTL_S,
    F,
    N,
    R,
    assert_claimed,
    assert_untouched,
    claim,
    claim_one,
    complete,
    fail,
    get,
    key_of,
    lease_of,
    make_completed,
    make_failed,
    make_pending,
    make_running,
    request_for,
)

# -- the dispositions table, one test per row, parametrized over the columns --------------


@pytest.mark.parametrize("mode", list(ClaimMode))
def test_claim_absent_receipt_is_claimed(store: ReceiptStore, fake_clock: Any, mode: ClaimMode) -> None:
    key = key_of("absent")
    assert get(store, key) is None
    assert_claimed(claim_one(store, key, mode=mode), store, ME, fake_clock(), None)


@pytest.mark.parametrize("mode", list(ClaimMode))
def test_claim_pending_receipt_is_claimed(store: ReceiptStore, fake_clock: Any, mode: ClaimMode) -> None:
    key = key_of("pending")
    make_pending(store, key)
    before = get(store, key)
    assert before is not None and before.status is ReceiptStatus.PENDING
    fake_clock.advance(1)
    assert_claimed(claim_one(store, key, mode=mode), store, ME, fake_clock(), before)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [(N, ClaimDisposition.REUSED), (R, ClaimDisposition.REUSED), (F, CLAIMED)],
)
@pytest.mark.parametrize("stale_after_s", [None, 3600.0])
def test_claim_completed_fresh_receipt(
    store: ReceiptStore,
    fake_clock: Any,
    mode: ClaimMode,
    expected: ClaimDisposition,
    stale_after_s: float | None,
) -> None:
    key = key_of("fresh")
    make_completed(store, key)
    before = get(store, key)
    assert before is not None and before.status is ReceiptStatus.COMPLETED
    fake_clock.advance(3600.0)  # exactly stale_after_s old is still fresh
    result = claim_one(store, key, mode=mode, stale_after_s=stale_after_s)
    if expected is CLAIMED:
        assert_claimed(result, store, ME, fake_clock(), before)
    else:
        assert_untouched(result, store, expected, before)
        assert result.receipt.output == {"answer": 42}


@pytest.mark.parametrize("mode", list(ClaimMode))
def test_claim_completed_stale_receipt_is_claimed(
    store: ReceiptStore, fake_clock: Any, mode: ClaimMode
) -> None:
    key = key_of("stale")
    make_completed(store, key)
    before = get(store, key)
    fake_clock.advance(60.5)
    assert_claimed(
        claim_one(store, key, mode=mode, stale_after_s=60.0),
        store,
        ME,
        fake_clock(),
        before,
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (N, ClaimDisposition.RUNNING),
        (R, ClaimDisposition.RUNNING),
        (F, ClaimDisposition.BLOCKED_ACTIVE_LEASE),
    ],
)
@pytest.mark.parametrize("status", sorted(IN_FLIGHT))
def test_claim_live_lease_of_other_owner_is_not_taken(
    store: ReceiptStore,
    fake_clock: Any,
    mode: ClaimMode,
    expected: ClaimDisposition,
    status: str,
) -> None:
    key = key_of("live")
    IN_FLIGHT[status](store, key)
    before = get(store, key)
    assert before is not None and before.status.value == status
    fake_clock.advance(TTL_S - 0.5)
    assert_untouched(claim_one(store, key, mode=mode), store, expected, before)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (N, ClaimDisposition.RUNNING),
        (R, ClaimDisposition.RUNNING),
        (F, ClaimDisposition.BLOCKED_ACTIVE_LEASE),
    ],
)
def test_claim_live_lease_of_same_owner_is_not_taken(
    store: ReceiptStore, mode: ClaimMode, expected: ClaimDisposition
) -> None:
    key = key_of("mine")
    first = claim_one(store, key)
    assert_untouched(claim_one(store, key, mode=mode), store, expected, first.receipt)


@pytest.mark.parametrize("mode", list(ClaimMode))
@pytest.mark.parametrize("status", sorted(IN_FLIGHT))
def test_claim_expired_lease_is_reclaimed(
    store: ReceiptStore, fake_clock: Any, mode: ClaimMode, status: str
) -> None:
    key = key_of("expired")
    IN_FLIGHT[status](store, key)
    before = get(store, key)
    fake_clock.advance(TTL_S + 0.5)
    assert_claimed(claim_one(store, key, mode=mode), store, ME, fake_clock(), before)


@pytest.mark.parametrize(("mode", "expected"), [(N, ClaimDisposition.FAILED), (R, CLAIMED), (F, CLAIMED)])
def test_claim_failed_receipt(
    store: ReceiptStore, fake_clock: Any, mode: ClaimMode, expected: ClaimDisposition
) -> None:
    key = key_of("failed")
    make_failed(store, key)
    before = get(store, key)
    assert before is not None and before.status is ReceiptStatus.FAILED
    assert (before.error, before.failure_kind) == (
        "provider said no",
        FailureKind.TRANSIENT,
    )
    fake_clock.advance(1)
    result = claim_one(store, key, mode=mode)
    if expected is CLAIMED:
        assert_claimed(result, store, ME, fake_clock(), before)
    else:
        assert_untouched(result, store, expected, before)


def test_claim_mixed_batch_answers_each_key_in_request_order(store: ReceiptStore, fake_clock: Any) -> None:
    keys = [key_of(f"mixed-{i}") for i in range(4)]
    make_completed(store, keys[1])
    make_running(store, keys[2])
    make_failed(store, keys[3])
    results = claim(store, keys)
    assert [r.receipt.key for r in results] == keys
    assert [r.disposition for r in results] == [
        CLAIMED,
        ClaimDisposition.REUSED,
        ClaimDisposition.RUNNING,
        ClaimDisposition.FAILED,
    ]


def test_claim_returns_receipt_as_stored_when_input_hash_changes(
    store: ReceiptStore,
) -> None:
    key = key_of("rehash")
    first = store.claim_many(ORG, [request_for(key, input_hash="a" * 64)], ME, lease_ttl_s=TTL_S)[0]
    assert store.release(ORG, [lease_of(first)], ME).ok
    (again,) = store.claim_many(ORG, [request_for(key, input_hash="b" * 64)], ME, lease_ttl_s=TTL_S)
    assert again.disposition is CLAIMED
    assert get(store, key) == again.receipt


# -- fencing -------------------------------------------------------------------------------


def _wrong_lease_id(store: ReceiptStore, lease: LeaseRef, fake_clock: Any) -> tuple[LeaseRef, Owner]:
    return LeaseRef(lease.key, "f" * 32), ME


def _wrong_run_id(store: ReceiptStore, lease: LeaseRef, fake_clock: Any) -> tuple[LeaseRef, Owner]:
    return lease, Owner("run-intruder", ME.run_attempt)


def _wrong_attempt(store: ReceiptStore, lease: LeaseRef, fake_clock: Any) -> tuple[LeaseRef, Owner]:
    return lease, Owner(ME.run_id, ME.run_attempt + 1)


def _released(store: ReceiptStore, lease: LeaseRef, fake_clock: Any) -> tuple[LeaseRef, Owner]:
    assert store.release(ORG, [lease], ME).ok
    return lease, ME


def _missing(store: ReceiptStore, lease: LeaseRef, fake_clock: Any) -> tuple[LeaseRef, Owner]:
    return LeaseRef(key_of("never-claimed"), lease.lease_id), ME


def _reclaimed_by_other(store: ReceiptStore, lease: LeaseRef, fake_clock: Any) -> tuple[LeaseRef, Owner]:
    fake_clock.advance(TTL_S + 1)
    assert claim_one(store, lease.key, OTHER).disposition is CLAIMED
    return lease, ME


MISMATCHES = {
    "wrong_lease_id": (_wrong_lease_id, RefusalReason.LEASE_LOST),
    "wrong_run_id": (_wrong_run_id, RefusalReason.LEASE_LOST),
    "wrong_attempt": (_wrong_attempt, RefusalReason.LEASE_LOST),
    "released": (_released, RefusalReason.LEASE_LOST),
    "missing": (_missing, RefusalReason.MISSING),
    "reclaimed_by_other": (_reclaimed_by_other, RefusalReason.LEASE_LOST),
}


@pytest.mark.parametrize("mismatch", list(MISMATCHES))
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("held", ["queued", "running"])
def test_fence_mismatch_changes_nothing(
    store: ReceiptStore, fake_clock: Any, op: str, mismatch: str, held: str
) -> None:
    key = key_of("fenced")
    lease = lease_of(claim_one(store, key))
    if held == "running":
        assert store.mark_running_many(ORG, [lease], ME).ok
    setup, reason = MISMATCHES[mismatch]
    bad_lease, bad_owner = setup(store, lease, fake_clock)
    snapshot = {k: get(store, k) for k in (key, bad_lease.key)}
    fake_clock.advance(1)  # any write would now move updated_at

    report = OPS[op](store, bad_lease, bad_owner)

    assert report.applied == ()
    assert not report.ok
    assert set(report.refused) == {bad_lease.key}
    refusal = report.refused[bad_lease.key]
    assert refusal.reason is reason
    assert refusal.message
    assert refusal.receipt == snapshot[bad_lease.key]
    assert {k: get(store, k) for k in snapshot} == snapshot


@pytest.mark.parametrize("op", list(OPS))
def test_fence_refusal_is_per_key_in_one_call(store: ReceiptStore, fake_clock: Any, op: str) -> None:
    good, bad = key_of("good"), key_of("bad")
    good_lease = lease_of(claim(store, [good, bad])[0])
    before_bad = get(store, bad)
    fake_clock.advance(1)
    wrong = LeaseRef(bad, "f" * 32)
    if op == "complete_many":
        report = store.complete_many(
            ORG,
            [
                Completion(good, good_lease.lease_id, 1),
                Completion(bad, wrong.lease_id, 2),
            ],
            ME,
        )
    elif op in ("fail_many", "mark_uncertain_many"):
        kind = FailureKind.PERMANENT
        report = getattr(store, op)(
            ORG,
            [
                Failure(good, good_lease.lease_id, "e", kind),
                Failure(bad, wrong.lease_id, "e", kind),
            ],
            ME,
        )
    elif op == "renew_leases":
        report = store.renew_leases(ORG, [good_lease, wrong], ME, lease_ttl_s=TTL_S)
    else:
        report = getattr(store, op)(ORG, [good_lease, wrong], ME)
    assert report.applied == (good,)
    assert set(report.refused) == {bad}
    assert report.refused[bad].reason is RefusalReason.LEASE_LOST
    assert get(store, bad) == before_bad
    assert get(store, good).updated_at == fake_clock()  # type: ignore[union-attr]


def test_mark_running_moves_queued_to_running(store: ReceiptStore, fake_clock: Any) -> None:
    lease = lease_of(claim_one(store, key_of("m")))
    fake_clock.advance(1)
    assert store.mark_running_many(ORG, [lease], ME).applied == (lease.key,)
    receipt = get(store, lease.key)
    assert receipt is not None
    assert receipt.status is ReceiptStatus.RUNNING
    assert (receipt.lease_id, receipt.owner, receipt.updated_at) == (
        lease.lease_id,
        ME,
        fake_clock(),
    )


def test_claim_straight_into_running_writes_running_only_what_it_claims(
    store: ReceiptStore, fake_clock: Any
) -> None:
    # keys named in ``running`` that the claim takes (new, expired, pending) are written
    # running in the claim's own transaction; the others keep their disposition and row
    new, expired, done, held, queued = (key_of(f"into-running-{n}") for n in range(5))
    make_completed(store, done)
    make_running(store, held)
    old = claim_one(store, expired, OTHER, lease_ttl_s=1.0)
    fake_clock.advance(2.0)
    before = {k: get(store, k) for k in (done, held)}
    results = store.claim_many(
        ORG,
        [request_for(k) for k in (new, expired, done, held, queued)],
        ME,
        lease_ttl_s=TTL_S,
        running={new, expired, done, held},
    )
    assert [r.disposition for r in results] == [
        CLAIMED,
        CLAIMED,
        ClaimDisposition.REUSED,
        ClaimDisposition.RUNNING,
        CLAIMED,
    ]
    statuses = [r.receipt.status for r in results]
    assert statuses[:2] == [ReceiptStatus.RUNNING, ReceiptStatus.RUNNING]
    assert statuses[4] is ReceiptStatus.QUEUED  # not named: claimed as usual
    for result in (results[0], results[1], results[4]):
        stored = get(store, result.receipt.key)
        assert stored is not None
        assert (stored.status, stored.lease_id) == (result.receipt.status, result.receipt.lease_id)
        assert stored.owner == ME
    assert {k: get(store, k) for k in (done, held)} == before
    # the old holder of the expired lease is fenced out of the running receipt
    report = store.complete_many(ORG, [Completion(expired, old.receipt.lease_id or "", {"late": 1})], OTHER)
    assert report.applied == ()
    assert store.complete_many(
        ORG, [Completion(new, results[0].receipt.lease_id or "", {"ok": 1})], ME
    ).applied == (new,)


def test_complete_stores_output_and_drops_lease(store: ReceiptStore, fake_clock: Any) -> None:
    lease = lease_of(claim_one(store, key_of("c")))
    assert store.mark_running_many(ORG, [lease], ME).ok
    fake_clock.advance(2)
    assert complete(store, lease, {"valid": True}).applied == (lease.key,)
    receipt = get(store, lease.key)
    assert receipt is not None
    assert receipt.status is ReceiptStatus.COMPLETED
    assert receipt.output == {"valid": True}
    assert receipt.completed_at == receipt.updated_at == fake_clock()
    assert receipt.lease_expires_at is None
    assert not receipt.lease_live(fake_clock())


def test_fail_records_error_and_kind(store: ReceiptStore, fake_clock: Any) -> None:
    lease = lease_of(claim_one(store, key_of("f")))
    assert fail(store, lease, kind=FailureKind.RATE_LIMITED).applied == (lease.key,)
    receipt = get(store, lease.key)
    assert receipt is not None
    assert receipt.status is ReceiptStatus.FAILED
    assert (receipt.error, receipt.failure_kind) == (
        "provider said no",
        FailureKind.RATE_LIMITED,
    )
    assert receipt.lease_expires_at is None
    assert receipt.output is None


def test_release_returns_receipt_to_pending(store: ReceiptStore, fake_clock: Any) -> None:
    lease = lease_of(claim_one(store, key_of("r")))
    assert store.release(ORG, [lease], ME).applied == (lease.key,)
    receipt = get(store, lease.key)
    assert receipt is not None
    assert receipt.status is ReceiptStatus.PENDING
    assert (receipt.lease_id, receipt.owner, receipt.lease_expires_at) == (
        None,
        None,
        None,
    )
    assert claim_one(store, lease.key, OTHER).disposition is CLAIMED


def test_complete_of_receipt_completed_by_other_returns_stored(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("race")
    mine = lease_of(claim_one(store, key))
    fake_clock.advance(TTL_S + 1)
    theirs = lease_of(claim_one(store, key, OTHER))
    assert complete(store, theirs, {"by": "other"}, OTHER).ok
    stored = get(store, key)
    fake_clock.advance(1)

    report = complete(store, mine, {"by": "me"})

    assert report.applied == ()
    refusal = report.refused[key]
    assert refusal.reason is RefusalReason.COMPLETED_BY_OTHER
    assert refusal.receipt == stored
    assert refusal.receipt is not None and refusal.receipt.output == {"by": "other"}
    assert get(store, key) == stored


def test_complete_retry_of_own_completion_is_idempotent(store: ReceiptStore, fake_clock: Any) -> None:
    lease = lease_of(claim_one(store, key_of("retry")))
    assert complete(store, lease, {"n": 1}).ok
    stored = get(store, lease.key)
    fake_clock.advance(5)
    report = complete(store, lease, {"n": 1})
    assert report.applied == (lease.key,)
    assert report.refused == {}
    assert get(store, lease.key) == stored


def test_fail_retry_of_own_failure_is_idempotent(store: ReceiptStore, fake_clock: Any) -> None:
    lease = lease_of(claim_one(store, key_of("fail-retry")))
    assert fail(store, lease).ok
    stored = get(store, lease.key)
    fake_clock.advance(5)
    report = fail(store, lease)
    assert report.applied == (lease.key,)
    assert get(store, lease.key) == stored


# -- leases and the store clock ------------------------------------------------------------


def test_lease_expiry_judged_by_store_clock(store: ReceiptStore, fake_clock: Any) -> None:
    # The fake clock stands years behind real time: a store judging expiry by the
    # wall clock (or by the caller) would see this lease as long expired.
    key = key_of("clock")
    first = claim_one(store, key)
    assert first.receipt.lease_expires_at == fake_clock() + TTL_S
    assert claim_one(store, key, OTHER).disposition is ClaimDisposition.RUNNING
    fake_clock.advance(TTL_S - 0.001)
    assert claim_one(store, key, OTHER).disposition is ClaimDisposition.RUNNING
    fake_clock.advance(0.002)
    assert_claimed(claim_one(store, key, OTHER), store, OTHER, fake_clock(), first.receipt)


def test_lease_renewal_extends_expiry(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("renew")
    lease = lease_of(claim_one(store, key))
    fake_clock.advance(20)
    assert store.renew_leases(ORG, [lease], ME, lease_ttl_s=TTL_S).applied == (key,)
    renewed = get(store, key)
    assert renewed is not None and renewed.lease_expires_at == fake_clock() + TTL_S
    fake_clock.advance(20)  # 40 s after the claim: past the first TTL, inside the renewal
    assert claim_one(store, key, OTHER).disposition is ClaimDisposition.RUNNING
    assert store.mark_running_many(ORG, [lease], ME).ok
    fake_clock.advance(TTL_S)
    assert claim_one(store, key, OTHER).disposition is CLAIMED


def test_lease_expired_but_not_taken_stays_with_its_owner(store: ReceiptStore, fake_clock: Any) -> None:
    # Fencing compares lease id and owner, not the clock: until someone else claims
    # the key, a late owner may still renew and complete (SEMANTICS.md: only a lease
    # "expired and taken" is lost).
    key = key_of("late")
    lease = lease_of(claim_one(store, key))
    fake_clock.advance(TTL_S + 5)
    assert store.renew_leases(ORG, [lease], ME, lease_ttl_s=TTL_S).applied == (key,)
    assert claim_one(store, key, OTHER).disposition is ClaimDisposition.RUNNING
    assert complete(store, lease, "late but ours").ok
    assert get(store, key).output == "late but ours"  # type: ignore[union-attr]


def test_lease_renewal_after_reclaim_is_lease_lost(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("lost")
    mine = lease_of(claim_one(store, key))
    fake_clock.advance(TTL_S + 1)
    theirs = lease_of(claim_one(store, key, OTHER))
    stored = get(store, key)
    fake_clock.advance(1)
    report = store.renew_leases(ORG, [mine], ME, lease_ttl_s=TTL_S)
    assert report.refused[key].reason is RefusalReason.LEASE_LOST
    assert get(store, key) == stored
    assert complete(store, mine, "late").refused[key].reason is RefusalReason.LEASE_LOST
    assert complete(store, theirs, "theirs", OTHER).ok
    assert get(store, key).output == "theirs"  # type: ignore[union-attr]


def test_reclaim_of_expired_lease_has_single_winner(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("contested")
    claim_one(store, key, Owner("run-crashed"))
    fake_clock.advance(TTL_S + 1)
    first = claim_one(store, key, ME)
    second = claim_one(store, key, OTHER)
    assert [first.disposition, second.disposition] == [
        CLAIMED,
        ClaimDisposition.RUNNING,
    ]
    assert second.receipt == first.receipt == get(store, key)


# Races between workers (each its own connection) are in tests/stores/test_races.py: one
# store instance shared by racing threads runs their calls one after another.


def test_claim_duplicate_keys_answered_alike(store: ReceiptStore) -> None:
    k, other = key_of("dup"), key_of("single")
    results = claim(store, [k, other, k])
    assert results[0] == results[2]
    assert results[0].disposition is CLAIMED
    assert results[0].receipt.attempts == 1
    assert results[0].receipt.lease_id != results[1].receipt.lease_id
    assert get(store, k) == results[0].receipt
    assert complete(store, lease_of(results[0]), "done").ok
    again = claim(store, [k, k])
    assert [c.disposition for c in again] == [ClaimDisposition.REUSED] * 2
    assert again[0] == again[1]


def test_claim_attempts_count_each_claim(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("attempts")
    first = claim_one(store, key)
    assert first.receipt.attempts == 1
    assert claim_one(store, key, OTHER).receipt.attempts == 1  # running: not a claim
    assert store.release(ORG, [lease_of(first)], ME).ok
    second = claim_one(store, key)
    assert second.receipt.attempts == 2
    assert fail(store, lease_of(second)).ok
    assert claim_one(store, key).receipt.attempts == 2  # failed in normal mode: not a claim
    third = claim_one(store, key, mode=R)
    assert third.receipt.attempts == 3
    assert complete(store, lease_of(third), 1).ok
    assert claim_one(store, key).receipt.attempts == 3  # reused: not a claim
    fourth = claim_one(store, key, mode=F)
    assert fourth.receipt.attempts == 4
    fake_clock.advance(TTL_S + 1)
    assert claim_one(store, key, OTHER).receipt.attempts == 4  # lost refresh: the old output
    assert claim_one(store, key, OTHER, mode=F).receipt.attempts == 5
    assert get(store, key).attempts == 5  # type: ignore[union-attr]


# -- a claim sent again with its first attempt's lease ids (its connection dropped) -------

RETRY_LEASE = "c0ffee" * 5 + "00"


def _claim_with_lease(
    store: ReceiptStore, key: str, lease_id: str, owner: Owner = ME, *, retry_safe: bool = True,
    running: bool = False, mode: ClaimMode = N,
) -> Any:  # fmt: skip
    request = attrs.evolve(request_for(key), lease_id=lease_id, retry_safe=retry_safe)
    (result,) = store.claim_many(
        ORG,
        [request],
        owner,
        lease_ttl_s=TTL_S,
        mode=mode,
        running=frozenset({key}) if running else frozenset(),
    )
    return result


@pytest.mark.parametrize("mode", list(ClaimMode))
def test_claim_takes_the_lease_id_it_names(store: ReceiptStore, fake_clock: Any, mode: ClaimMode) -> None:
    key = key_of("named lease")
    result = _claim_with_lease(store, key, RETRY_LEASE, mode=mode)
    assert_claimed(result, store, ME, fake_clock(), None)
    assert result.receipt.lease_id == RETRY_LEASE


@pytest.mark.parametrize("mode", list(ClaimMode))
@pytest.mark.parametrize("running", [False, True])
@pytest.mark.parametrize("lapsed", [False, True])
@pytest.mark.parametrize("retry_safe", [True, False])
def test_claim_sent_again_after_it_committed_answers_claimed_as_it_stands(
    store: ReceiptStore, fake_clock: Any, running: bool, lapsed: bool, retry_safe: bool, mode: ClaimMode
) -> None:
    """The first attempt committed and its answer was lost: the same claim again (same lease
    ids) is that claim, not another owner's live lease (RUNNING: the caller would wait on
    itself), nor a lost running call (UNCERTAIN), even once the lease lapsed meanwhile."""
    key = key_of("retried claim")
    first = _claim_with_lease(store, key, RETRY_LEASE, retry_safe=retry_safe, running=running, mode=mode)
    assert first.disposition is CLAIMED
    before = get(store, key)
    fake_clock.advance(TTL_S + 1.0 if lapsed else 1.0)
    again = _claim_with_lease(store, key, RETRY_LEASE, retry_safe=retry_safe, running=running, mode=mode)
    assert again.disposition is CLAIMED
    assert again.receipt == before  # nothing written: same lease, attempts, generation, status
    assert get(store, key) == before
    assert complete(store, lease_of(again), {"once": True}).ok


def test_claim_with_another_lease_id_still_meets_its_own_live_lease(store: ReceiptStore) -> None:
    key = key_of("other attempt")
    first = _claim_with_lease(store, key, RETRY_LEASE)
    assert_untouched(_claim_with_lease(store, key, "f" * 32), store, ClaimDisposition.RUNNING, first.receipt)


def test_claim_naming_a_lease_id_another_owner_holds_is_not_taken(store: ReceiptStore) -> None:
    key = key_of("not mine")
    first = _claim_with_lease(store, key, RETRY_LEASE, OTHER)
    assert_untouched(
        _claim_with_lease(store, key, RETRY_LEASE, ME), store, ClaimDisposition.RUNNING, first.receipt
    )


def test_claim_sent_again_after_its_lease_was_taken_over_does_not_take_it_back(
    store: ReceiptStore, fake_clock: Any
) -> None:
    key = key_of("taken over")
    _claim_with_lease(store, key, RETRY_LEASE)
    fake_clock.advance(TTL_S + 1.0)
    taken = claim_one(store, key, OTHER)
    assert taken.disposition is CLAIMED
    assert_untouched(
        _claim_with_lease(store, key, RETRY_LEASE), store, ClaimDisposition.RUNNING, taken.receipt
    )


def test_claim_sent_again_after_its_receipt_completed_reuses_it(store: ReceiptStore) -> None:
    key = key_of("completed meanwhile")
    first = _claim_with_lease(store, key, RETRY_LEASE)
    assert complete(store, lease_of(first), {"done": 1}).ok
    again = _claim_with_lease(store, key, RETRY_LEASE)
    assert again.disposition is ClaimDisposition.REUSED
    assert again.receipt.output == {"done": 1}
