"""One claim transaction's decisions, backend-neutral (SQLite and Postgres share them).

A backend reads the requested rows inside its write transaction, hands them to
:func:`plan_claims`, and applies the plan with three statements: upsert the claimed
rows (:attr:`ClaimPlan.writes`), restore lost refreshes as completed
(:attr:`ClaimPlan.restored`), record uncertain outcomes (:attr:`ClaimPlan.lost`: lost
non-retry-safe runs, and members of a batch request that cannot be sent again as it
was). The answers are :attr:`ClaimPlan.decided`.

A receipt taken with its generation kept whose execution was recorded in a batch request
(``batch_key``, :func:`stores.dispositions.keeps_batch`) is taken with every other member
of that request, in the same transaction, or not at all (:func:`batch_members_wanted`
says which records the backend reads first, with their members' rows): the request is
then sent again whole, under its key. When a member cannot be taken (gone, completed,
failed, uncertain, sent since in another request, held by a live lease), the members
that could are recorded ``uncertain``: never bought again silently.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from stores.dispositions import (
    REFRESH_LOST,
    decide_disposition,
    keeps_batch,
    lost_lease_status,
    next_generation,
    serves_last_good,
)
from stores.rules import IN_FLIGHT, KEEPS_OUTPUT, LOST_WHILE_RUNNING, NO_LEASE, holder_gone, owner_identity
from stores.types import (
    BatchRecord,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Owner,
    Receipt,
    ReceiptStatus,
)

__all__ = [
    "ClaimPlan",
    "already_taken",
    "batch_members_wanted",
    "batch_unsendable",
    "plan_claims",
    "settled_by_read",
]

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
    generation, status, input_text, batch_key). Output and completed_at are kept when the
    row was completed, or queued/running with ``completed_at`` set (see ``KEEPS_OUTPUT``),
    else cleared; an ``input_text`` of None keeps the row's; ``batch_key`` is kept with
    the generation, else cleared."""
    restored: list[str] = attrs.Factory(list)
    """Keys of lost refreshes to set ``completed`` with no lease (status, lease fields),
    ``error`` :data:`~stores.dispositions.REFRESH_LOST`, generation and ``batch_key`` kept."""
    lost: list[tuple[str, str]] = attrs.Factory(list)
    """(key, error) to set ``uncertain`` (no lease expiry): :data:`LOST_WHILE_RUNNING`,
    or why its batch request cannot be sent again (:func:`batch_unsendable`)."""


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


def batch_members_wanted(requests: Sequence[ClaimRequest], existing: Mapping[str, Receipt]) -> set[str]:
    """The batch keys a claim of ``requests`` may have to take whole: those named by a
    requested receipt (read in the transaction) that a claim would take with its
    generation kept. The backend reads these records, and their members' rows, before
    :func:`plan_claims`; a superset is harmless."""
    wanted: set[str] = set()
    for request in requests:
        old = existing.get(request.key)
        if old is not None and old.batch_key is not None and keeps_batch(old):
            wanted.add(old.batch_key)
    return wanted


def batch_unsendable(batch_key: str, members: int, why: str) -> str:
    """The error recorded with a member of a batch request that cannot be sent again."""
    return (
        f"the batch request {batch_key[:16]} ({members} members) that carried this call may have "
        f"reached the provider, and it cannot be sent again as it was: {why}; in another request "
        "the call could be paid for twice. Resolve it: `tooldispatch receipts resolve KEY --rerun` "
        "(a new request) or `--fail`"
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
    batches: Mapping[str, BatchRecord] | None = None,
) -> ClaimPlan:
    """Decide every request (unique keys) against the rows read in the transaction.

    A key in ``running`` that is claimed is written ``running`` (its caller holds a slot:
    claimed straight into running), else ``queued``; ``plan.writes`` carry the status.

    ``batches``: the records :func:`batch_members_wanted` named (batch key -> record; one
    missing is gone), with every member's row in ``existing``; None for a backend that
    keeps no batch records (a recorded request is then not looked for)."""
    plan = ClaimPlan(owner_identity(owner))
    planner = _Planner(plan, org_id, owner, now, lease_ttl_s, mode, stale_after_s, running)
    claimed = ClaimDisposition.CLAIMED
    # One read of the OS's random source for every lease id this call may need:
    # 16 random bytes (32 hex digits) per request, as unique as uuid4().hex.
    random_hex = os.urandom(16 * len(requests)).hex()
    decided, take, seen = plan.decided, planner.take, planner.seen
    for i, request in enumerate(requests):
        key = request.key
        if key in decided:  # taken (or made uncertain) with its batch request
            continue
        old = existing.get(key)
        if old is None:  # a new receipt (the common case): claimed
            decided[key] = take(request, None, request.lease_id or random_hex[32 * i : 32 * i + 32])
            continue
        if already_taken(request, old, owner):
            decided[key] = planner.as_taken(request, old, batches, existing)
            continue
        gone = holder_gone(old, now, seen)
        disposition = decide_disposition(
            old, mode, now, stale_after_s, holder_gone=gone, retry_safe=request.retry_safe
        )
        if disposition is not claimed:
            planner.leave(key, old, disposition, request.retry_safe)
        elif batches is not None and old.batch_key is not None and keeps_batch(old):
            planner.take_batch(request, old.batch_key, batches.get(old.batch_key), existing, requests)
        else:
            decided[key] = take(request, old, request.lease_id or random_hex[32 * i : 32 * i + 32])
    return plan


