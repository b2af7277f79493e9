"""The receipt store contract, what it keeps: outputs, purges, org isolation, the backend
matrix, outputs no store can hold (every backend: conftest.BACKENDS).

Behaviour reference: ../shared/SEMANTICS.md (Claims, Leases) and stores/base.py.
Time only moves when a test advances the store's FakeClock.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable
from typing import Any

import pytest

from stores import (
    MAX_OUTPUT_BYTES,
    ClaimDisposition,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    FenceReport,
    LeaseRef,
    Owner,
    ReceiptStatus,
    ReceiptStore,
    RefusalReason,
    output_too_large_error,
)
from stores.codec import MAX_OUTPUT_DEPTH

from .conftest import (
    CLAIMED,
    ME,
    OPS,
    ORG,
    OTHER,
    OTHER_ORG,
    TTL_S,
    F,
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
    make_queued,
    make_running,
    nested,
    same,
)

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
