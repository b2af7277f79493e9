"""The receipt store contract, run against every backend (see conftest.BACKENDS).

Behaviour reference: ../shared/SEMANTICS.md (Claims, Leases) and stores/base.py.
Time only moves when a test advances the store's FakeClock.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import attrs
import psutil
import pytest

from stores import (
    MAX_OUTPUT_BYTES,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    FenceReport,
    InvalidOutputError,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    ReceiptStore,
    RefusalReason,
    ResolveAction,
    current_process_identity,
    output_too_large_error,
)
from stores.codec import MAX_OUTPUT_DEPTH

ORG = "org-a"
OTHER_ORG = "org-b"
ME = Owner("run-me", 1)
OTHER = Owner("run-other", 1)
TTL_S = 30.0
KEEPS_OUTPUT = (ReceiptStatus.COMPLETED, ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)

N = ClaimMode.NORMAL
R = ClaimMode.RETRY_FAILED
F = ClaimMode.FORCE_REFRESH
CLAIMED = ClaimDisposition.CLAIMED


def nested(depth: int) -> Any:
    """A list ``depth`` containers deep: [[[...]]]."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def same(got: Any, want: Any) -> bool:
    """Equal with the same types all the way down (NaN equals NaN, -0.0 is not 0.0)."""
    return _shape(got) == _shape(want)


def _shape(value: Any) -> Any:
    stack: list[Any] = []
    out: list[Any] = []
    stack.append(value)
    while stack:  # iterative: deep outputs must not hit the recursion limit here
        item = stack.pop()
        if isinstance(item, dict):
            out.append(("dict", len(item)))
            for k, v in item.items():
                out.append(("key", k))
                stack.append(v)
        elif isinstance(item, list):
            out.append(("list", len(item)))
            stack.extend(item)
        elif isinstance(item, float):
            out.append(("float", "nan" if math.isnan(item) else item.hex()))
        else:
            out.append((type(item).__name__, item))
    return out


