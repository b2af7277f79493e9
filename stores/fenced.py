"""The fenced writes every backend shares: items in, one bulk statement, a report per key.

A fenced write changes a receipt only while the writer still holds its lease (same
lease id, same owner, status queued or running). :class:`FencedWrites` turns each public
write of :class:`~stores.base.ReceiptStore` (mark running, renew, complete, fail, mark
uncertain, release) into items ``(key, lease_id, a, b)`` and one call of the backend's
:meth:`FencedWrites._fence`; :func:`refusal` says why a key was not written (the same rule
for every backend), or that a retried write already landed.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from stores.rows import error_text
from stores.rules import encode_for_store
from stores.types import (
    BatchRecord,
    Completion,
    Failure,
    FailureKind,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    RefusalReason,
)

__all__ = ["FenceItem", "FencedWrites", "refusal"]

FenceItem = tuple[str, str, str | None, str | None]
"""(receipt key, lease id, a, b): a is the output text (complete) or the error text
(fail, uncertain), b the failure kind; None where unused."""


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


class FencedWrites(abc.ABC):
    """The fenced bulk writes of a receipt store, on top of one backend method, ``_fence``.

    ``_fence(org_id, owner, op, items, refused, idempotent_status, ttl_s)`` applies ``op``
    (``running``, ``running_renew``, ``renew``, ``complete``, ``fail``, ``uncertain``,
    ``release``) to every item whose lease ``owner`` holds, in one statement, and returns
    the :class:`FenceReport` (keys not applied go to ``refused`` with :func:`refusal`).
    """

    @abc.abstractmethod
    def _fence(
        self,
        org_id: str,
        owner: Owner,
        op: str,
        items: list[FenceItem],
        refused: dict[str, Refusal],
        idempotent_status: ReceiptStatus | None = None,
        ttl_s: float | None = None,
        batches: Sequence[BatchRecord] = (),
    ) -> FenceReport:
        """Apply ``op`` to the items whose lease ``owner`` holds (each backend's one statement);
        for ``running``, in the same transaction, store each of ``batches`` whose every
        member was applied and set its members' ``batch_key``."""

    def mark_running_many(
        self,
        org_id: str,
        leases: Sequence[LeaseRef],
        owner: Owner,
        *,
        lease_ttl_s: float | None = None,
        batches: Sequence[BatchRecord] = (),
    ) -> FenceReport:
        op = "running" if lease_ttl_s is None else "running_renew"
        items = _lease_items(leases)
        if not batches:
            return self._fence(org_id, owner, op, items, {}, ttl_s=lease_ttl_s)
        return self._fence(org_id, owner, op, items, {}, ttl_s=lease_ttl_s, batches=batches)

    def renew_leases(
        self, org_id: str, leases: Sequence[LeaseRef], owner: Owner, *, lease_ttl_s: float
    ) -> FenceReport:
        return self._fence(org_id, owner, "renew", _lease_items(leases), {}, ttl_s=lease_ttl_s)

    def complete_many(self, org_id: str, completions: Sequence[Completion], owner: Owner) -> FenceReport:
        items: list[FenceItem] = []
        refused: dict[str, Refusal] = {}
        for completion in completions:
            text, why = encode_for_store(completion.output)
            if why is not None:
                refused[completion.key] = why
                continue
            items.append((completion.key, completion.lease_id, text, None))
        report = self._fence(org_id, owner, "complete", items, refused, ReceiptStatus.COMPLETED)
        applied = set(report.applied)
        return FenceReport(tuple(c.key for c in completions if c.key in applied), report.refused)

    def fail_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        return self._fence(org_id, owner, "fail", _failure_items(failures), {}, ReceiptStatus.FAILED)

    def mark_uncertain_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        items = _failure_items(failures)
        return self._fence(org_id, owner, "uncertain", items, {}, ReceiptStatus.UNCERTAIN)

    def release(self, org_id: str, leases: Sequence[LeaseRef], owner: Owner) -> FenceReport:
        return self._fence(org_id, owner, "release", _lease_items(leases), {})


def _lease_items(leases: Sequence[LeaseRef]) -> list[FenceItem]:
    return [(lease.key, lease.lease_id, None, None) for lease in leases]


def _failure_items(failures: Sequence[Failure]) -> list[FenceItem]:
    return [(f.key, f.lease_id, error_text(f.error), FailureKind(f.failure_kind).value) for f in failures]
