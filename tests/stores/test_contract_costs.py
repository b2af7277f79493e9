"""The receipt store contract, what a receipt's call cost: written with its output by
``complete_many``, read back exactly; replaced by a refresh that stores a new output,
kept by everything else (every backend: conftest.BACKENDS).

Time only moves when a test advances the store's FakeClock.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from stores import Completion, Failure, FailureKind, Money, ReceiptStatus, ReceiptStore, ResolveAction

from .conftest import (
    CLAIMED,
    ME,
    ORG,
    OTHER,
    TTL_S,
    F,
    claim,
    claim_one,
    fail,
    get,
    key_of,
    lease_of,
)

PAID = Money(Decimal("0.0025"), "USD")

EXACT = {
    "trailing-zeros": Money(Decimal("0.00250"), "USD"),
    "tiny": Money(Decimal("1E-12"), "USD"),
    "large": Money(Decimal("999999999999999.999999999999999999"), "EUR"),  # the largest, finest
    "zero": Money(Decimal("0"), "JPY"),
    "own-unit": Money(Decimal("3"), "CRD"),
}


def _completed(store: ReceiptStore, key: str, cost: Money | None, output: Any = None) -> None:
    """``key`` claimed, marked running and completed by OTHER with ``cost``."""
    lease = lease_of(claim_one(store, key, OTHER))
    assert store.mark_running_many(ORG, [lease], OTHER).ok
    completion = Completion(lease.key, lease.lease_id, output or {"v": 1}, cost=cost)
    assert store.complete_many(ORG, [completion], OTHER).ok


def _cost(store: ReceiptStore, key: str) -> Money | None:
    receipt = get(store, key)
    assert receipt is not None
    return receipt.cost


@pytest.mark.parametrize("name", list(EXACT))
def test_cost_is_kept_exactly(store: ReceiptStore, name: str) -> None:
    """The amount comes back as the same Decimal (digits and exponent's value), the
    currency as written; a claim that reuses the output answers it too."""
    key = key_of(f"cost-{name}")
    want = EXACT[name]
    _completed(store, key, want)
    got = _cost(store, key)
    assert isinstance(got, Money) and isinstance(got.amount, Decimal)
    assert (got.amount, got.currency) == (want.amount, want.currency)
    assert str(got) == str(want)
    reused = claim_one(store, key, ME)
    assert reused.receipt.cost == want


def test_costs_of_one_write_each_go_to_their_key_none_stays_none(store: ReceiptStore) -> None:
    keys = [key_of(f"cost-many-{i}") for i in range(3)]
    leases = [lease_of(c) for c in claim(store, keys, ME)]
    costs = [PAID, None, Money("7", "EUR")]
    completions = [Completion(k.key, k.lease_id, 1, cost=c) for k, c in zip(leases, costs, strict=True)]
    assert store.complete_many(ORG, completions, ME).ok
    assert [r.cost for r in store.get_many(ORG, keys)] == costs  # type: ignore[union-attr]


def test_receipts_not_completed_have_no_cost(store: ReceiptStore) -> None:
    queued, failed = key_of("cost-queued"), key_of("cost-failed")
    (claimed,) = claim(store, [queued], ME)
    assert claimed.disposition is CLAIMED and claimed.receipt.cost is None
    assert fail(store, lease_of(claim_one(store, failed, ME))).ok
    assert (_cost(store, queued), _cost(store, failed)) == (None, None)


def _refresh(store: ReceiptStore, key: str) -> Any:
    """A forced refresh of a receipt completed at cost :data:`PAID`: its claim keeps the cost."""
    _completed(store, key, PAID, {"v": "old"})
    refresh = claim_one(store, key, ME, mode=F)
    assert refresh.disposition is CLAIMED
    assert refresh.receipt.cost == PAID and _cost(store, key) == PAID
    assert store.mark_running_many(ORG, [lease_of(refresh)], ME).ok
    return refresh


@pytest.mark.parametrize("new", [Money("0.004", "USD"), Money("1", "EUR"), None], ids=["usd", "eur", "none"])
def test_a_refresh_that_completes_replaces_the_cost(store: ReceiptStore, new: Money | None) -> None:
    """Paid again: the new completion's cost is the receipt's (None: unknown now)."""
    key = key_of("cost-refreshed")
    lease = lease_of(_refresh(store, key))
    assert store.complete_many(ORG, [Completion(lease.key, lease.lease_id, {"v": "new"}, cost=new)], ME).ok
    stored = get(store, key)
    assert stored is not None and (stored.output, stored.cost) == ({"v": "new"}, new)


@pytest.mark.parametrize("end", ["fail", "release", "lost"])
def test_a_refresh_storing_no_output_keeps_the_cost(store: ReceiptStore, fake_clock: Any, end: str) -> None:
    """A refresh that failed, was given back, or whose owner was lost: the old output and
    its cost stand."""
    key = key_of(f"cost-kept-{end}")
    refresh = _refresh(store, key)
    if end == "fail":
        assert fail(store, lease_of(refresh)).ok
    elif end == "release":
        assert store.release(ORG, [lease_of(refresh)], ME).ok
    else:
        fake_clock.advance(TTL_S + 1)
        assert claim_one(store, key, OTHER).receipt.cost == PAID  # restored to completed
    stored = get(store, key)
    assert stored is not None and stored.status is ReceiptStatus.COMPLETED
    assert (stored.output, stored.cost) == ({"v": "old"}, PAID)


def test_resolve_keeps_the_cost(store: ReceiptStore) -> None:
    """An uncertain refresh resolved (rerun, then fail) is the completed receipt it was,
    cost included."""
    key = key_of("cost-resolved")
    refresh = _refresh(store, key)
    lease = lease_of(refresh)
    sent = Failure(lease.key, lease.lease_id, "timed out after sending", FailureKind.TIMEOUT)
    assert store.mark_uncertain_many(ORG, [sent], ME).ok
    assert _cost(store, key) == PAID
    resolved = store.resolve(ORG, key, ResolveAction.RERUN)
    assert resolved is not None and resolved.cost == PAID and _cost(store, key) == PAID