def key_of(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def request_for(key: str, *, input_hash: str | None = None) -> ClaimRequest:
    return ClaimRequest(key, "play", "verify_email", input_hash or key_of("input:" + key))


def claim(
    store: ReceiptStore,
    keys: list[str],
    owner: Owner = ME,
    *,
    mode: ClaimMode = N,
    stale_after_s: float | None = None,
    org: str = ORG,
    lease_ttl_s: float = TTL_S,
) -> list[Claim]:
    return store.claim_many(
        org,
        [request_for(k) for k in keys],
        owner,
        lease_ttl_s=lease_ttl_s,
        mode=mode,
        stale_after_s=stale_after_s,
    )


def claim_one(store: ReceiptStore, key: str, owner: Owner = ME, **kw: Any) -> Claim:
    (result,) = claim(store, [key], owner, **kw)
    return result


def lease_of(result: Claim) -> LeaseRef:
    assert result.receipt.lease_id
    return LeaseRef(result.receipt.key, result.receipt.lease_id)


def get(store: ReceiptStore, key: str, org: str = ORG) -> Receipt | None:
    (receipt,) = store.get_many(org, [key])
    return receipt


def complete(
    store: ReceiptStore, lease: LeaseRef, output: Any, owner: Owner = ME, org: str = ORG
) -> FenceReport:
    return store.complete_many(org, [Completion(lease.key, lease.lease_id, output)], owner)


def fail(
    store: ReceiptStore,
    lease: LeaseRef,
    owner: Owner = ME,
    kind: FailureKind = FailureKind.TRANSIENT,
) -> FenceReport:
    return store.fail_many(ORG, [Failure(lease.key, lease.lease_id, "provider said no", kind)], owner)


def assert_claimed(
    result: Claim,
    store: ReceiptStore,
    owner: Owner,
    now_s: float,
    before: Receipt | None,
) -> None:
    """A CLAIMED answer: a new queued lease for ``owner``, exactly as stored."""
    assert result.disposition is CLAIMED
    receipt = result.receipt
    assert receipt.status is ReceiptStatus.QUEUED
    assert receipt.lease_id
    assert receipt.owner == owner
    assert receipt.lease_expires_at == now_s + TTL_S
    assert [receipt.error, receipt.failure_kind] == [None] * 2
    if before is not None and before.completed_at is not None and before.status in KEEPS_OUTPUT:
        # A re-run of a completed receipt keeps its output until a new one is stored.
        assert (receipt.output, receipt.completed_at) == (
            before.output,
            before.completed_at,
        )
    else:
        assert (receipt.output, receipt.completed_at) == (None, None)
    assert receipt.updated_at == now_s
    if before is None:
        assert receipt.attempts == 1
        assert receipt.created_at == now_s
        assert receipt.generation == 1
    else:
        assert receipt.lease_id != before.lease_id
        assert receipt.attempts == before.attempts + 1
        assert receipt.created_at == before.created_at
        bumped = before.status in (ReceiptStatus.COMPLETED, ReceiptStatus.FAILED)
        assert receipt.generation == before.generation + bumped
    assert get(store, receipt.key) == receipt


def assert_untouched(
    result: Claim, store: ReceiptStore, disposition: ClaimDisposition, before: Receipt
) -> None:
    """A non-claim answer: the stored receipt is returned and nothing changed."""
    assert result.disposition is disposition
    assert result.receipt == before
    assert get(store, before.key) == before


# -- store states the dispositions table starts from ------------------------------------


def make_pending(store: ReceiptStore, key: str) -> None:
    assert store.release(ORG, [lease_of(claim_one(store, key, OTHER))], OTHER).ok


def make_completed(store: ReceiptStore, key: str, output: Any = None) -> None:
    lease = lease_of(claim_one(store, key, OTHER))
    assert store.mark_running_many(ORG, [lease], OTHER).ok
    assert complete(store, lease, output if output is not None else {"answer": 42}, OTHER).ok


def make_queued(store: ReceiptStore, key: str) -> None:
    assert claim_one(store, key, OTHER).disposition is CLAIMED


def make_running(store: ReceiptStore, key: str) -> None:
    lease = lease_of(claim_one(store, key, OTHER))
    assert store.mark_running_many(ORG, [lease], OTHER).ok


def make_failed(store: ReceiptStore, key: str) -> None:
    assert fail(store, lease_of(claim_one(store, key, OTHER)), OTHER).ok


IN_FLIGHT = {"queued": make_queued, "running": make_running}

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

FencedOp = Callable[[ReceiptStore, LeaseRef, Owner], FenceReport]

OPS: dict[str, FencedOp] = {
    "mark_running_many": lambda s, lease, owner: s.mark_running_many(ORG, [lease], owner),
    "renew_leases": lambda s, lease, owner: s.renew_leases(ORG, [lease], owner, lease_ttl_s=TTL_S),
    "complete_many": lambda s, lease, owner: complete(s, lease, {"ok": True}, owner),
    "fail_many": lambda s, lease, owner: fail(s, lease, owner),
    "release": lambda s, lease, owner: s.release(ORG, [lease], owner),
    "mark_uncertain_many": lambda s, lease, owner: s.mark_uncertain_many(
        ORG,
        [
            Failure(
                lease.key,
                lease.lease_id,
                "timed out after sending",
                FailureKind.TIMEOUT,
            )
        ],
        owner,
    ),
}


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


# -- outputs ---------------------------------------------------------------------------------

ROUND_TRIP = {
    "nested": {"a": {"b": [1, 2.5, {"c": None, "d": [[], {}]}]}, "e": True, "f": False},
    "unicode": {"name": "Zoë ☃ 😀 עברית \u202e", "nul": "a\u0000b", "quote": '"\\'},
    "nfd_kept": "e\u0301",
    "none": None,
    "null_member": {"present": None},
    "empty_object": {},
    "empty_list": [],
    "zero": 0,
    "false": False,
    "empty_string": "",
    "int64_edges": [2**63 - 1, -(2**63), 2**64 - 1],
    "floats": [0.1, 1e-300, -2.5e300, 0.0, -0.0],
    # What orjson refuses or would change: stored in the exact form, returned exactly.
    "lone_surrogate": {"snippet": "caf\ud83d"},
    "lone_low_surrogate_key": {"\udc00": ["\ud800x"]},
    "int_beyond_64_bits": [2**64, -(2**63) - 1, 10**300],
    "nan": float("nan"),
    "infinity": {"x": float("inf"), "y": [float("-inf")]},
    "deep_beyond_orjson": nested(300),
    "deep_at_limit": nested(MAX_OUTPUT_DEPTH),
    "exact_mixed_with_plain": {
        "n": 2**70,
        "s": "Zoë ☃ 😀",
        "nul": "a\u0000b",
        "f": 0.1,
    },
}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_output_round_trips(store: ReceiptStore, name: str) -> None:
    value = ROUND_TRIP[name]
    lease = lease_of(claim_one(store, key_of(name)))
    assert complete(store, lease, value).ok
    receipt = get(store, lease.key)
    assert receipt is not None and receipt.status is ReceiptStatus.COMPLETED
    assert same(receipt.output, value)
    assert same(claim_one(store, lease.key).receipt.output, value)  # what a reuse hands back


def test_output_none_and_missing_member_stay_distinct(store: ReceiptStore) -> None:
    with_null, without = key_of("with-null"), key_of("without")
    leases = [lease_of(c) for c in claim(store, [with_null, without])]
    outputs = [{"a": 1, "b": None}, {"a": 1}]
    report = store.complete_many(
        ORG,
        [Completion(le.key, le.lease_id, o) for le, o in zip(leases, outputs, strict=True)],
        ME,
    )
    assert report.ok
    a, b = store.get_many(ORG, [with_null, without])
    assert a is not None and b is not None
    assert a.output == {"a": 1, "b": None} and "b" in a.output
    assert b.output == {"a": 1} and "b" not in b.output


def _too_large(store: ReceiptStore, fake_clock: Any, big: Any) -> None:
    big_key, small_key = key_of("big"), key_of("small")
    big_lease, small_lease = (lease_of(c) for c in claim(store, [big_key, small_key]))
    assert store.mark_running_many(ORG, [big_lease, small_lease], ME).ok
    before = get(store, big_key)
    fake_clock.advance(1)
    report = store.complete_many(
        ORG,
        [
            Completion(big_key, big_lease.lease_id, big),
            Completion(small_key, small_lease.lease_id, "ok"),
        ],
        ME,
    )
    assert report.applied == (small_key,)
    assert report.refused[big_key].reason is RefusalReason.OUTPUT_TOO_LARGE
    assert str(MAX_OUTPUT_BYTES) in report.refused[big_key].message
    assert get(store, big_key) == before
    assert get(store, small_key).output == "ok"  # type: ignore[union-attr]
    # The refused member still holds its lease, so its owner can record the failure.
    assert fail(store, big_lease, kind=FailureKind.PERMANENT).ok


def test_output_over_cap_refused_alone(store: ReceiptStore, fake_clock: Any) -> None:
    _too_large(store, fake_clock, "x" * (MAX_OUTPUT_BYTES - 1))  # + 2 quotes = cap + 1 bytes


def test_output_cap_counts_utf8_bytes_not_characters(store: ReceiptStore, fake_clock: Any) -> None:
    _too_large(store, fake_clock, "é" * (MAX_OUTPUT_BYTES // 2))  # half the cap in characters


def test_output_at_cap_is_stored(store: ReceiptStore) -> None:
    value = "x" * (MAX_OUTPUT_BYTES - 2)  # + 2 quotes = exactly the cap
    lease = lease_of(claim_one(store, key_of("at-cap")))
    assert complete(store, lease, value).ok
    assert get(store, lease.key).output == value  # type: ignore[union-attr]


class NotJson:
    pass


class Label(str):
    pass


class Level(enum.IntEnum):
    HIGH = 1


# Values that would come back as a different value (path in the error, type named).
NON_JSON_OUTPUTS: dict[str, tuple[Any, str, str]] = {
    "object": (NotJson(), "$", "NotJson"),
    "nested_object": ({"a": [NotJson()]}, "$['a'][0]", "NotJson"),
    "tuple": ((1, 2), "$", "tuple"),
    "nested_tuple": ({"pair": [0, (1, 2)]}, "$['pair'][1]", "tuple"),
    "set": ({1, 2}, "$", "set"),
    "bytes": ({"raw": b"\x00\xff"}, "$['raw']", "bytes"),
    "datetime": ([datetime.datetime(2026, 1, 1)], "$[0]", "datetime"),
    "int_keys": ({"by_id": {1: "a"}}, "$['by_id']", "int key"),
    "str_subclass": (Label("x"), "$", "Label"),
    "int_enum": ({"level": Level.HIGH}, "$['level']", "Level"),
    "surrogate_pair_as_two_code_points": (
        "\ud83d\ude00",
        "surrogate pair",
        "code points",
    ),
}


@pytest.mark.parametrize("name", list(NON_JSON_OUTPUTS))
def test_output_not_json_refused_alone(store: ReceiptStore, fake_clock: Any, name: str) -> None:
    bad_key, good_key = key_of("bad"), key_of("good")
    bad_lease, good_lease = (lease_of(c) for c in claim(store, [bad_key, good_key]))
    before = get(store, bad_key)
    fake_clock.advance(1)
    bad, where, kind = NON_JSON_OUTPUTS[name]
    report = store.complete_many(
        ORG,
        [
            Completion(bad_key, bad_lease.lease_id, bad),
            Completion(good_key, good_lease.lease_id, 7),
        ],
        ME,
    )
    assert report.applied == (good_key,)
    assert report.refused[bad_key].reason is RefusalReason.INVALID_OUTPUT
    assert where in report.refused[bad_key].message and kind in report.refused[bad_key].message
    assert get(store, bad_key) == before
    assert get(store, good_key).output == 7  # type: ignore[union-attr]


# -- purge -------------------------------------------------------------------------------------


def keys_present(store: ReceiptStore, keys: list[str], org: str = ORG) -> list[str]:
    return [k for k, r in zip(keys, store.get_many(org, keys), strict=True) if r is not None]


def test_purge_by_age_uses_store_clock(store: ReceiptStore, fake_clock: Any) -> None:
    old, young = key_of("old"), key_of("young")
    make_completed(store, old)
    fake_clock.advance(100)
    make_completed(store, young)
    fake_clock.advance(100)  # old is 200 s old, young 100 s
    assert store.purge(older_than_s=150) == 1
    assert keys_present(store, [old, young]) == [young]
    assert store.purge(older_than_s=150) == 0
    assert store.purge(older_than_s=99) == 1
    assert keys_present(store, [old, young]) == []


def test_purge_by_status(store: ReceiptStore, fake_clock: Any) -> None:
    done, failed, pending = key_of("done"), key_of("failed"), key_of("pending")
    make_completed(store, done)
    make_failed(store, failed)
    make_pending(store, pending)
    fake_clock.advance(10)
    assert store.purge(statuses=[ReceiptStatus.FAILED]) == 1
    assert keys_present(store, [done, failed, pending]) == [done, pending]
    assert store.purge(statuses=[ReceiptStatus.COMPLETED, ReceiptStatus.PENDING]) == 2
    assert keys_present(store, [done, failed, pending]) == []


def test_purge_default_statuses_keep_in_flight_receipts(store: ReceiptStore, fake_clock: Any) -> None:
    keys = [key_of(n) for n in ("done", "failed", "pending", "queued", "running")]
    make_completed(store, keys[0])
    make_failed(store, keys[1])
    make_pending(store, keys[2])
    make_queued(store, keys[3])
    make_running(store, keys[4])
    fake_clock.advance(TTL_S * 10)  # even expired, in-flight receipts are not purged by default
    assert store.purge() == 3
    assert keys_present(store, keys) == keys[3:]


def test_purge_never_removes_live_leased_receipt(store: ReceiptStore, fake_clock: Any) -> None:
    queued, running = key_of("queued"), key_of("running")
    make_queued(store, queued)
    make_running(store, running)
    everything = list(ReceiptStatus)
    fake_clock.advance(TTL_S - 1)
    assert store.purge(statuses=everything) == 0
    assert keys_present(store, [queued, running]) == [queued, running]
    fake_clock.advance(2)  # leases expired
    assert store.purge(statuses=everything) == 2
    assert keys_present(store, [queued, running]) == []


def test_purge_removes_output_with_row(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("with-output")
    make_completed(store, key, {"big": "x" * 10_000})
    fake_clock.advance(1)
    assert store.purge() == 1
    assert store.get_many(ORG, [key]) == [None]
    fresh = claim_one(store, key)
    assert_claimed(fresh, store, ME, fake_clock(), None)
    assert fresh.receipt.output is None


def test_purge_org_filter(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("shared-key")
    for org in (ORG, OTHER_ORG):
        lease = lease_of(claim_one(store, key, org=org))
        assert complete(store, lease, org, org=org).ok
    fake_clock.advance(1)
    assert store.purge(org_id=OTHER_ORG) == 1
    assert get(store, key, OTHER_ORG) is None
    assert get(store, key, ORG).output == ORG  # type: ignore[union-attr]
    assert store.purge() == 1
    assert get(store, key, ORG) is None


# -- org isolation -------------------------------------------------------------------------------


def test_org_receipt_invisible_to_other_org(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("org")
    a_lease = lease_of(claim_one(store, key, org=ORG))
    assert complete(store, a_lease, "a's secret", org=ORG).ok
    stored_a = get(store, key, ORG)
    assert get(store, key, OTHER_ORG) is None
    fake_clock.advance(1)

    b_claim = claim_one(store, key, org=OTHER_ORG)
    assert_claimed_in = b_claim.receipt
    assert b_claim.disposition is CLAIMED
    assert assert_claimed_in.org_id == OTHER_ORG
    assert assert_claimed_in.attempts == 1
    assert assert_claimed_in.output is None
    assert get(store, key, OTHER_ORG) == b_claim.receipt
    assert get(store, key, ORG) == stored_a


@pytest.mark.parametrize("op", list(OPS))
def test_org_fenced_ops_cannot_reach_other_org(store: ReceiptStore, fake_clock: Any, op: str) -> None:
    key = key_of("org-fenced")
    lease = lease_of(claim_one(store, key, org=ORG))
    stored = get(store, key, ORG)
    fake_clock.advance(1)
    org_b: dict[str, Callable[[], FenceReport]] = {
        "mark_running_many": lambda: store.mark_running_many(OTHER_ORG, [lease], ME),
        "renew_leases": lambda: store.renew_leases(OTHER_ORG, [lease], ME, lease_ttl_s=TTL_S),
        "complete_many": lambda: complete(store, lease, "x", org=OTHER_ORG),
        "fail_many": lambda: store.fail_many(
            OTHER_ORG, [Failure(key, lease.lease_id, "e", FailureKind.PERMANENT)], ME
        ),
        "release": lambda: store.release(OTHER_ORG, [lease], ME),
        "mark_uncertain_many": lambda: store.mark_uncertain_many(
            OTHER_ORG, [Failure(key, lease.lease_id, "e", FailureKind.TIMEOUT)], ME
        ),
    }
    report = org_b[op]()
    assert report.applied == ()
    assert report.refused[key].reason is RefusalReason.MISSING
    assert report.refused[key].receipt is None
    assert get(store, key, ORG) == stored
    assert get(store, key, OTHER_ORG) is None


# -- the backend matrix ----------------------------------------------------------------------------


def test_backend_unavailable_skips_locally_and_fails_in_ci(
    gate_unavailable_backend: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no server"):
        gate_unavailable_backend("no server")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no server"):
        gate_unavailable_backend("no server")


def test_mark_running_with_ttl_renews_an_expired_untaken_lease(store, fake_clock) -> None:
    """A call that waited long for admission starts under a fresh lease, so nobody can
    reclaim it at once and run it a second time."""
    owner, other = Owner("run-a", 1), Owner("run-b", 1)
    (claim,) = store.claim_many("acme", [ClaimRequest("k", "s", "t", "h")], owner, lease_ttl_s=10)
    fake_clock.advance(30)  # the lease ran out while waiting for admission; nobody took it
    lease = LeaseRef("k", claim.receipt.lease_id)
    assert store.mark_running_many("acme", [lease], owner, lease_ttl_s=10).ok
    (receipt,) = store.get_many("acme", ["k"])
    assert receipt.lease_expires_at == fake_clock() + 10
    (again,) = store.claim_many("acme", [ClaimRequest("k", "s", "t", "h")], other, lease_ttl_s=10)
    assert again.disposition is ClaimDisposition.RUNNING


# -- issue 9: outputs the store cannot hold at all ------------------------------------------


NOT_STORABLE = {
    "too_deep": nested(MAX_OUTPUT_DEPTH + 1),
    "int_beyond_4300_digits": {"n": 10**5000},
}


@pytest.mark.parametrize("name", list(NOT_STORABLE))
def test_output_not_storable_refused_alone_lease_kept(
    store: ReceiptStore, fake_clock: Any, name: str
) -> None:
    bad_lease, good_lease = (lease_of(c) for c in claim(store, [key_of("bad"), key_of("good")]))
    before = get(store, bad_lease.key)
    report = store.complete_many(
        ORG,
        [
            Completion(bad_lease.key, bad_lease.lease_id, NOT_STORABLE[name]),
            Completion(good_lease.key, good_lease.lease_id, 1),
        ],
        ME,
    )
    assert report.applied == (good_lease.key,)
    assert report.refused[bad_lease.key].reason is RefusalReason.OUTPUT_NOT_STORABLE
    assert get(store, bad_lease.key) == before  # not failed: the owner salvages it and releases
    assert store.release(ORG, [bad_lease], ME).ok


# -- issue 9: an output over the cap leaves a receipt that says why it has none -------------


def test_output_too_large_recorded_failure_kind_decides_claims(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("too-large")
    lease = lease_of(claim_one(store, key))
    refusal = complete(store, lease, "x" * MAX_OUTPUT_BYTES).refused[key]
    assert refusal.reason is RefusalReason.OUTPUT_TOO_LARGE and "output_too_large" in refusal.message
    why = output_too_large_error(MAX_OUTPUT_BYTES + 2, "/tmp/salvage.jsonl")
    assert "/tmp/salvage.jsonl" in why and "retry_failed" in why
    assert store.fail_many(ORG, [Failure(key, lease.lease_id, why, FailureKind.OUTPUT_TOO_LARGE)], ME).ok
    stored = get(store, key)
    assert stored is not None
    assert (stored.status, stored.failure_kind, stored.error, stored.output) == (
        ReceiptStatus.FAILED,
        FailureKind.OUTPUT_TOO_LARGE,
        why,
        None,
    )
    assert not FailureKind.OUTPUT_TOO_LARGE.retryable  # a normal claim refuses with the error
    assert_untouched(claim_one(store, key, OTHER), store, ClaimDisposition.FAILED, stored)
    for mode in (R, F):
        again = claim_one(store, key, OTHER, mode=mode)
        assert again.disposition is CLAIMED
        assert again.receipt.generation == stored.generation + 1
        assert store.release(ORG, [lease_of(again)], OTHER).ok


# -- issue 9: a forced refresh keeps the stored output until a new one is persisted ---------


def _refreshing(store: ReceiptStore, key: str) -> tuple[Receipt, Claim]:
    make_completed(store, key, {"v": "old"})
    before = get(store, key)
    assert before is not None
    refresh = claim_one(store, key, mode=F)
    assert refresh.disposition is CLAIMED
    assert (refresh.receipt.output, refresh.receipt.completed_at) == (
        {"v": "old"},
        before.completed_at,
    )
    assert get(store, key) == refresh.receipt
    return before, refresh


def _assert_old_output_back(store: ReceiptStore, key: str, before: Receipt, now: float) -> None:
    stored = get(store, key)
    assert stored is not None
    assert stored.status is ReceiptStatus.COMPLETED
    assert (stored.lease_id, stored.owner) == (None, None)
    assert (stored.output, stored.completed_at, stored.error, stored.failure_kind) == (
        before.output,
        before.completed_at,
        None,
        None,
    )
    assert stored.lease_expires_at is None and stored.updated_at == now
    assert_untouched(claim_one(store, key, OTHER), store, ClaimDisposition.REUSED, stored)


@pytest.mark.parametrize("kind", [FailureKind.TRANSIENT, FailureKind.PERMANENT, FailureKind.OUTPUT_TOO_LARGE])
def test_refresh_that_fails_keeps_old_output(store: ReceiptStore, fake_clock: Any, kind: FailureKind) -> None:
    key = key_of("refresh-fails")
    before, refresh = _refreshing(store, key)
    assert store.mark_running_many(ORG, [lease_of(refresh)], ME).ok
    fake_clock.advance(1)
    assert fail(store, lease_of(refresh), kind=kind).applied == (key,)
    _assert_old_output_back(store, key, before, fake_clock())
    retried = fail(store, lease_of(refresh), kind=kind).refused[key]  # the lease is gone
    assert retried.reason is RefusalReason.COMPLETED_BY_OTHER and retried.receipt == get(store, key)
    late = complete(store, lease_of(refresh), {"v": "late"}).refused[key]  # never "applied"
    assert late.reason is RefusalReason.COMPLETED_BY_OTHER


def test_refresh_released_keeps_old_output(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("refresh-released")
    before, refresh = _refreshing(store, key)
    fake_clock.advance(1)
    assert store.release(ORG, [lease_of(refresh)], ME).ok
    _assert_old_output_back(store, key, before, fake_clock())


@pytest.mark.parametrize("mode", [N, R])
def test_refresh_whose_owner_is_lost_keeps_old_output(
    store: ReceiptStore, fake_clock: Any, mode: ClaimMode
) -> None:
    key = key_of("refresh-lost")
    before, refresh = _refreshing(store, key)
    assert store.mark_running_many(ORG, [lease_of(refresh)], ME).ok
    assert claim_one(store, key, OTHER, mode=mode).disposition is ClaimDisposition.RUNNING
    now = fake_clock.advance(TTL_S + 1)
    reused = claim_one(store, key, OTHER, mode=mode)
    assert reused.disposition is ClaimDisposition.REUSED
    assert reused.receipt.output == {"v": "old"} and reused.receipt.status is ReceiptStatus.COMPLETED
    _assert_old_output_back(store, key, before, now)
    # The lost refresh's late completion is refused: the receipt is no longer under its lease.
    assert (
        complete(store, lease_of(refresh), {"v": "late"}).refused[key].reason
        is RefusalReason.COMPLETED_BY_OTHER
    )


def test_refresh_lost_then_forced_again_keeps_old_output_and_generation(
    store: ReceiptStore, fake_clock: Any
) -> None:
    key = key_of("refresh-retaken")
    before, refresh = _refreshing(store, key)
    fake_clock.advance(TTL_S + 1)
    again = claim_one(store, key, OTHER, mode=F)
    assert again.disposition is CLAIMED
    assert again.receipt.output == {"v": "old"} and again.receipt.completed_at == before.completed_at
    assert again.receipt.generation == refresh.receipt.generation == before.generation + 1
    fake_clock.advance(1)
    assert complete(store, lease_of(again), {"v": "new"}, OTHER).ok
    stored = get(store, key)
    assert stored is not None and stored.output == {"v": "new"} and stored.completed_at == fake_clock()


def test_refresh_of_stale_receipt_keeps_old_output(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("stale-rerun")
    make_completed(store, key, {"v": "old"})
    before = get(store, key)
    fake_clock.advance(100)
    rerun = claim_one(store, key, stale_after_s=10)
    assert rerun.disposition is CLAIMED and rerun.receipt.output == {"v": "old"}
    assert fail(store, lease_of(rerun)).ok
    stored = get(store, key)
    assert stored is not None and stored.status is ReceiptStatus.COMPLETED and stored.output == {"v": "old"}
    assert before is not None and stored.completed_at == before.completed_at


# -- issue 9: execution generation (the provider idempotency key's second part) -------------


def test_generation_same_after_lost_owner_or_release(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("generation-kept")
    first = claim_one(store, key)
    assert first.receipt.generation == 1
    assert store.mark_running_many(ORG, [lease_of(first)], ME).ok
    fake_clock.advance(TTL_S + 1)
    retaken = claim_one(store, key, OTHER)  # the owner was lost: same execution, same key
    assert retaken.disposition is CLAIMED and retaken.receipt.generation == 1
    assert store.release(ORG, [lease_of(retaken)], OTHER).ok
    assert claim_one(store, key).receipt.generation == 1


def test_generation_grows_after_recorded_failure_or_completion(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("generation-bumped")
    assert fail(store, lease_of(claim_one(store, key))).ok
    retried = claim_one(store, key, mode=R)
    assert retried.receipt.generation == 2
    assert complete(store, lease_of(retried), 1).ok
    assert claim_one(store, key).receipt.generation == 2  # reused
    forced = claim_one(store, key, mode=F)
    assert forced.receipt.generation == 3
    assert complete(store, lease_of(forced), 2).ok
    fake_clock.advance(100)
    assert claim_one(store, key, stale_after_s=10).receipt.generation == 4
    assert get(store, key).generation == 4  # type: ignore[union-attr]


# -- issue 9: lease owner identity; a dead holder on this host is taken over at once --------


def _dead_process_owner(run_id: str) -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started_at = psutil.Process(proc.pid).create_time()
    finally:
        proc.kill()
        proc.wait()
    return Owner(run_id, 1, current_process_identity().host, proc.pid, started_at)


def test_claim_records_owner_process_identity(store: ReceiptStore) -> None:
    here = current_process_identity()
    receipt = claim_one(store, key_of("identity")).receipt
    assert (
        receipt.lease_owner_host,
        receipt.lease_owner_pid,
        receipt.lease_owner_started_at,
    ) == (
        here.host,
        here.pid,
        here.started_at,
    )
    assert receipt.owner == ME  # identity is not part of fencing
    explicit = Owner("run-x", 1, "elsewhere#1", 4242, 12.5)
    stored = claim_one(store, key_of("identity-explicit"), explicit).receipt
    assert (
        stored.lease_owner_host,
        stored.lease_owner_pid,
        stored.lease_owner_started_at,
    ) == ("elsewhere#1", 4242, 12.5)


@pytest.mark.parametrize("status", sorted(IN_FLIGHT))
@pytest.mark.parametrize("mode", list(ClaimMode))
def test_claim_takes_over_live_lease_of_dead_process_on_this_host(
    store: ReceiptStore, fake_clock: Any, status: str, mode: ClaimMode
) -> None:
    key = key_of("dead-holder")
    dead = _dead_process_owner("run-dead")
    first = claim_one(store, key, dead)
    if status == "running":
        assert store.mark_running_many(ORG, [lease_of(first)], dead).ok
    before = get(store, key)
    assert before is not None and before.lease_live(fake_clock())
    taken = claim_one(store, key, OTHER, mode=mode)  # no clock move: the lease is live by time
    assert_claimed(taken, store, OTHER, fake_clock(), before)
    assert taken.receipt.generation == before.generation
    assert fail(store, lease_of(first), dead).refused[key].reason is RefusalReason.LEASE_LOST


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(
            lambda: Owner("run-live", 1, *attrs.astuple(current_process_identity())[:0]),
            id="no-identity",
        ),
        pytest.param(
            lambda: Owner("run-live", 1, *attrs.astuple(current_process_identity())),
            id="alive-here",
        ),
        pytest.param(
            lambda: attrs.evolve(_dead_process_owner("run-far"), host="other-host#1"),
            id="other-host",
        ),
    ],
)
def test_claim_never_takes_live_lease_of_process_not_known_dead(
    store: ReceiptStore, fake_clock: Any, holder: Callable[[], Owner]
) -> None:
    key = key_of("live-holder")
    owner = holder()
    claim_one(store, key, owner)
    before = get(store, key)
    assert before is not None
    assert_untouched(claim_one(store, key, OTHER), store, ClaimDisposition.RUNNING, before)


def test_claim_takes_over_lease_of_reused_pid(store: ReceiptStore, fake_clock: Any) -> None:
    """Same host and pid, another start time: the holder is gone, the pid was reused."""
    here = current_process_identity()
    key = key_of("pid-reused")
    claim_one(store, key, Owner("run-old", 1, here.host, here.pid, here.started_at - 3600.0))
    assert claim_one(store, key, OTHER).disposition is CLAIMED


# -- issue 9: uncertain outcomes ------------------------------------------------------------


def _uncertain(store: ReceiptStore, key: str) -> Receipt:
    lease = lease_of(claim_one(store, key))
    assert store.mark_running_many(ORG, [lease], ME).ok
    report = store.mark_uncertain_many(
        ORG,
        [Failure(key, lease.lease_id, "timed out after sending", FailureKind.TIMEOUT)],
        ME,
    )
    assert report.applied == (key,)
    stored = get(store, key)
    assert stored is not None
    assert (
        stored.status,
        stored.error,
        stored.failure_kind,
        stored.lease_expires_at,
    ) == (
        ReceiptStatus.UNCERTAIN,
        "timed out after sending",
        FailureKind.TIMEOUT,
        None,
    )
    return stored


@pytest.mark.parametrize("mode", list(ClaimMode))
def test_claim_of_uncertain_receipt_is_uncertain_in_every_mode(
    store: ReceiptStore, fake_clock: Any, mode: ClaimMode
) -> None:
    key = key_of("uncertain")
    stored = _uncertain(store, key)
    fake_clock.advance(3600)
    assert_untouched(
        claim_one(store, key, OTHER, mode=mode, stale_after_s=1.0),
        store,
        ClaimDisposition.UNCERTAIN,
        stored,
    )


def test_running_receipt_of_lost_owner_becomes_uncertain_when_not_retry_safe(
    store: ReceiptStore, fake_clock: Any
) -> None:
    running, queued, safe = key_of("running"), key_of("queued"), key_of("safe")
    leases = [lease_of(c) for c in claim(store, [running, queued, safe])]
    assert store.mark_running_many(ORG, [leases[0], leases[2]], ME).ok
    now = fake_clock.advance(TTL_S + 1)
    requests = [
        ClaimRequest(
            running,
            "play",
            "verify_email",
            key_of("input:" + running),
            retry_safe=False,
        ),
        ClaimRequest(queued, "play", "verify_email", key_of("input:" + queued), retry_safe=False),
        ClaimRequest(safe, "play", "verify_email", key_of("input:" + safe)),
    ]
    answers = store.claim_many(ORG, requests, OTHER, lease_ttl_s=TTL_S)
    assert [a.disposition for a in answers] == [
        ClaimDisposition.UNCERTAIN,
        CLAIMED,
        CLAIMED,
    ]
    stored = get(store, running)
    assert stored is not None and stored == answers[0].receipt
    assert (stored.status, stored.lease_expires_at, stored.updated_at) == (
        ReceiptStatus.UNCERTAIN,
        None,
        now,
    )
    assert stored.error and "not retry-safe" in stored.error
    assert complete(store, leases[0], "late").refused[running].reason is RefusalReason.LEASE_LOST


def test_running_receipt_of_dead_process_becomes_uncertain_when_not_retry_safe(
    store: ReceiptStore,
) -> None:
    key = key_of("dead-running")
    dead = _dead_process_owner("run-dead")
    assert store.mark_running_many(ORG, [lease_of(claim_one(store, key, dead))], dead).ok
    request = ClaimRequest(key, "play", "verify_email", key_of("input:" + key), retry_safe=False)
    (answer,) = store.claim_many(ORG, [request], OTHER, lease_ttl_s=TTL_S)
    assert answer.disposition is ClaimDisposition.UNCERTAIN


def test_resolve_rerun_makes_uncertain_claimable_with_same_generation(
    store: ReceiptStore, fake_clock: Any
) -> None:
    key = key_of("resolve-rerun")
    stored = _uncertain(store, key)
    resolved = store.resolve(ORG, key, ResolveAction.RERUN)
    assert resolved is not None and resolved.status is ReceiptStatus.PENDING and resolved.error is None
    assert get(store, key) == resolved
    again = claim_one(store, key, OTHER)
    assert again.disposition is CLAIMED and again.receipt.generation == stored.generation


def test_resolve_fail_records_permanent_failure(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("resolve-fail")
    _uncertain(store, key)
    resolved = store.resolve(ORG, key, ResolveAction.FAIL, note="checked the provider's dashboard")
    assert resolved is not None and resolved.status is ReceiptStatus.FAILED
    assert resolved.failure_kind is FailureKind.PERMANENT
    assert resolved.error and "dashboard" in resolved.error and "timed out after sending" in resolved.error
    assert claim_one(store, key, OTHER).disposition is ClaimDisposition.FAILED


def test_resolve_complete_stores_reconciled_output(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("resolve-complete")
    _uncertain(store, key)
    now = fake_clock.advance(5)
    resolved = store.resolve(ORG, key, ResolveAction.COMPLETE, output={"charged": 2**70})
    assert resolved is not None and resolved.status is ReceiptStatus.COMPLETED
    assert (resolved.output, resolved.completed_at) == ({"charged": 2**70}, now)
    assert claim_one(store, key, OTHER).disposition is ClaimDisposition.REUSED


def test_resolve_changes_only_uncertain_receipts(store: ReceiptStore, fake_clock: Any) -> None:
    done, missing = key_of("resolve-done"), key_of("resolve-missing")
    make_completed(store, done)
    before = get(store, done)
    for action in ResolveAction:
        assert store.resolve(ORG, done, action, output=1) == before
        assert store.resolve(ORG, missing, action) is None
        assert store.resolve(OTHER_ORG, done, action) is None


def test_resolve_complete_with_invalid_output_changes_nothing(
    store: ReceiptStore,
) -> None:
    key = key_of("resolve-bad-output")
    stored = _uncertain(store, key)
    with pytest.raises(InvalidOutputError, match="set"):
        store.resolve(ORG, key, ResolveAction.COMPLETE, output={1, 2})
    assert get(store, key) == stored


# -- issue 9: purges are visible to an in-process memo through one cheap read ----------------


def test_purge_epoch_grows_only_when_receipts_are_deleted(store: ReceiptStore, fake_clock: Any) -> None:
    assert store.purge_epoch() == 0
    make_completed(store, key_of("purged"))
    assert store.purge(older_than_s=10) == 0
    assert store.purge_epoch() == 0
    fake_clock.advance(11)
    assert store.purge(older_than_s=10) == 1
    assert store.purge_epoch() == 1
    make_completed(store, key_of("purged-2"))
    assert store.purge(org_id=ORG) == 1
    assert store.purge_epoch() == 2
