"""Fenced writes as items, and why a key was refused: the same for every backend.

A fenced write changes a receipt only while the writer still holds its lease (same
lease id, same owner, status queued or running). Each public write of
:class:`~stores.base.ReceiptStore` (mark running, renew, complete, fail, mark uncertain,
release) becomes items ``(key, lease_id, a, b)`` (:func:`lease_items`,
:func:`completion_items`, :func:`failure_items`) and one call of the backend's
``ReceiptStore._fence``; :func:`refusal` says why a key was not written (the same rule for
every backend), or that a retried write already landed.
"""

from __future__ import annotations

from collections.abc import Sequence

from stores.rows import error_text
from stores.rules import encode_for_store
from stores.types import (
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    RefusalReason,
)

__all__ = ["FenceItem", "completion_items", "failure_items", "lease_items", "refusal"]

FenceItem = tuple[str, str, str | None, str | None]
"""(receipt key, lease id, a, b): a is the output text (complete) or the error text
(fail, uncertain), b the cost's text (complete: ``"0.0025 USD"``, None when unknown) or
the failure kind (fail, uncertain); None where unused."""


def lease_items(leases: Sequence[LeaseRef]) -> list[FenceItem]:
    """The items of a write that names leases only (mark running, renew, release)."""
    return [(lease.key, lease.lease_id, None, None) for lease in leases]


def failure_items(failures: Sequence[Failure]) -> list[FenceItem]:
    """The items of a fail or mark-uncertain write: error text as stored, failure kind."""
    return [(f.key, f.lease_id, error_text(f.error), FailureKind(f.failure_kind).value) for f in failures]


def completion_items(completions: Sequence[Completion]) -> tuple[list[FenceItem], dict[str, Refusal]]:
    """(items, refused): the items of a complete write, with each output and cost as
    column text (a cost of None stays None); a key whose output the store cannot take is
    refused instead (no item)."""
    items: list[FenceItem] = []
    refused: dict[str, Refusal] = {}
    for completion in completions:
        text, why = encode_for_store(completion.output)
        if why is not None:
            refused[completion.key] = why
            continue
        cost = None if completion.cost is None else str(completion.cost)
        items.append((completion.key, completion.lease_id, text, cost))
    return items, refused


def refusal(
    receipt: Receipt | None, lease_id: str, owner: Owner, idempotent_status: ReceiptStatus | None
) -> Refusal | None:
    """Why a fenced write of ``lease_id`` by ``owner`` was not applied to ``receipt``.

    None: the write counts as applied (a retried write that already landed: the lease is
    still ours and the receipt already has ``idempotent_status``).
    """
    if receipt is None:
        return Refusal(RefusalReason.MISSING, "no such receipt in this org")
    ours = receipt.lease_id == lease_id and receipt.owner == owner
    if ours and receipt.status is idempotent_status:
        return None  # a retried write that already landed
    if receipt.status is ReceiptStatus.COMPLETED:
        return Refusal(RefusalReason.COMPLETED_BY_OTHER, "already completed", receipt)
    return Refusal(
        RefusalReason.LEASE_LOST,
        f"lease {lease_id} is not held by {owner.run_id}/{owner.run_attempt} "
        f"(status {receipt.status.value}, lease {receipt.lease_id})",
        receipt,
    )
