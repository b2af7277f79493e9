"""The receipt store contract, inputs: a receipt keeps what its call was for
(``ClaimRequest.input_text``: the canonical input, or the readable digest its tool chose),
whatever becomes of it (completed, reused, failed, uncertain, claimed again), cut to
``stores.rows.INPUT_TEXT_MAX_CHARS`` (every backend: conftest.BACKENDS)."""

from __future__ import annotations

import pytest

from stores import (
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Failure,
    FailureKind,
    Owner,
    ReceiptStatus,
    ReceiptStore,
)
from stores.rows import INPUT_TEXT_MAX_CHARS

from .conftest import CLAIMED, ME, ORG, OTHER, TTL_S, complete, get, key_of, lease_of

EMAIL = '{"email":"ada@example.com"}'


def _claim(
    store: ReceiptStore, key: str, text: str | None, owner: Owner = ME, mode: ClaimMode = ClaimMode.NORMAL
) -> object:
    (result,) = store.claim_many(
        ORG,
        [ClaimRequest(key, "play", "verify_email", key_of("input:" + key), input_text=text)],
        owner,
        lease_ttl_s=TTL_S,
        mode=mode,
    )
    return result


def test_receipt_keeps_its_input_through_completion_and_reuse(store: ReceiptStore) -> None:
    key = key_of("kept")
    claimed = _claim(store, key, EMAIL)
    assert claimed.disposition is CLAIMED and claimed.receipt.input_text == EMAIL  # type: ignore[attr-defined]
    lease = lease_of(claimed)  # type: ignore[arg-type]
    assert store.mark_running_many(ORG, [lease], ME).ok
    assert complete(store, lease, {"valid": True}).ok
    stored = get(store, key)
    assert stored is not None and stored.status is ReceiptStatus.COMPLETED
    assert stored.input_text == EMAIL
    reused = _claim(store, key, None, OTHER)
    assert reused.disposition is ClaimDisposition.REUSED  # type: ignore[attr-defined]
    assert reused.receipt.input_text == EMAIL  # type: ignore[attr-defined]


@pytest.mark.parametrize("end", ["failed", "uncertain"])
def test_failed_and_uncertain_receipts_say_what_they_were_for(store: ReceiptStore, end: str) -> None:
    key = key_of(end)
    lease = lease_of(_claim(store, key, EMAIL))  # type: ignore[arg-type]
    failure = Failure(key, lease.lease_id, "provider said no", FailureKind.PERMANENT)
    if end == "failed":
        assert store.fail_many(ORG, [failure], ME).ok
    else:
        assert store.mark_running_many(ORG, [lease], ME).ok
        assert store.mark_uncertain_many(ORG, [failure], ME).ok
    stored = get(store, key)
    assert stored is not None and stored.status.value == end
    assert stored.input_text == EMAIL


def test_claim_without_input_text_keeps_the_stored_one_and_a_new_one_replaces_it(store: ReceiptStore) -> None:
    key = key_of("again")
    lease = lease_of(_claim(store, key, EMAIL))  # type: ignore[arg-type]
    assert store.fail_many(ORG, [Failure(key, lease.lease_id, "x", FailureKind.TRANSIENT)], ME).ok
    again = _claim(store, key, None, mode=ClaimMode.RETRY_FAILED)  # a salvage replay knows no input
    assert again.disposition is CLAIMED and again.receipt.input_text == EMAIL  # type: ignore[attr-defined]
    assert get(store, key).input_text == EMAIL  # type: ignore[union-attr]
    assert store.release(ORG, [lease_of(again)], ME).ok  # type: ignore[arg-type]
    digest = _claim(store, key, "a…@example.com")  # the tool now keeps a digest instead
    assert digest.receipt.input_text == "a…@example.com"  # type: ignore[attr-defined]
    assert store.release(ORG, [lease_of(digest)], ME).ok  # type: ignore[arg-type]
    nothing = _claim(store, key, "")  # the tool keeps nothing: what was kept goes
    assert nothing.receipt.input_text == ""  # type: ignore[attr-defined]
    assert get(store, key).input_text == ""  # type: ignore[union-attr]


def test_a_long_input_is_kept_cut_to_the_bound(store: ReceiptStore) -> None:
    key = key_of("long")
    text = '{"note":"' + "é" * (3 * INPUT_TEXT_MAX_CHARS) + '"}'
    claimed = _claim(store, key, text)
    kept = get(store, key)
    assert kept is not None and kept.input_text == claimed.receipt.input_text  # type: ignore[attr-defined]
    assert kept.input_text is not None and len(kept.input_text) == INPUT_TEXT_MAX_CHARS
    assert kept.input_text == text[: INPUT_TEXT_MAX_CHARS - 1] + "…"


def test_input_text_with_nul_and_a_lone_surrogate_is_kept_escaped(store: ReceiptStore) -> None:
    key = key_of("odd")
    _claim(store, key, "a\x00b\udc80c")  # a tool's digest may hold anything
    kept = get(store, key)
    assert kept is not None and kept.input_text == "a\\x00b\\udc80c"
