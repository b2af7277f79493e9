"""One drain: claim receipts in bulk, sort the dispositions, wait on other owners.

A :class:`Drain` runs on the system's drain pool (a worker thread, or a greenlet under
gevent), never on an actor: it may wait on actors' futures. Claimed groups go to
:mod:`actors._waves` for admission and execution.
"""

from __future__ import annotations

import time
from typing import Any

from stores.types import ClaimDisposition, ClaimMode, ClaimRequest, Receipt

from ._calls import Group
from ._context import Context
from ._waves import Waves
from .errors import CallCancelledError, ReceiptWaitTimeoutError, RecordedFailureError, StoreError
from .results import ToolResult
from .tool import Tool

__all__ = ["Drain"]


def reused_result(tool: Tool, group: Group, receipt: Receipt, execution: Any) -> Any:
    """The ToolResult for a completed receipt, or an error if the input hash disagrees."""
    if receipt.input_hash != group.owner.input_hash:
        return StoreError(
            f"receipt {group.key} holds input hash {receipt.input_hash}, not {group.owner.input_hash}: "
            "a receipt key collision or a corrupted receipt"
        )
    return ToolResult.of(receipt.output, execution, group.key, tool.tool_id)


class Drain:
    """Claims, dispositions and waits for one batch of groups of one tool."""

    def __init__(self, ctx: Context, queue: Any, tool: Tool, groups: list[Group]) -> None:
        self.ctx = ctx
        self.queue = queue
        self.tool = tool
        self.groups = groups
        self.lease_ttl_s = tool.lease_ttl_s or ctx.policy.lease_ttl_s
        self.waves = Waves(ctx, queue, tool, self.lease_ttl_s)

    def run(self) -> None:
        """Run the drain to the end; every group is settled when it returns."""
        start = time.perf_counter()
        try:
            if not self.tool.durable:
                self.waves.run(self.groups)
            else:
                claimed, waiting = self.claim(self.groups)
                self.waves.run(claimed)  # what we hold goes first: waiting may last a lease TTL
                if waiting:
                    self.waves.run(self.wait(waiting))
        except BaseException as exc:  # never leave a caller hanging
            self.waves.abandon(self.groups, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.ctx.stats.record(
                "drain",
                (time.perf_counter() - start) * 1000.0,
                tool_id=self.tool.tool_id,
                groups=len(self.groups),
            )

    # -- claims -----------------------------------------------------------------------

    def claim(
        self, groups: list[Group], force: bool = False, reused: Any = "cached"
    ) -> tuple[list[Group], list[Group]]:
        """Claim receipts (one round trip per claim mode) and settle what needs no run.

        Returns:
            (claimed groups, groups to wait for).
        """
        by_mode: dict[tuple[ClaimMode, float | None], list[Group]] = {}
        for group in groups:
            mode = ClaimMode.FORCE_REFRESH if force else group.mode
            by_mode.setdefault((mode, group.owner.stale_after_s), []).append(group)
        claimed: list[Group] = []
        waiting: list[Group] = []
        retry_force: list[Group] = []
        settled: list[tuple[str, Any]] = []
        start = time.perf_counter()
        for (mode, stale), members in by_mode.items():
            requests = [
                ClaimRequest(g.key, self.ctx.run.scope, self.tool.tool_id, g.owner.input_hash)
                for g in members
            ]
            claims = self.ctx.store.claim_many(
                self.ctx.run.org_id, requests, self.ctx.owner, lease_ttl_s=self.lease_ttl_s, mode=mode,
                stale_after_s=stale,
            ).get()  # fmt: skip
            for group, claim in zip(members, claims, strict=True):
                disposition, receipt = claim.disposition, claim.receipt
                if disposition is ClaimDisposition.CLAIMED:
                    group.receipt = receipt
                    claimed.append(group)
                elif disposition is ClaimDisposition.REUSED:
                    settled.append((group.key, reused_result(self.tool, group, receipt, reused)))
                elif disposition is ClaimDisposition.FAILED:
                    if receipt.failure_kind is not None and receipt.failure_kind.retryable and not force:
                        retry_force.append(group)
                    else:
                        settled.append((group.key, self._recorded_failure(group, receipt)))
                else:  # running, blocked_active_lease
                    waiting.append(group)
        self.ctx.stats.record("receipt_prepare", (time.perf_counter() - start) * 1000.0, groups=len(groups))
        self.waves.settle(settled)
        if retry_force:
            more, wait_more = self.claim(retry_force, force=True, reused=reused)
            claimed += more
            waiting += wait_more
        return claimed, waiting

    @staticmethod
    def _recorded_failure(group: Group, receipt: Receipt) -> RecordedFailureError:
        return RecordedFailureError(
            f"durable tool call {group.key} failed earlier: {receipt.error or 'unknown error'}",
            failure_kind=receipt.failure_kind,
        )

    # -- waiting on other owners --------------------------------------------------------

    def wait(self, waiting: list[Group]) -> list[Group]:
        """Wait for other owners' receipts (bounded attempts, backing off).

        Each round claims the waiting keys again, so the store's clock judges the
        leases: completed → its output (``in_flight``; force-refresh groups re-run);
        lease expired or released → claimed; still live → keep waiting. After the
        last attempt a live lease is never stolen: ReceiptWaitTimeoutError.

        Returns:
            groups claimed along the way, to execute.
        """
        policy, ctx = self.ctx.policy, self.ctx
        delay = policy.receipt_poll_initial_s
        claimed: list[Group] = []
        for _ in range(policy.receipt_wait_max_attempts):
            if ctx.stopping.wait(delay):
                self.waves.settle([(g.key, CallCancelledError("the dispatcher stopped")) for g in waiting])
                return claimed
            delay = min(delay * 2, policy.receipt_poll_max_s)
            more, waiting = self.claim(waiting, reused="in_flight")
            claimed += more
            if not waiting:
                return claimed
        timeout = [
            (g.key, ReceiptWaitTimeoutError(f"receipt {g.key} is still held by another owner's live lease"))
            for g in waiting
        ]
        self.waves.settle(timeout)
        return claimed
