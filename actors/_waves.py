"""Execution of claimed groups: admission, mark running, provider call, completion.

Claimed groups are compiled into units (one group, or one batch of at most
``max_batch_size`` groups) and run in waves at most the tool's suggested parallelism
wide. Each wave: check the latch, take slots from the governor (one per unit), mark
every member running in one fenced bulk write, register heartbeats, run the units on
the tool pool with their timeouts, release the slots, then complete (through the
completion flusher), fail or release in bulk, and settle every group.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
import time
from typing import Any

import attrs
import tenacity

from stores.errors import InvalidInputError
from stores.types import FailureKind

from ._calls import Group, Unit
from ._context import Context
from ._finish import finish
from ._runtime import new_future
from .errors import (
    BudgetExceededError,
    CallCancelledError,
    LeaseLostError,
    NotSentError,
    PersistenceCircuitOpenError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitedError,
    ToolTimeoutError,
)
from .governor import suggested_parallelism
from .messages import (
    AcquireSlots,
    BackpressureReported,
    ChargeBudget,
    GroupsSettled,
    RegisterLeases,
    ReleaseSlots,
    UnregisterLeases,
)
from .results import ToolContext, batch_idempotency_key, provider_idempotency_key
from .tool import Tool

__all__ = ["Waves", "failure_kind_for", "settle"]


def failure_kind_for(exc: BaseException) -> FailureKind:
    """How a tool error is recorded: ProviderError says; timeouts and connection
    errors are transient; invalid input is invalid_input; anything else permanent."""
    if isinstance(exc, ProviderError):
        return exc.failure_kind
    if isinstance(exc, (TimeoutError, concurrent.futures.TimeoutError)):
        return FailureKind.TIMEOUT
    if isinstance(exc, (ConnectionError, OSError)):
        return FailureKind.TRANSIENT
    if isinstance(exc, InvalidInputError):
        return FailureKind.INVALID_INPUT
    return FailureKind.PERMANENT


def settle(queue: Any, outcomes: list[tuple[str, Any]]) -> None:
    """Tell the tool queue these groups are done (ToolResult or exception each)."""
    if outcomes:
        queue.tell(GroupsSettled(outcomes=outcomes))


class Waves:
    """Runs claimed groups of one tool (see the module doc)."""

    def __init__(self, ctx: Context, queue: Any, tool: Tool, lease_ttl_s: float) -> None:
        self.ctx = ctx
        self.queue = queue
        self.tool = tool
        self.lease_ttl_s = lease_ttl_s
        self.width = suggested_parallelism(tool.pacing, ctx.policy.max_concurrency)
        self.settled: set[str] = set()

    # -- settling helpers -------------------------------------------------------------

    def settle(self, outcomes: list[tuple[str, Any]]) -> None:
        self.settled.update(key for key, _ in outcomes)
        settle(self.queue, outcomes)

    def release(self, groups: list[Group]) -> None:
        """Give the groups' receipts back to ``pending`` (best effort: a lease the store
        cannot release now simply expires)."""
        leases = [g.lease for g in groups if g.lease is not None]
        if leases and self.tool.durable:
            with contextlib.suppress(Exception):
                self.ctx.store.release(self.ctx.run.org_id, leases, self.ctx.owner).get()

    def _give_back(self, groups: list[Group], error: BaseException) -> None:
        """Release the groups' receipts and settle them with ``error``."""
        self.release(groups)
        self.settle([(g.key, error) for g in groups])

    def abandon(self, groups: list[Group], error: BaseException) -> None:
        """Settle every group not yet settled (after an unexpected error)."""
        self._give_back([g for g in groups if g.key not in self.settled], error)

    # -- the wave loop ----------------------------------------------------------------

    def compile(self, groups: list[Group]) -> list[Unit]:
        batch = self.tool.batch
        if batch is None or len(groups) < 2:
            return [Unit([g]) for g in groups]
        start = time.perf_counter()
        size = batch.max_batch_size
        units = [Unit(groups[i : i + size]) for i in range(0, len(groups), size)]
        self.ctx.stats.record("batch_compile", (time.perf_counter() - start) * 1000.0, batches=len(units))
        return units

    def run(self, groups: list[Group]) -> None:
        """Admit and execute every group; all are settled on return."""
        pending = collections.deque(self.compile(groups))
        ctx = self.ctx
        while pending:
            members = [g for u in pending for g in u.groups]
            if ctx.stopping.is_set():
                ctx.stats.add("cancelled", sum(len(g.calls) for g in members))
                self._give_back(members, CallCancelledError("the dispatcher stopped before the call started"))
                return
            if ctx.latch.tripped:
                refused = sum(len(g.calls) + len(g.attached) for g in members)
                ctx.latch.refuse(refused)
                ctx.stats.add("refused_by_latch", refused)
                self._give_back(members, PersistenceCircuitOpenError(f"latch tripped: {ctx.latch.reason}"))
                return
            start = time.perf_counter()
            reply = new_future()
            want = min(self.width, len(pending))
            ctx.governor.tell(
                AcquireSlots(org_id=ctx.run.org_id, provider=self.tool.provider_name, want=want, reply=reply)
            )
            try:
                granted = reply.get()
            except (BudgetExceededError, CallCancelledError) as exc:
                self._give_back(members, exc)
                return
            except ProviderUnavailableError as exc:
                refused = sum(len(g.calls) + len(g.attached) for g in members)
                ctx.stats.add("unavailable", refused, tool=self.tool.tool_id)
                self._give_back(members, exc)
                return
            ctx.stats.record("admission", (time.perf_counter() - start) * 1000.0, granted=granted)
            wave = [pending.popleft() for _ in range(min(granted, len(pending)))]
            pending.extend(self._run_wave(wave, granted))

    def _run_wave(self, wave: list[Unit], slots: int) -> list[Unit]:
        ctx, tool = self.ctx, self.tool
        lost: set[str] = set()
        leases = [g.lease for u in wave for g in u.groups if g.lease is not None]
        if tool.durable and leases:
            start = time.perf_counter()
            report = ctx.store.mark_running_many(
                ctx.run.org_id, leases, ctx.owner, lease_ttl_s=self.lease_ttl_s
            ).get()
            ctx.stats.record("receipt_prepare", (time.perf_counter() - start) * 1000.0, marked=len(leases))
            lost = set(report.refused)
        if lost:
            error = LeaseLostError("the receipt's lease was taken before the call started")
            self.settle([(key, error) for key in lost])
            for unit in wave:
                unit.groups = [g for g in unit.groups if g.key not in lost]
        runnable = [u for u in wave if u.groups]
        token, lost_event = next(ctx.tokens), threading.Event()
        longest = max((u.timeout_s for u in runnable), default=0.0)
        beating = tool.durable and bool(runnable) and ctx.policy.heartbeats
        if beating:
            ctx.heartbeat.tell(
                RegisterLeases(
                    token=token, org_id=ctx.run.org_id, owner=ctx.owner,
                    leases=tuple(g.lease for u in runnable for g in u.groups if g.lease is not None),
                    lease_ttl_s=self.lease_ttl_s, deadline=time.monotonic() + longest + self.lease_ttl_s,
                    lost=lost_event,
                )
            )  # fmt: skip
        start = time.perf_counter()
        started = time.monotonic()
        futures = [(u, ctx.tool_pool.submit(self._call_unit, u)) for u in runnable]
        outcomes: list[tuple[Unit, Any, BaseException | None]] = []
        for unit, future in futures:
            try:
                outcomes.append(
                    (unit, future.result(timeout=max(0.0, started + unit.timeout_s - time.monotonic())), None)
                )
            except concurrent.futures.TimeoutError:
                timed_out = ToolTimeoutError(f"{tool.tool_id} did not return within {unit.timeout_s} s")
                outcomes.append((unit, None, timed_out))
            except BaseException as exc:
                outcomes.append((unit, None, exc))
        ctx.stats.record("provider", (time.perf_counter() - start) * 1000.0, units=len(runnable))
        if beating:
            ctx.heartbeat.tell(UnregisterLeases(token=token))
        ok = sum(1 for _, _, err in outcomes if err is None)
        down = sum(1 for _, _, err in outcomes if err is not None and self._transient(err))
        unsent = sum(1 for _, _, err in outcomes if isinstance(err, NotSentError))
        ctx.governor.tell(
            ReleaseSlots(
                org_id=ctx.run.org_id, provider=tool.provider_name, count=slots, successes=ok,
                unavailable=down, answered=len(outcomes) - down - unsent,
            )
        )  # fmt: skip
        ctx.stats.add("provider_calls", len(runnable) - unsent, tool=tool.tool_id)
        ctx.stats.add("batches", sum(1 for u in runnable if len(u.groups) > 1))
        return finish(self, outcomes)

    # -- the provider call (runs on the tool pool) ------------------------------------

    def _call_unit(self, unit: Unit) -> Any:
        tool, ctx = self.tool, self.ctx
        groups = unit.groups
        idem = [provider_idempotency_key(g.key, g.receipt.lease_id if g.receipt else None) for g in groups]
        owner = groups[0].owner
        base = ToolContext(
            tool_id=tool.tool_id,
            idempotency_key=idem[0] if len(groups) == 1 else batch_idempotency_key(idem),
            receipt_keys=tuple(g.key for g in groups),
            credential_scope_digest=owner.credential_digest,
            deadline=time.monotonic() + unit.timeout_s,
            timeout_s=unit.timeout_s,
        )
        batch = tool.batch if len(groups) > 1 else None
        payload = batch.build([g.owner.input for g in groups]) if batch else owner.input
        gate = ctx.send_gates.get(ctx.run.org_id, tool.provider_name)
        fn = batch.batch_fn if batch else tool.fn

        sent_at: list[float] = []
        failed: list[BaseException] = []
        gave_up: list[bool] = []

        def send(context: ToolContext) -> Any:
            if not gate.wait_turn(latest=context.deadline, stop=ctx.stopping):
                gave_up.append(True)  # no more attempts
                if failed:  # an earlier attempt went out: its error is this call's outcome
                    raise failed[-1]
                raise NotSentError(f"{tool.tool_id}: its turn to send came after its deadline; not sent")
            sent_at[:] = [time.monotonic()]
            try:
                return fn(payload, context)
            except BaseException as exc:
                failed.append(exc)
                raise

        try:
            if not tool.retry_safe or ctx.policy.retry_attempts <= 1:
                return send(base)
            for try_ in tenacity.Retrying(
                stop=tenacity.stop_after_attempt(ctx.policy.retry_attempts),
                wait=tenacity.wait_exponential(multiplier=ctx.policy.retry_backoff_s)
                + tenacity.wait_random(0, ctx.policy.retry_backoff_s),
                retry=tenacity.retry_if_exception(lambda exc: not gave_up and self._transient(exc)),
                before_sleep=self._charge_retry,
                reraise=True,
            ):
                with try_:
                    context = attrs.evolve(base, attempt=try_.retry_state.attempt_number)
                    return send(context)
        except RateLimitedError as exc:
            ctx.governor.tell(
                BackpressureReported(
                    org_id=ctx.run.org_id,
                    provider=tool.provider_name,
                    retry_after=exc.retry_after,
                    sent_at=sent_at[0] if sent_at else None,
                )
            )
            ctx.stats.add("backpressure", tool=tool.tool_id)
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _transient(exc: BaseException) -> bool:
        """Whether ``exc`` says the provider could not serve at all (connection errors,
        5xx, timeouts): retried in-call, and counted by the provider's circuit."""
        return not isinstance(exc, (RateLimitedError, NotSentError)) and failure_kind_for(exc) in (
            FailureKind.TRANSIENT,
            FailureKind.TIMEOUT,
        )

    def _charge_retry(self, retry_state: tenacity.RetryCallState) -> None:
        self._charge("retries")
        self.ctx.stats.add("retries")

    def _charge(self, kind: str) -> None:
        reply = new_future()
        self.ctx.governor.tell(ChargeBudget(kind=kind, amount=1, reply=reply))
        reply.get()
