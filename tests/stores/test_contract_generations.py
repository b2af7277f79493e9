"""The receipt store contract across attempts: refreshes that keep the old output,
generations, lease holders that are gone, uncertain receipts and their resolution, the
purge epoch (every backend: conftest.BACKENDS).

Behaviour reference: ../shared/SEMANTICS.md (Claims, Leases) and stores/base.py.
Time only moves when a test advances the store's FakeClock.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import attrs
import psutil
import pytest

from stores import (
    REFRESH_LOST,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Failure,
    FailureKind,
    InvalidOutputError,
    Owner,
    Receipt,
    ReceiptStatus,
    ReceiptStore,
    RefusalReason,
    ResolveAction,
    current_process_identity,
)

from .conftest import (
    CLAIMED,
    IN_FLIGHT,
    ME,
    ORG,
    OTHER,
    OTHER_ORG,
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
    request_for,
)

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


def _assert_old_output_back(
    store: ReceiptStore, key: str, before: Receipt, now: float, error: str | None = None
) -> None:
    """``error``: REFRESH_LOST for a lost refresh (its request may have gone), else None."""
    stored = get(store, key)
    assert stored is not None
    assert stored.status is ReceiptStatus.COMPLETED
    assert (stored.lease_id, stored.owner) == (None, None)
    assert (stored.output, stored.completed_at, stored.error, stored.failure_kind) == (
        before.output,
        before.completed_at,
        error,
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
    running = get(store, key)
    assert running is not None  # while it runs, an ordinary claim takes the last good output
    assert_untouched(claim_one(store, key, OTHER, mode=mode), store, ClaimDisposition.REUSED, running)
    now = fake_clock.advance(TTL_S + 1)
    reused = claim_one(store, key, OTHER, mode=mode)
    assert reused.disposition is ClaimDisposition.REUSED
    assert reused.receipt.output == {"v": "old"} and reused.receipt.status is ReceiptStatus.COMPLETED
    _assert_old_output_back(store, key, before, now, REFRESH_LOST)
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


# -- issue 26: a refresh under way, or whose own outcome is uncertain, keeps the last good --
# -- output for ordinary claims ------------------------------------------------------------


@pytest.mark.parametrize("running", [False, True], ids=["queued", "running"])
@pytest.mark.parametrize("how", ["forced", "stale"])
def test_refresh_under_way_leaves_last_good_output_to_ordinary_claims_at_once(
    store: ReceiptStore, fake_clock: Any, how: str, running: bool
) -> None:
    key = key_of(f"refresh-under-way-{how}-{running}")
    make_completed(store, key, {"v": "old"})
    if how == "stale":
        fake_clock.advance(100)
        refresh = claim_one(store, key, stale_after_s=10)
    else:
        refresh = claim_one(store, key, mode=F)
    assert refresh.disposition is CLAIMED
    if running:
        assert store.mark_running_many(ORG, [lease_of(refresh)], ME).ok
    live = get(store, key)
    assert live is not None and live.status in IN_FLIGHT and live.output == {"v": "old"}
    fake_clock.advance(1)
    for owner in (OTHER, ME):  # another system, or the refreshing owner's own other calls
        for mode in (N, R):  # ordinary claims get the last good output, nothing written
            for stale in (None, 10_000.0):
                answer = claim_one(store, key, owner, mode=mode, stale_after_s=stale)
                assert_untouched(answer, store, ClaimDisposition.REUSED, live)
            settled, misses = store.read_settled(ORG, [request_for(key)], mode=mode)
            assert misses == [] and settled[key] == Claim(ClaimDisposition.REUSED, live)
    # a forced re-run, and an ordinary claim for which the output is too old, wait for it
    assert_untouched(claim_one(store, key, OTHER, mode=F), store, ClaimDisposition.BLOCKED_ACTIVE_LEASE, live)
    too_old = claim_one(store, key, OTHER, stale_after_s=10 if how == "stale" else 0.5)
    assert_untouched(too_old, store, ClaimDisposition.RUNNING, live)


def test_first_run_under_way_has_no_last_good_output(store: ReceiptStore, fake_clock: Any) -> None:
    key = key_of("first-run-under-way")
    first = claim_one(store, key)
    assert store.mark_running_many(ORG, [lease_of(first)], ME).ok
    live = get(store, key)
    assert live is not None
    for mode in (N, R):
        assert_untouched(claim_one(store, key, OTHER, mode=mode), store, ClaimDisposition.RUNNING, live)
    assert_untouched(claim_one(store, key, OTHER, mode=F), store, ClaimDisposition.BLOCKED_ACTIVE_LEASE, live)


# -- issue 26: a refresh whose own outcome is uncertain keeps the last good output ----------


def _refresh_uncertain(store: ReceiptStore, fake_clock: Any, how: str) -> tuple[Receipt, Receipt]:
    """A refresh (forced, or a stale re-run) of a completed receipt, marked running, whose
    outcome became uncertain: recorded by its owner (a connection reset after sending), or
    found by another claim after its lease expired or its process died. Returns (the
    receipt before the refresh, the uncertain receipt as stored)."""
    key = key_of(f"refresh-uncertain-{how}")
    owner = _dead_process_owner("run-refresh") if how == "dead" else ME
    make_completed(store, key, {"v": "old"})
    before = get(store, key)
    assert before is not None
    if how == "stale":
        fake_clock.advance(100)
        refresh = claim_one(store, key, owner, stale_after_s=10)
    else:
        refresh = claim_one(store, key, owner, mode=F)
    assert refresh.disposition is CLAIMED
    assert store.mark_running_many(ORG, [lease_of(refresh)], owner).ok
    fake_clock.advance(1)
    if how in ("marked", "stale"):
        error = "connection reset after sending"
        failure = Failure(key, lease_of(refresh).lease_id, error, FailureKind.TRANSIENT)
        assert store.mark_uncertain_many(ORG, [failure], owner).applied == (key,)
    else:  # the owner is lost: its lease expired, or its process is gone
        if how == "expired":
            fake_clock.advance(TTL_S + 1)
        request = attrs.evolve(request_for(key), retry_safe=False)
        (found,) = store.claim_many(ORG, [request], OTHER, lease_ttl_s=TTL_S)
        assert found.disposition is ClaimDisposition.REUSED  # an ordinary claim: the last good output
        assert found.receipt.output == {"v": "old"} and found.receipt.status is ReceiptStatus.UNCERTAIN
        assert found.receipt.error and "not retry-safe" in found.receipt.error
        assert found.receipt == get(store, key)
    stored = get(store, key)
    assert stored is not None and stored.status is ReceiptStatus.UNCERTAIN
    assert (stored.output, stored.completed_at) == ({"v": "old"}, before.completed_at)
    assert stored.lease_expires_at is None
    return before, stored


@pytest.mark.parametrize("how", ["marked", "stale", "expired", "dead"])
def test_refresh_uncertain_leaves_last_good_output_to_ordinary_claims_only(
    store: ReceiptStore, fake_clock: Any, how: str
) -> None:
    _, stored = _refresh_uncertain(store, fake_clock, how)
    for mode in (N, R):  # ordinary claims, with or without a staleness the output meets
        for stale in (None, 10_000.0):
            assert_untouched(
                claim_one(store, stored.key, OTHER, mode=mode, stale_after_s=stale),
                store, ClaimDisposition.REUSED, stored,
            )  # fmt: skip
    # a forced re-run, and a re-run of an output too old for the claim, meet the uncertainty
    assert_untouched(claim_one(store, stored.key, OTHER, mode=F), store, ClaimDisposition.UNCERTAIN, stored)
    fake_clock.advance(100)
    stale = claim_one(store, stored.key, OTHER, stale_after_s=10)
    assert_untouched(stale, store, ClaimDisposition.UNCERTAIN, stored)
    request = attrs.evolve(request_for(stored.key), retry_safe=False)
    (unsafe,) = store.claim_many(ORG, [request], OTHER, lease_ttl_s=TTL_S, mode=F)
    assert_untouched(unsafe, store, ClaimDisposition.UNCERTAIN, stored)


@pytest.mark.parametrize("action", [ResolveAction.RERUN, ResolveAction.FAIL])
def test_refresh_uncertain_resolved_rerun_or_fail_is_completed_with_last_good_output(
    store: ReceiptStore, fake_clock: Any, action: ResolveAction
) -> None:
    before, stored = _refresh_uncertain(store, fake_clock, "marked")
    now = fake_clock.advance(5)
    resolved = store.resolve(ORG, stored.key, action, note="the provider shows no charge")
    assert resolved is not None and resolved == get(store, stored.key)
    assert (resolved.status, resolved.output, resolved.completed_at) == (
        ReceiptStatus.COMPLETED, {"v": "old"}, before.completed_at,
    )  # fmt: skip
    assert resolved.error is resolved.failure_kind is resolved.lease_id is resolved.owner is None
    assert resolved.updated_at == now
    assert_untouched(claim_one(store, stored.key, OTHER), store, ClaimDisposition.REUSED, resolved)
    forced = claim_one(store, stored.key, OTHER, mode=F)  # a new refresh runs it again
    assert forced.disposition is CLAIMED and forced.receipt.output == {"v": "old"}


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


@pytest.mark.parametrize("mode", [R, F])
def test_generation_same_after_a_recorded_timeout(
    store: ReceiptStore, fake_clock: Any, mode: ClaimMode
) -> None:
    """Issue 26: no answer came to a request that may have reached the provider; the next
    attempt asks again under the same idempotency key (a provider that has the answer
    replays it instead of billing again)."""
    key = key_of("generation-timeout")
    first = claim_one(store, key)
    assert store.mark_running_many(ORG, [lease_of(first)], ME).ok
    assert fail(store, lease_of(first), kind=FailureKind.TIMEOUT).ok
    fake_clock.advance(1)
    assert claim_one(store, key).disposition is ClaimDisposition.FAILED  # normal: the recorded failure
    again = claim_one(store, key, mode=mode)
    assert again.disposition is CLAIMED and again.receipt.generation == 1
    assert fail(store, lease_of(again), kind=FailureKind.TRANSIENT).ok  # an answer: an error
    assert claim_one(store, key, mode=mode).receipt.generation == 2


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
