"""The provider idempotency key follows the receipt's execution generation (issue 9, 4b).

The store side (when the generation moves) is in tests/stores/test_contract.py; here the
key itself: one per (receipt key, generation), never derived from the lease id.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from actors.results import batch_idempotency_key, provider_idempotency_key
from stores import ClaimMode, ClaimRequest, Completion, LeaseRef, Owner, SqliteReceiptStore

KEY = hashlib.sha256(b"idem").hexdigest()


def test_idempotency_key_depends_on_receipt_key_and_generation_only() -> None:
    assert provider_idempotency_key(KEY, 1) == provider_idempotency_key(KEY, 1)
    assert provider_idempotency_key(KEY, 1) != provider_idempotency_key(KEY, 2)
    assert provider_idempotency_key(KEY, 1) != provider_idempotency_key(KEY[::-1], 1)
    assert provider_idempotency_key(KEY, None) != provider_idempotency_key(KEY, 0)
    assert len(provider_idempotency_key(KEY, 1)) == 64


def test_idempotency_key_same_after_lost_owner_new_after_force_refresh(tmp_path: Path) -> None:
    """Claims through a real store: a crashed owner's lease taken over keeps the key."""
    now = [1_700_000_000.0]
    with SqliteReceiptStore(tmp_path / "r.db", clock=lambda: now[0]) as store:
        request = [ClaimRequest(KEY, "play", "tool", KEY)]
        first = store.claim_many("org", request, Owner("run-1"), lease_ttl_s=10.0)[0].receipt
        now[0] += 11  # the owner died: its lease ran out
        second = store.claim_many("org", request, Owner("run-2"), lease_ttl_s=10.0)[0].receipt
        assert first.lease_id != second.lease_id
        assert provider_idempotency_key(KEY, first.generation) == provider_idempotency_key(
            KEY, second.generation
        )
        assert second.lease_id
        done = store.complete_many("org", [Completion(KEY, second.lease_id, 1)], Owner("run-2"))
        assert done.ok
        forced = store.claim_many(
            "org", request, Owner("run-3"), lease_ttl_s=10.0, mode=ClaimMode.FORCE_REFRESH
        )
        third = forced[0].receipt
        assert provider_idempotency_key(KEY, third.generation) != provider_idempotency_key(
            KEY, second.generation
        )
        assert store.release("org", [LeaseRef(KEY, third.lease_id or "")], Owner("run-3")).ok


def test_batch_idempotency_key_is_order_free() -> None:
    a, b = provider_idempotency_key("a" * 64, 1), provider_idempotency_key("b" * 64, 1)
    assert batch_idempotency_key([a, b]) == batch_idempotency_key([b, a])
