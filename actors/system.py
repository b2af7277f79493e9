"""The host-facing dispatch system: starts the actors, takes calls, stops cleanly.

.. code-block:: python

    system = DispatchSystem.start(tools=[...], store=SqliteReceiptStore("receipts.db"),
                                  run=RunInfo(run_id="r1", org_id="acme", scope="enrich"))
    future = system.proxy().execute("verify_email", {"email": "a@example.com"})
    result = future.get(timeout=30)     # ToolResult
    system.stop()

``execute`` validates the call and computes its receipt key on the caller's thread,
then queues it on the tool's :class:`~actors.tool_queue.ToolQueueActor`. Errors that
concern one call (unknown tool, input that is not JSON) resolve that call's future
alone.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import pykka

from stores.base import ReceiptStore
from stores.keys import key_and_input_hash
from stores.types import ClaimMode, Owner

from ._calls import Call, Group
from ._context import Context
from ._drain import Drain
from ._runtime import Timers, fail, new_future, new_pool, runtime_name
from ._send_gate import SendGates
from .completion_flusher import CompletionFlusherActor, Latch
from .errors import AuthScopeChangedError, CallCancelledError, InvalidInputError, UnknownToolError
from .governor import GovernorActor
from .heartbeat import HeartbeatActor
from .messages import StopQueue, SubmitCall
from .receipt_store import ReceiptStoreActor
from .salvage import ReplayReport, SalvageLog
from .stats import Stats
from .tool import Policy, RunInfo, Tool
from .tool_queue import ToolQueueActor

__all__ = ["DispatchProxy", "DispatchSystem"]


class DispatchProxy:
    """The host's handle for submitting calls; every method is thread-safe."""

    def __init__(self, system: DispatchSystem) -> None:
        self._system = system

    def execute(
        self,
        tool_id: str,
        input: Any,
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        stale_after_s: float | None = None,
        timeout_s: float | None = None,
    ) -> pykka.Future[Any]:
        """Queue one call.

        Args:
            tool_id: a tool the system was started with.
            input: the call's JSON input.
            force_refresh: re-run even if a completed receipt exists.
            retry_failed: re-run a receipt that failed.
            stale_after_s: completed receipts older than this (seconds) are re-run.
            timeout_s: this call's timeout (default the tool's, then the policy's).

        Returns:
            A pykka future (awaitable) of :class:`~actors.results.ToolResult`. It fails
            with UnknownToolError, InvalidInputError, the tool's error,
            RecordedFailureError, LeaseLostError, ReceiptWaitTimeoutError,
            BudgetExceededError, PersistenceCircuitOpenError or CallCancelledError.
        """
        return self._system._execute(tool_id, input, force_refresh, retry_failed, stale_after_s, timeout_s)

    def stats(self) -> dict[str, Any]:
        """See :meth:`DispatchSystem.stats`."""
        return self._system.stats()


