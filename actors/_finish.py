"""After a wave's provider calls: split, complete, fail, release, settle.

Success: batch results are split per member (by position, or matched by id when the
strategy gives ``input_id``/``result_id``); a wrong-length result fails the batch's
members; a member result that is an exception fails that member alone; None gives
``no_result``. Outputs go to the completion flusher in one request. Errors: a
suspension releases the receipts; a credential change releases and re-queues once; a
429 re-admits the unit (charging the retry budget), as does a call that was never sent
(its turn at the send gate came after its deadline; no charge); other errors are recorded with
their failure kind in one bulk write, and if that write fails the latch trips.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from stores.types import Completion, Failure, FailureKind

from ._calls import Group, Unit
from ._runtime import new_future
from .errors import (
    AuthScopeChangedError,
    BudgetExceededError,
    LeaseLostError,
    NotSentError,
    ProviderError,
    RateLimitedError,
    ReceiptPersistenceError,
    SuspendedError,
)
from .messages import FlushCompletions
from .results import ToolResult
from .tool_queue import requeue_outcome

if TYPE_CHECKING:
    from ._waves import Waves

__all__ = ["finish", "split_members"]


def split_members(unit: Unit, raw: Any, tool: Any) -> list[Any]:
    """One value (or exception) per group of ``unit``, in group order.

    Raises:
        ProviderError: the batch result does not have one result per member.
    """
    if len(unit.groups) == 1:
        return [raw]
    batch = tool.batch
    n = len(unit.groups)
    items = list(batch.split(raw, n))
    if batch.input_id is not None and batch.result_id is not None:
        by_id = {batch.result_id(item): item for item in items if not isinstance(item, BaseException)}
        return [by_id.get(batch.input_id(g.owner.input)) for g in unit.groups]
    if len(items) != n:
        raise ProviderError(
            f"{batch.batch_operation or tool.tool_id} returned {len(items)} results for {n} members",
            failure_kind=FailureKind.TRANSIENT,
        )
    return items


def _live(tool: Any, group: Group, value: Any) -> ToolResult:
    return ToolResult.of(value, "live", group.key, tool.tool_id)


def finish(waves: Waves, outcomes: list[tuple[Unit, Any, BaseException | None]]) -> list[Unit]:
    """Record and settle a wave's outcomes; returns the units to re-admit (after a 429)."""
    ctx, tool = waves.ctx, waves.tool
    values: list[tuple[Group, Any]] = []
    errors: list[tuple[Group, BaseException]] = []
    readmit: list[Unit] = []
    for unit, raw, error in outcomes:
        if isinstance(error, NotSentError) and unit.readmissions < ctx.policy.retry_attempts:
            unit.readmissions += 1  # nothing was sent: no retry is charged
            readmit.append(unit)
            continue
        if isinstance(error, RateLimitedError) and unit.readmissions < ctx.policy.retry_attempts:
            try:
                waves._charge("retries")
            except BudgetExceededError as exc:
                errors.extend((g, exc) for g in unit.groups)
                continue
            ctx.stats.add("retries")
            unit.readmissions += 1
            readmit.append(unit)
            continue
        if error is None:
            try:
                members = split_members(unit, raw, tool)
            except Exception as exc:
                error = exc
            else:
                for group, value in zip(unit.groups, members, strict=True):
                    if isinstance(value, BaseException):
                        errors.append((group, value))
                    else:
                        values.append((group, value))
                continue
        errors.extend((g, error) for g in unit.groups)
    settled = _complete(waves, values) + _record_errors(waves, errors)
    waves.settle(settled)
    return readmit


def _complete(waves: Waves, values: list[tuple[Group, Any]]) -> list[tuple[str, Any]]:
    ctx, tool = waves.ctx, waves.tool
    if not values:
        return []
    if not tool.durable:
        return [(g.key, _live(tool, g, v)) for g, v in values]
    reply = new_future()
    entries = tuple(
        Completion(g.key, g.receipt.lease_id or "", v) for g, v in values if g.receipt is not None
    )
    start = time.perf_counter()
    ctx.flusher.tell(
        FlushCompletions(
            org_id=ctx.run.org_id, owner=ctx.owner, entries=entries, tool_id=tool.tool_id,
            input_hashes={g.key: g.owner.input_hash for g, _ in values}, reply=reply,
        )
    )  # fmt: skip
    flushed = reply.get()
    ctx.stats.record("receipt_complete", (time.perf_counter() - start) * 1000.0, members=len(entries))
    out: list[tuple[str, Any]] = []
    refused: list[tuple[Group, BaseException]] = []
    for group, value in values:
        outcome = flushed[group.key]
        if outcome.kind in ("persisted", "salvaged"):
            out.append((group.key, _live(tool, group, value)))
            if outcome.kind == "salvaged":
                ctx.stats.add("salvaged")
        elif outcome.kind == "completed_by_other":
            out.append((group.key, ToolResult.of(outcome.output, "cached", group.key, tool.tool_id)))
        elif outcome.kind == "lease_lost":
            ctx.stats.add("lease_lost")
            ctx.stats.add("salvaged")
            out.append((group.key, LeaseLostError(f"lease on {group.key} was lost; output salvaged")))
        else:  # refused (too large, no JSON form): record the failure so the receipt is not left held
            error = ReceiptPersistenceError(f"receipt {group.key} refused the output: {outcome.error}")
            refused.append((group, error))
    return out + _record_errors(waves, refused)


def _record_errors(waves: Waves, errors: list[tuple[Group, BaseException]]) -> list[tuple[str, Any]]:
    from ._waves import failure_kind_for

    ctx, tool = waves.ctx, waves.tool
    if not errors:
        return []
    out: list[tuple[str, Any]] = []
    failures: list[tuple[Group, BaseException]] = []
    released: list[Group] = []
    for group, error in errors:
        if isinstance(error, SuspendedError):
            released.append(group)
            out.append((group.key, error))
        elif isinstance(error, AuthScopeChangedError):
            released.append(group)
            out.append((group.key, requeue_outcome(error)))
        elif isinstance(error, LeaseLostError):
            out.append((group.key, error))
        else:
            failures.append((group, error))
    ctx.stats.add("failures", len(failures), tool=tool.tool_id)
    if not tool.durable:
        return out + [(g.key, e) for g, e in failures]
    waves.release(released)
    records = [
        Failure(g.key, g.receipt.lease_id or "", str(e) or type(e).__name__, failure_kind_for(e))
        for g, e in failures
        if g.receipt is not None
    ]
    if records:
        try:
            ctx.store.fail_many(ctx.run.org_id, records, ctx.owner).get()
        except Exception as exc:
            ctx.latch.trip(f"recording failures failed: {exc}")
            return out + [
                (g.key, ReceiptPersistenceError(f"recording the failure of {g.key} failed: {exc}", cause=e))
                for g, e in failures
            ]
    return out + [(g.key, e) for g, e in failures]
