"""What a claim decides for one receipt, from the receipt alone: the rules every backend
shares (:func:`decide_disposition`, :func:`next_generation`)."""

from __future__ import annotations

from stores.types import ClaimDisposition, ClaimMode, Receipt, ReceiptStatus

__all__ = ["decide_disposition", "next_generation"]

_IN_FLIGHT = (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)


def decide_disposition(
    receipt: Receipt | None,
    mode: ClaimMode,
    now: float,
    stale_after_s: float | None,
    *,
    holder_gone: bool = False,
    retry_safe: bool = True,
) -> ClaimDisposition:
    """Decide a claim, exactly as the table in docs/receipts.md (Claims and dispositions).

    Args:
        receipt: the stored receipt, or None when there is none.
        mode: the claim mode.
        now: the store's clock, epoch seconds.
        stale_after_s: completed receipts older than this many seconds are re-run.
        holder_gone: the lease holder's process is known to be gone
            (:func:`stores.process.process_gone`): its lease counts as expired.
        retry_safe: the claim request's ``retry_safe``.

    Returns:
        The disposition; ``CLAIMED`` means the caller takes a new lease. For a receipt
        whose lease was lost, ``REUSED`` (a refresh's previous output, which the store
        restores as ``completed``) and ``UNCERTAIN`` (running, not retry-safe: the store
        records ``uncertain``) also change the stored receipt.

    Any live lease counts as running, even one held by the same owner: a run never
    runs one key twice at once.
    """
    if receipt is None:
        return ClaimDisposition.CLAIMED
    status = receipt.status
    if status is ReceiptStatus.COMPLETED:
        return _completed(receipt, mode, now, stale_after_s)
    if status in _IN_FLIGHT:
        if receipt.lease_live(now) and not holder_gone:
            if mode is ClaimMode.FORCE_REFRESH:
                return ClaimDisposition.BLOCKED_ACTIVE_LEASE
            return ClaimDisposition.RUNNING
        if status is ReceiptStatus.RUNNING and not retry_safe:
            return ClaimDisposition.UNCERTAIN
        if receipt.completed_at is not None:  # a lost refresh: its previous output stands
            return _completed(receipt, mode, now, stale_after_s)
        return ClaimDisposition.CLAIMED
    if status is ReceiptStatus.FAILED:
        return ClaimDisposition.FAILED if mode is ClaimMode.NORMAL else ClaimDisposition.CLAIMED
    if status is ReceiptStatus.UNCERTAIN:
        return ClaimDisposition.UNCERTAIN
    return ClaimDisposition.CLAIMED  # pending, skipped


def _completed(
    receipt: Receipt, mode: ClaimMode, now: float, stale_after_s: float | None
) -> ClaimDisposition:
    if mode is ClaimMode.FORCE_REFRESH:
        return ClaimDisposition.CLAIMED
    completed_at = receipt.completed_at or receipt.updated_at
    if stale_after_s is not None and now - completed_at > stale_after_s:
        return ClaimDisposition.CLAIMED
    return ClaimDisposition.REUSED


def next_generation(receipt: Receipt | None) -> int:
    """The execution generation a new claim of ``receipt`` runs under: 1 for a new
    receipt, +1 after a completion (forced or stale re-run) or a recorded failure, else
    unchanged (a lost owner's lease taken over, a released or resolved receipt)."""
    if receipt is None:
        return 1
    if receipt.status in (ReceiptStatus.COMPLETED, ReceiptStatus.FAILED):
        return receipt.generation + 1
    return receipt.generation