class DispatchSystem:
    """The actor system of one run. Use :meth:`start`; also a context manager.

    Actors: one ToolQueueActor per tool, a ReceiptStoreActor, a GovernorActor, a
    HeartbeatActor and a CompletionFlusherActor. Drains run on a drain pool and
    provider calls on a tool pool (threads, or greenlets under gevent).
    """

    def __init__(self, tools: Iterable[Tool], store: ReceiptStore, run: RunInfo, policy: Policy) -> None:
        self.tools = {t.tool_id: t for t in tools}
        if not self.tools:
            raise ValueError("DispatchSystem needs at least one tool")
        self.run = run
        self.policy = policy
        self.store = store
        self.runtime = runtime_name()
        self.started_at = time.monotonic()
        self.stats_ = Stats(policy.perf_hook)
        self.latch = Latch()
        self.timers = Timers()
        self.salvage = SalvageLog(policy.salvage_path or _default_salvage_path(store))
        self._digests: dict[str, str] = {}
        self._stopping = threading.Event()
        self._stopped = False
        deadline = self.started_at + run.deadline_s if run.deadline_s is not None else None
        store_ref = ReceiptStoreActor.start(store)
        self._store_ref = store_ref
        self.store_proxy = store_ref.proxy()
        pacings = {t.provider_name: t.pacing for t in self.tools.values()}
        gates = SendGates()
        self._governor = GovernorActor.start(policy, pacings, self.timers, gates)
        self._heartbeat = HeartbeatActor.start(self.store_proxy, policy.heartbeat_for, self.timers)
        self._flusher = CompletionFlusherActor.start(
            self.store_proxy,
            policy,
            self.latch,
            self.salvage,
            self.timers,
            run.scope,
            deadline,
            stats=self.stats_,
        )
        self._drain_pool = new_pool(policy.drain_workers, "tooldispatch-drain")
        self._tool_pool = new_pool(policy.max_concurrency, "tooldispatch-tool")
        self.ctx = Context(
            run=run, owner=Owner(run.run_id, run.run_attempt), policy=policy, store=self.store_proxy,
            governor=self._governor, heartbeat=self._heartbeat, flusher=self._flusher, latch=self.latch,
            stats=self.stats_, tool_pool=self._tool_pool, stopping=self._stopping, tokens=itertools.count(),
            send_gates=gates,
        )  # fmt: skip
        self._queues = {
            tool_id: ToolQueueActor.start(
                tool, policy.batch_grace_s, self._run_drain, self._requeue, self.stats_, self.timers
            )
            for tool_id, tool in self.tools.items()
        }
        self._proxy = DispatchProxy(self)

    @classmethod
    def start(
        cls, *, tools: Iterable[Tool], store: ReceiptStore, run: RunInfo, policy: Policy | None = None
    ) -> DispatchSystem:
        """Start every actor and return the system.

        Args:
            tools: the tools calls may name.
            store: the receipt store (the system does not close it).
            run: the run's identity (run id, attempt, org, scope).
            policy: settings (default :class:`~actors.tool.Policy`).
        """
        return cls(tools, store, run, policy or Policy())

    def proxy(self) -> DispatchProxy:
        """The handle whose ``execute`` returns futures."""
        return self._proxy

    # -- calls ------------------------------------------------------------------------

    def _digest(self, tool: Tool) -> str:
        if tool.credentials is None:
            return ""
        found = self._digests.get(tool.tool_id)
        if found is None:
            found = self._digests[tool.tool_id] = str(tool.credentials())
        return found

    def _execute(
        self,
        tool_id: str,
        input: Any,
        force_refresh: bool,
        retry_failed: bool,
        stale_after_s: float | None,
        timeout_s: float | None,
    ) -> pykka.Future[Any]:
        future = new_future()
        try:
            if self._stopping.is_set():
                raise CallCancelledError("the dispatcher is stopped")
            tool = self.tools.get(tool_id)
            if tool is None:
                raise UnknownToolError(f"unknown tool {tool_id!r}; known: {', '.join(sorted(self.tools))}")
            if timeout_s is not None and not timeout_s > 0:
                raise InvalidInputError(f"timeout_s must be > 0, got {timeout_s!r}")
            mode = (
                ClaimMode.FORCE_REFRESH
                if force_refresh
                else ClaimMode.RETRY_FAILED
                if retry_failed
                else ClaimMode.NORMAL
            )
            call = self._call(tool, input, mode, stale_after_s, timeout_s, future)
        except Exception as exc:
            fail(future, exc)
            return future
        self.stats_.add("calls", tool=tool_id)
        self._queues[tool_id].tell(SubmitCall(call=call))
        return future

    def _call(
        self, tool: Tool, input: Any, mode: ClaimMode, stale_after_s: float | None, timeout_s: float | None,
        future: Any, requeued: bool = False,
    ) -> Call:  # fmt: skip
        digest = self._digest(tool)
        key, input_hash = key_and_input_hash(
            org_id=self.run.org_id, scope=self.run.scope, tool_id=tool.tool_id, input=input,
            credential_scope_digest=digest, version=tool.version, stale_after_s=stale_after_s,
            ignore_fields=tool.non_semantic_fields,
        )  # fmt: skip
        return Call(
            tool=tool, input=input, key=key, input_hash=input_hash, credential_digest=digest,
            mode=mode, stale_after_s=stale_after_s,
            timeout_s=timeout_s or tool.timeout_s or self.policy.timeout_s,
            future=future, submitted_at=time.monotonic(), requeued=requeued,
        )  # fmt: skip

    def _requeue(self, call: Call, error: BaseException) -> None:
        """Credentials changed: recompute the key and queue the call once more.

        Runs on the tool queue actor's thread; only ``tell``s.
        """
        if call.requeued:
            fail(call.future, error)
            return
        self._digests.pop(call.tool.tool_id, None)
        try:
            fresh = self._call(
                call.tool, call.input, call.mode, call.stale_after_s, call.timeout_s, call.future, True
            )
        except Exception as exc:
            fail(call.future, exc)
            return
        if fresh.key == call.key:
            fail(
                call.future,
                AuthScopeChangedError(f"credentials changed but the receipt key did not: {error}"),
            )
            return
        self.stats_.add("requeued")
        self._queues[call.tool.tool_id].tell(SubmitCall(call=fresh))

    def _run_drain(self, queue: Any, tool: Tool, groups: list[Group]) -> None:
        """Hand a drain to the drain pool (called on a tool queue actor's thread)."""
        try:
            self._drain_pool.submit(Drain(self.ctx, queue, tool, groups).run)
        except RuntimeError:  # pool shut down: the system is stopping
            for group in groups:
                for call in group.calls:
                    fail(call.future, CallCancelledError("the dispatcher stopped"))

    # -- observation ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: calls, live, cached, in_flight, deduped, provider_calls, batches,
        retries, backpressure, failures, salvaged, lease_lost, refused_by_latch,
        requeued, cancelled, errors; plus ``latch_tripped``, ``phases`` (p50/p95 ms) and
        ``tools`` (tool id -> its own counters: calls, live, cached, in_flight, deduped,
        errors, provider_calls, backpressure, failures).
        """
        out: dict[str, Any] = self.stats_.snapshot()
        out["tools"] = self.stats_.snapshot_tools()
        out["latch_tripped"] = self.latch.tripped
        out["latch_refused"] = self.latch.refused
        out["phases"] = self.stats_.percentiles()
        out["runtime"] = self.runtime
        return out

    def replay_salvage(self) -> ReplayReport:
        """Put salvaged outputs into the store (see :meth:`SalvageLog.replay`)."""
        return self.salvage.replay(self.store)

    # -- lifecycle --------------------------------------------------------------------

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop: reject queued calls, end waits, let running calls finish and flush.

        Provider calls already running finish and their completions are flushed (or
        salvaged) before this returns; calls not started are rejected with
        CallCancelledError and their receipts released. Idempotent.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        for ref in self._queues.values():
            reply = new_future()
            ref.tell(StopQueue(reply=reply))
            reply.get(timeout=timeout_s)
        self._governor.proxy().stop_waiters().get(timeout=timeout_s)
        self._drain_pool.shutdown(wait=True)
        self._tool_pool.shutdown(wait=False, cancel_futures=True)
        for ref in [*self._queues.values(), self._heartbeat, self._governor, self._flusher, self._store_ref]:
            ref.stop(timeout=timeout_s)
        self.timers.stop()

    def __enter__(self) -> DispatchSystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _default_salvage_path(store: ReceiptStore) -> str:
    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:":
        return f"{path}.salvage.jsonl"
    return os.path.abspath("tooldispatch-salvage.jsonl")
