"""What a claim decides for one receipt, from the receipt alone: the rules every backend
shares (:func:`decide_disposition`, :func:`next_generation`)."""

from __future__ import annotations

from stores.types import ClaimDisposition, ClaimMode, FailureKind, Receipt, ReceiptStatus

__all__ = [
    "REFRESH_LOST",
    "decide_disposition",
    "keeps_batch",
    "lost_lease_status",
    "next_generation",
    "serves_last_good",
]

REFRESH_LOST = (
    "a refresh of this receipt was lost (its owner gone) after its request may have been sent: "
    "the last good output stands, and the next refresh sends that request again under its key"
)
"""The ``error`` a lost refresh's receipt is restored ``completed`` with (its last good
output, the lost refresh's generation and batch request kept): the next claim that runs
it keeps that generation, so the provider sees the lost request's idempotency key again
(:func:`next_generation`). A claim clears it."""

_IN_FLIGHT = (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
_HOLDING = (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING, ReceiptStatus.UNCERTAIN)
"""Statuses in which a receipt may hold a refresh's previous output (its last good one)."""


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
        whose lease was lost, the store first records what :func:`lost_lease_status`
        says (a refresh's previous output restored as ``completed``, or ``uncertain``
        for a running call that is not retry-safe), and the answer is this table's for
        the receipt so changed.

    Any live lease counts as running, even one held by the same owner: a run never
    runs one key twice at once.

    An ``uncertain`` receipt that still holds a previous output (a refresh whose own
    outcome is uncertain) answers an ordinary claim (normal or retry_failed, the output
    fresh enough) ``REUSED``: the last good output stands. A forced or stale re-run
    meets the uncertainty (``UNCERTAIN``), as does every claim of one with no output.

    Likewise a refresh still running (queued or running under a live lease, holding the
    previous output) answers those ordinary claims ``REUSED`` at once
    (:func:`serves_last_good`): they never wait on the refresh. Forced and stale re-runs
    wait for it (``BLOCKED_ACTIVE_LEASE``, ``RUNNING``).
    """
    if receipt is None:
        return ClaimDisposition.CLAIMED
    status = receipt.status
    if status is ReceiptStatus.COMPLETED:
        return _completed(receipt, mode, now, stale_after_s)
    if status in _IN_FLIGHT:
        if receipt.lease_live(now) and not holder_gone:
            if serves_last_good(receipt, mode, now, stale_after_s):
                return ClaimDisposition.REUSED
            if mode is ClaimMode.FORCE_REFRESH:
                return ClaimDisposition.BLOCKED_ACTIVE_LEASE
            return ClaimDisposition.RUNNING
        after = lost_lease_status(receipt, now, holder_gone=holder_gone, retry_safe=retry_safe)
        if after is ReceiptStatus.UNCERTAIN:
            return _uncertain(receipt, mode, now, stale_after_s)
        if after is ReceiptStatus.COMPLETED:  # a lost refresh: its previous output stands
            return _completed(receipt, mode, now, stale_after_s)
        return ClaimDisposition.CLAIMED
    if status is ReceiptStatus.FAILED:
        return ClaimDisposition.FAILED if mode is ClaimMode.NORMAL else ClaimDisposition.CLAIMED
    if status is ReceiptStatus.UNCERTAIN:
        return _uncertain(receipt, mode, now, stale_after_s)
    return ClaimDisposition.CLAIMED  # pending, skipped


def lost_lease_status(
    receipt: Receipt, now: float, *, holder_gone: bool = False, retry_safe: bool = True
) -> ReceiptStatus | None:
    """What a claim that finds ``receipt``'s lease lost (expired, or its holder's process
    gone) records before it decides: ``UNCERTAIN`` for a ``running`` receipt claimed with
    ``retry_safe=False`` (the request may have reached the provider; a previous output
    is kept), ``COMPLETED`` for one holding a previous output (a lost refresh), else None
    (nothing recorded: the receipt is claimable). None too while the lease is live or
    the receipt is not queued or running."""
    if receipt.status not in _IN_FLIGHT or (receipt.lease_live(now) and not holder_gone):
        return None
    if receipt.status is ReceiptStatus.RUNNING and not retry_safe:
        return ReceiptStatus.UNCERTAIN
    if receipt.completed_at is not None:
        return ReceiptStatus.COMPLETED
    return None


def serves_last_good(receipt: Receipt, mode: ClaimMode, now: float, stale_after_s: float | None) -> bool:
    """Whether a claim in ``mode`` takes ``receipt``'s last good output while a refresh of it
    runs or has an uncertain outcome: the receipt is queued, running or uncertain and still
    holds a previous output (``completed_at`` set), the claim is ordinary (normal or
    retry_failed) and that output is fresh for its ``stale_after_s`` (``now``: the
    store's clock, epoch seconds)."""
    if receipt.completed_at is None or receipt.status not in _HOLDING:
        return False
    return _completed(receipt, mode, now, stale_after_s) is ClaimDisposition.REUSED


def _uncertain(
    receipt: Receipt, mode: ClaimMode, now: float, stale_after_s: float | None
) -> ClaimDisposition:
    """An uncertain receipt: its last good output (if any) answers ordinary claims."""
    if serves_last_good(receipt, mode, now, stale_after_s):
        return ClaimDisposition.REUSED
    return ClaimDisposition.UNCERTAIN


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
    unchanged (a lost owner's lease taken over, a released or resolved receipt, a
    failure of kind ``timeout``: no answer came to a request that may have reached the
    provider, so the next attempt asks under the same idempotency key; a completed
    receipt restored after a lost refresh, :data:`REFRESH_LOST`, likewise)."""
    if receipt is None:
        return 1
    status = receipt.status
    if status is ReceiptStatus.COMPLETED and receipt.error == REFRESH_LOST:
        return receipt.generation
    if status is ReceiptStatus.COMPLETED or (
        status is ReceiptStatus.FAILED and receipt.failure_kind is not FailureKind.TIMEOUT
    ):
        return receipt.generation + 1
    return receipt.generation


def keeps_batch(receipt: Receipt) -> bool:
    """Whether a claim that takes ``receipt`` sends its recorded batch request again:
    it names one (``batch_key``) and the claim keeps its generation (the request it
    names is this execution's)."""
    return receipt.batch_key is not None and next_generation(receipt) == receipt.generation