class _Planner:
    """The decisions of one :func:`plan_claims` call (one transaction)."""

    def __init__(
        self,
        plan: ClaimPlan,
        org_id: str,
        owner: Owner,
        now: float,
        lease_ttl_s: float,
        mode: ClaimMode,
        stale_after_s: float | None,
        running: Collection[str],
    ) -> None:
        self.plan = plan
        self.org_id = org_id
        self.run_id, self.run_attempt = owner.run_id, owner.run_attempt
        self.now = now
        self.expires = now + lease_ttl_s
        self.mode = mode
        self.stale_after_s = stale_after_s
        self.running = running
        self.seen: dict[Any, bool] = {}  # holder process -> gone, asked once per claim

    def decide(self, old: Receipt | None, retry_safe: bool) -> ClaimDisposition:
        gone = holder_gone(old, self.now, self.seen)
        return decide_disposition(
            old, self.mode, self.now, self.stale_after_s, holder_gone=gone, retry_safe=retry_safe
        )

    def leave(self, key: str, old: Receipt | None, disposition: ClaimDisposition, retry_safe: bool) -> None:
        """A key not claimed: answered with its receipt as it will stand."""
        assert old is not None
        gone = holder_gone(old, self.now, self.seen)
        after = lost_lease_status(old, self.now, holder_gone=gone, retry_safe=retry_safe)
        if after is ReceiptStatus.COMPLETED:  # a lost refresh: its previous output stands
            old = attrs.evolve(
                old, status=ReceiptStatus.COMPLETED, error=REFRESH_LOST, updated_at=self.now, **NO_LEASE
            )
            self.plan.restored.append(key)
        elif after is ReceiptStatus.UNCERTAIN:  # answered REUSED when it holds a last good output
            old = self.uncertain(old, LOST_WHILE_RUNNING)
        self.plan.decided[key] = Claim(disposition, old)

    def as_taken(
        self,
        request: ClaimRequest,
        old: Receipt,
        batches: Mapping[str, BatchRecord] | None,
        existing: Mapping[str, Receipt],
    ) -> Claim:
        """The answer to a claim sent again whose first attempt took ``old``
        (:func:`already_taken`): the receipt as it stands, nothing written; with the batch
        request that attempt took it with, when every member still stands as taken then."""
        record = None if batches is None or old.batch_key is None else batches.get(old.batch_key)
        if record is None or request.key not in record.members:
            return Claim(ClaimDisposition.CLAIMED, old)
        rows = [existing.get(member) for member in record.members]
        if any(
            row is None or row.batch_key != old.batch_key or row.status not in IN_FLIGHT
            or row.lease_owner_run_id != self.run_id or row.lease_owner_attempt != self.run_attempt
            for row in rows
        ):  # fmt: skip
            return Claim(ClaimDisposition.CLAIMED, old)
        claims = tuple(Claim(ClaimDisposition.CLAIMED, row) for row in rows if row is not None)
        return Claim(ClaimDisposition.CLAIMED, old, record, claims)

    def uncertain(self, old: Receipt, error: str) -> Receipt:
        """``old`` recorded ``uncertain`` with ``error`` (written by ``plan.lost``)."""
        self.plan.lost.append((old.key, error))
        return attrs.evolve(
            old, status=ReceiptStatus.UNCERTAIN, error=error, failure_kind=None, lease_expires_at=None,
            updated_at=self.now,
        )  # fmt: skip

    def take(self, request: ClaimRequest, old: Receipt | None, lease_id: str) -> Claim:
        """A new lease on ``request``'s receipt (written by ``plan.writes``)."""
        now = self.now
        key = request.key
        batch_key = None
        if old is None:
            attempts, created, output, completed_at, generation = 1, now, None, None, 1
        else:
            generation = next_generation(old)
            attempts, created = old.attempts + 1, old.created_at
            keeps = old.completed_at is not None and old.status in KEEPS_OUTPUT
            output, completed_at = (old.output, old.completed_at) if keeps else (None, None)
            if generation == old.generation:  # the same execution: its request's record stands
                batch_key = old.batch_key
        status = ReceiptStatus.RUNNING if key in self.running else ReceiptStatus.QUEUED
        input_text = request.input_text if request.input_text is not None or old is None else old.input_text
        self.plan.writes.append(
            (key, request.scope, request.tool_id, request.input_hash, lease_id, attempts, created, generation,
             status.value, request.input_text, batch_key)
        )  # fmt: skip
        host, pid, started_at = self.plan.identity
        receipt = Receipt(
            key, self.org_id, request.scope, request.tool_id, status, request.input_hash, output, None,
            None, lease_id, self.run_id, self.run_attempt, self.expires, attempts, created, now, completed_at,
            generation, host, pid, started_at, input_text, batch_key, None if old is None else old.cost,
        )  # fmt: skip
        return Claim(ClaimDisposition.CLAIMED, receipt)

    def take_batch(
        self,
        request: ClaimRequest,
        batch_key: str,
        record: BatchRecord | None,
        existing: Mapping[str, Receipt],
        requests: Sequence[ClaimRequest],
    ) -> None:
        """``request``'s receipt was sent in the batch request ``batch_key``: take every
        member of that request, or record those that could be taken ``uncertain``."""
        why: str | None = None
        members: tuple[str, ...] = (request.key,)
        if record is None:
            why = "its record is gone"
        elif record.tool_id != request.tool_id or request.key not in record.members:
            why = f"its record names another call (tool {record.tool_id!r})"
        else:
            members = record.members
        takeable: list[Receipt] = []
        for key in members:
            row = existing.get(key)
            problem = self._unjoinable(row, batch_key, request.retry_safe)
            if problem is None:
                assert row is not None
                takeable.append(row)
            elif why is None:
                why = f"member {key[:16]} {problem}"
        if why is not None:
            error = batch_unsendable(batch_key, len(members), why)
            for row in takeable:
                self.plan.decided[row.key] = Claim(ClaimDisposition.UNCERTAIN, self.uncertain(row, error))
            return
        assert record is not None
        asked = {r.key: r for r in requests}
        taken: list[Claim] = []
        for row in takeable:
            wanted = asked.get(row.key) or ClaimRequest(
                row.key, row.scope, row.tool_id, row.input_hash, request.retry_safe
            )
            taken.append(self.take(wanted, row, wanted.lease_id or os.urandom(16).hex()))
        claims = tuple(taken)
        for member in claims:  # a member not asked for is answered within its request only
            if member.receipt.key in asked:
                self.plan.decided[member.receipt.key] = Claim(
                    member.disposition, member.receipt, record, claims
                )

    def _unjoinable(self, row: Receipt | None, batch_key: str, retry_safe: bool) -> str | None:
        """Why a member's receipt cannot be taken for its batch request, or None."""
        if row is None:
            return "is gone (purged)"
        if row.batch_key != batch_key:
            return "was sent since in another request" if row.batch_key else "was sent since alone"
        if not keeps_batch(row):
            return f"is {row.status.value}"
        disposition = self.decide(row, retry_safe)
        if disposition is ClaimDisposition.CLAIMED:
            return None
        if disposition in (ClaimDisposition.RUNNING, ClaimDisposition.BLOCKED_ACTIVE_LEASE):
            return "is held by another owner's live lease"
        return f"is {row.status.value} ({disposition.value})"
