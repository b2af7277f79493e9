"""One claim transaction's decisions, backend-neutral (SQLite and Postgres share them).

A backend reads the requested rows inside its write transaction, hands them to
:func:`plan_claims`, and applies the plan with three statements: upsert the claimed
rows (:attr:`ClaimPlan.writes`), restore lost refreshes as completed
(:attr:`ClaimPlan.restored`), record lost non-retry-safe runs as uncertain
(:attr:`ClaimPlan.lost`). The answers are :attr:`ClaimPlan.decided`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from stores.dispositions import decide_disposition, lost_lease_status, next_generation, serves_last_good
from stores.rules import IN_FLIGHT, KEEPS_OUTPUT, LOST_WHILE_RUNNING, NO_LEASE, holder_gone, owner_identity
from stores.types import Claim, ClaimDisposition, ClaimMode, ClaimRequest, Owner, Receipt, ReceiptStatus

__all__ = ["ClaimPlan", "already_taken", "plan_claims", "settled_by_read"]

_SETTLED = (ReceiptStatus.COMPLETED, ReceiptStatus.FAILED, ReceiptStatus.UNCERTAIN)
"""Statuses whose claim answer a plain read decides alone (no lease to judge)."""


@attrs.define
class ClaimPlan:
    """What one claim transaction writes and answers."""

    identity: tuple[str | None, int | None, float | None]
    """(host, pid, started_at) recorded with every new lease."""
    decided: dict[str, Claim] = attrs.Factory(dict)
    """The answer per key (the receipt as it will stand after the writes)."""
    writes: list[tuple[Any, ...]] = attrs.Factory(list)
    """Claimed rows: (key, scope, tool_id, input_hash, lease_id, attempts, created_at,
    generation, status, input_text). Output and completed_at are kept when the row was
    completed, or queued/running with ``completed_at`` set (see ``KEEPS_OUTPUT``), else
    cleared; an ``input_text`` of None keeps the row's."""
    restored: list[str] = attrs.Factory(list)
    """Keys of lost refreshes to set ``completed`` with no lease (status, lease fields)."""
    lost: list[str] = attrs.Factory(list)
    """Keys to set ``uncertain`` (error :data:`LOST_WHILE_RUNNING`, no lease expiry)."""


def settled_by_read(
    requests: Sequence[ClaimRequest],
    existing: Mapping[str, Receipt],
    now: float,
    mode: ClaimMode,
    stale_after_s: float | None,
) -> tuple[dict[str, Claim], list[ClaimRequest]]:
    """Split a claim on a plain read (no write transaction): (answers, misses).

    A receipt read ``completed``, ``failed`` or ``uncertain`` holds no lease, so the
    table of :func:`~stores.dispositions.decide_disposition` answers it from the read alone
    when the answer writes nothing (``REUSED``, ``FAILED``, ``UNCERTAIN``): what a claim
    transaction would answer at the read's instant. So is a refresh running under a live
    lease whose holder is not known to be gone, for an ordinary claim of its last good
    output (:func:`~stores.dispositions.serves_last_good`: ``REUSED``). Everything else (no receipt, a
    lease to judge, ``CLAIMED``: a refresh, a stale output, a retried failure) is a miss
    for the claim transaction, which reads its rows again.

    Args:
        requests: unique keys.
        existing: key -> receipt, from a read of the store (missing keys absent).
        now: the store's clock at the read, epoch seconds.
        mode / stale_after_s: the claim's.
    """
    answered: dict[str, Claim] = {}
    misses: list[ClaimRequest] = []
    claimed = ClaimDisposition.CLAIMED
    seen: dict[Any, bool] = {}  # holder process -> gone, asked once per read
    for request in requests:
        old = existing.get(request.key)
        if old is not None and old.status in _SETTLED:
            disposition = decide_disposition(old, mode, now, stale_after_s)
            if disposition is not claimed:
                answered[request.key] = Claim(disposition, old)
                continue
        elif (
            old is not None and old.status in IN_FLIGHT and old.lease_live(now)
            and serves_last_good(old, mode, now, stale_after_s) and not holder_gone(old, now, seen)
        ):  # fmt: skip
            answered[request.key] = Claim(ClaimDisposition.REUSED, old)
            continue
        misses.append(request)
    return answered, misses


def already_taken(request: ClaimRequest, receipt: Receipt, owner: Owner) -> bool:
    """Whether ``receipt`` is already leased under ``request.lease_id`` to ``owner`` (run
    id and attempt), queued or running: an earlier attempt of this very claim committed
    (its answer lost with its connection). Such a claim is answered ``CLAIMED`` as the
    receipt stands, live or lapsed: a lease id is never made twice, and nobody else
    took it (taking it would have changed the id)."""
    return (
        request.lease_id is not None
        and receipt.lease_id == request.lease_id
        and receipt.status in IN_FLIGHT
        and receipt.lease_owner_run_id == owner.run_id
        and receipt.lease_owner_attempt == owner.run_attempt
    )


def plan_claims(
    org_id: str,
    requests: Sequence[ClaimRequest],
    existing: Mapping[str, Receipt],
    owner: Owner,
    now: float,
    lease_ttl_s: float,
    mode: ClaimMode,
    stale_after_s: float | None,
    running: Collection[str] = frozenset(),
) -> ClaimPlan:
    """Decide every request (unique keys) against the rows read in the transaction.

    A key in ``running`` that is claimed is written ``running`` (its caller holds a slot:
    claimed straight into running), else ``queued``; ``plan.writes`` carry the status."""
    plan = ClaimPlan(owner_identity(owner))
    host, pid, started_at = plan.identity
    expires = now + lease_ttl_s
    seen: dict[Any, bool] = {}  # holder process -> gone, asked once per claim
    claimed, queued, started = ClaimDisposition.CLAIMED, ReceiptStatus.QUEUED, ReceiptStatus.RUNNING
    run_id, run_attempt = owner.run_id, owner.run_attempt
    # One read of the OS's random source for every lease id this call may need:
    # 16 random bytes (32 hex digits) per request, as unique as uuid4().hex.
    random_hex = os.urandom(16 * len(requests)).hex()
    for i, request in enumerate(requests):
        key = request.key
        old = existing.get(key)
        if old is not None and already_taken(request, old, owner):
            plan.decided[key] = Claim(claimed, old)
            continue
        gone = holder_gone(old, now, seen)
        disposition = decide_disposition(
            old, mode, now, stale_after_s, holder_gone=gone, retry_safe=request.retry_safe
        )
        if disposition is not claimed:
            assert old is not None
            after = lost_lease_status(old, now, holder_gone=gone, retry_safe=request.retry_safe)
            if after is ReceiptStatus.COMPLETED:  # a lost refresh: its previous output stands
                old = attrs.evolve(old, status=ReceiptStatus.COMPLETED, updated_at=now, **NO_LEASE)
                plan.restored.append(key)
            elif after is ReceiptStatus.UNCERTAIN:  # answered REUSED when it holds a last good output
                old = attrs.evolve(
                    old, status=ReceiptStatus.UNCERTAIN, error=LOST_WHILE_RUNNING, failure_kind=None,
                    lease_expires_at=None, updated_at=now,
                )  # fmt: skip
                plan.lost.append(key)
            plan.decided[key] = Claim(disposition, old)
            continue
        lease_id = request.lease_id or random_hex[32 * i : 32 * i + 32]
        generation = next_generation(old)
        if old is None:
            attempts, created, output, completed_at = 1, now, None, None
        else:
            attempts, created = old.attempts + 1, old.created_at
            keeps = old.completed_at is not None and old.status in KEEPS_OUTPUT
            output, completed_at = (old.output, old.completed_at) if keeps else (None, None)
        status = started if key in running else queued
        input_text = request.input_text if request.input_text is not None or old is None else old.input_text
        plan.writes.append(
            (key, request.scope, request.tool_id, request.input_hash, lease_id, attempts, created, generation,
             status.value, request.input_text)
        )  # fmt: skip
        receipt = Receipt(
            key, org_id, request.scope, request.tool_id, status, request.input_hash, output, None,
            None, lease_id, run_id, run_attempt, expires, attempts, created, now, completed_at,
            generation, host, pid, started_at, input_text,
        )  # fmt: skip
        plan.decided[key] = Claim(claimed, receipt)
    return plan
