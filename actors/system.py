"""The host-facing dispatch system: starts the actors, takes calls, stops cleanly.

.. code-block:: python

    system = DispatchSystem.start(tools=[...], store=SqliteReceiptStore("receipts.db"),
                                  run=RunInfo(run_id="r1", org_id="acme", scope="enrich"))
    future = system.proxy().execute("verify_email", {"email": "a@example.com"})
    result = future.get(timeout=30)     # ToolResult
    system.stop()

``execute`` validates the call and computes its receipt key on the caller's thread,
then queues it on the tool's :class:`~actors.queue.actor.ToolQueueActor`. Errors that
concern one call (unknown tool, input that is not JSON) resolve that call's future
alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import pykka

from actors.errors import (
    AuthScopeChangedError,
    DispatchError,
    ToolTimeoutError,
    error_text,
    is_a,
    type_name,
)
from actors.flusher.actor import CompletionFlusherActor, Latch
from actors.flusher.salvage import ReplayReport, SalvageLog
from actors.flusher.stop_salvage import salvage_unread, salvage_writing
from actors.front import DispatchProxy, Intake
from actors.governor.actor import GovernorActor
from actors.governor.budgets import check_money_budgets
from actors.governor.decisions import suggested_parallelism
from actors.heartbeat.actor import HeartbeatActor
from actors.lifecycle.calls import Call, Role
from actors.messages import StopQueue
from actors.pacing.providers import provider_pacings
from actors.pacing.send_gate import SendGates
from actors.queue.actor import Memo, ToolQueueActor
from actors.queue.system_ports import Ports
from actors.runtime import host_signals
from actors.runtime.actor import Timers, WorkerPool, on_actor, runtime_name
from actors.runtime.at_exit import track, untrack
from actors.runtime.futures import MAX_WAIT_S, fail, new_future, wait_interjected
from actors.stats import Stats
from actors.store.actor import ReceiptStoreActor
from actors.store.client import StoreClient
from actors.store.purge_watch import PurgeWatcher
from actors.telemetry import Telemetry, open_instruments
from actors.tool import Policy, RunInfo, Tool
from actors.worker.launch import Launch
from stores.base import ReceiptStore
from stores.types import Owner

__all__ = ["DispatchProxy", "DispatchSystem"]


class DispatchSystem:
    """The actor system of one run. Use :meth:`start`; also a context manager.

    Actors: one ToolQueueActor per tool (its queue and the lifecycle of its calls), a
    ReceiptStoreActor, a GovernorActor, a HeartbeatActor and a CompletionFlusherActor.
    Tool functions run on a worker pool (daemon threads, or greenlets under gevent)
    and report back by message; no thread waits on another actor.
    """

    def __init__(
        self, tools: Iterable[Tool], store: ReceiptStore, run: RunInfo, policy: Policy, pacer: Any = None,
        telemetry: Telemetry | None = None,
    ) -> None:  # fmt: skip
        self.tools = {t.tool_id: t for t in tools}
        if not self.tools:
            raise ValueError("DispatchSystem needs at least one tool")
        if not isinstance(store, ReceiptStore):
            raise TypeError(
                f"store must be a stores.ReceiptStore (subclass it: it declares the optional "
                f"capabilities' defaults), got {type(store).__name__}"
            )
        self._pacings = provider_pacings(self.tools.values())  # conflicting limits: before any actor starts
        check_money_budgets(self.tools.values(), policy)
        self.run = run
        self.policy = policy
        self.store = store
        self.runtime = runtime_name()
        self.started_at = time.monotonic()
        self.telemetry: Any = None
        """The instruments (``actors.telemetry.instruments.Instruments``) when telemetry is on
        (opened before any thread or actor starts: without the packages, none is left running)."""
        if telemetry is not None:
            self.telemetry = open_instruments(telemetry, run, self._pacing_rates)
        self.stats_ = Stats(policy.perf_hook)
        self.stats_.telemetry = self.telemetry
        self.latch = Latch()
        self.launch = Launch(self.latch)
        """The last check before each request leaves (:mod:`actors.worker.launch`)."""
        self.timers = Timers()
        self.salvage = SalvageLog(policy.salvage_path or _default_salvage_path(store))
        self._stopping = threading.Event()
        self._stopped = False
        self._stop_done = threading.Event()
        self._stopper: int | None = None
        """The thread (greenlet, under gevent) whose stop is the one under way."""
        self._lock = threading.Lock()
        deadline = self.started_at + run.deadline_s if run.deadline_s is not None else None
        self._store_ref = ReceiptStoreActor.start(
            store,
            policy.max_receipt_ops,
            outages=self.stats_.outages,
            timers=self.timers,
            stopping=self._stopping,
            salvage=self.salvage,
        )
        self._pacer = pacer
        pacings = self._pacings
        self.gates = SendGates()
        fairness = (run.fairness_key or run.run_id, run.fairness_weight)
        self._governor = GovernorActor.start(
            policy, pacings, self.timers, self.gates, pacer=pacer, fairness=fairness
        )
        self._heartbeat = HeartbeatActor.start(store, policy.heartbeat_for)
        self._writing: dict[int, Any] = {}
        """The flusher's writes in progress (salvaged by a stop whose bound runs out)."""
        self._flusher = CompletionFlusherActor.start(
            StoreClient(self._store_ref),
            policy,
            self.latch,
            self.salvage,
            self.timers,
            run.scope,
            deadline,
            stats=self.stats_,
            writing=self._writing,
        )
        self._pool = WorkerPool("tooldispatch-tool")
        self.ports = Ports(
            run=run, owner=Owner(run.run_id, run.run_attempt), policy=policy, store=self._store_ref,
            governor=self._governor, heartbeat=self._heartbeat, flusher=self._flusher, latch=self.latch,
            launch=self.launch, gates=self.gates, stats=self.stats_, pool=self._pool, timers=self.timers,
            salvage=self.salvage, requeue=self._requeue, writing=self._writing, telemetry=self.telemetry,
            width=lambda tool: suggested_parallelism(pacings[tool.provider_name], policy.max_concurrency),
        )  # fmt: skip
        self._memos = {
            tool_id: Memo(policy.memo_max_bytes if t.durable else 0) for tool_id, t in self.tools.items()
        }
        self._queues = {
            tool_id: ToolQueueActor.start(tool, self.ports, self._memos[tool_id])
            for tool_id, tool in self.tools.items()
        }
        self._intake = Intake(
            run=run, policy=policy, tools=self.tools, stats=self.stats_, stopping=self._stopping,
            memos=self._memos, queues=self._queues, store=store, salvage=self.salvage,
            telemetry=self.telemetry,
        )  # fmt: skip
        self._proxy = DispatchProxy(self._intake, self.stats)
        if any(m.max_bytes for m in self._memos.values()):  # purge_epoch: every store has it
            PurgeWatcher(self._store_ref, list(self._queues.values()), self.timers, self._stopping).start()
        track(self)  # stopped at interpreter exit if the host never stops it
        host_signals.hold()  # under gevent, the host's signal handlers raise on its own greenlet

    @classmethod
    def start(
        cls,
        *,
        tools: Iterable[Tool],
        store: ReceiptStore,
        run: RunInfo,
        policy: Policy | None = None,
        pacer: Any = None,
        telemetry: Telemetry | None = None,
    ) -> DispatchSystem:
        """Start every actor and return the system.

        Args:
            tools: the tools calls may name.
            store: the receipt store (the system does not close it).
            run: the run's identity (run id, attempt, org, scope).
            policy: settings (default :class:`~actors.tool.Policy`).
            pacer: an :class:`~actors.pacing.pacers.Pacer` to pace providers with (e.g. one
                shared through Redis by several worker processes, from
                :func:`~actors.pacing.open_pacer`); None: this process paces alone.
                The system does not close it.
            telemetry: emit OpenTelemetry spans and metrics (:class:`~actors.telemetry.Telemetry`:
                its tracer and meter providers, default the global ones); None: off,
                and ``opentelemetry`` is never imported (docs/telemetry.md).

        Raises:
            ValueError: no tool, or tools of one provider giving different pacings
                (:func:`provider_pacings`), or money budgets that cannot be kept (a price
                in another currency than its budget's, a tool priced from its answer with
                no ``price_estimate``: :func:`~actors.governor.budgets.check_money_budgets`).
            TypeError: ``store`` is not a :class:`stores.ReceiptStore`.
            TelemetryUnavailableError: ``telemetry`` given, ``opentelemetry`` not installed.
        """
        return cls(tools, store, run, policy or Policy(), pacer, telemetry)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` began."""
        return self._stopped

    @property
    def memos(self) -> Mapping[str, Memo]:
        """Each tool's memo of recent outputs (tool id -> :class:`~actors.queue.Memo`; a
        read-only view), bounded by :attr:`~actors.tool.Policy.memo_max_bytes`."""
        return MappingProxyType(self._memos)

    def proxy(self) -> DispatchProxy:
        """The handle whose ``execute`` returns futures."""
        return self._proxy

    # -- calls ------------------------------------------------------------------------

    def _requeue(self, call: Call, error: BaseException) -> None:
        """Credentials changed: recompute the key and queue the call once more.

        Runs on the tool queue actor's thread; only ``tell``s.
        """
        if call.requeued:
            fail(call.future, error)
            return
        self._intake.forget_digest(call.tool.tool_id)
        try:  # the same input (already a private copy), keyed under the new credentials
            digest = self._intake.digest(call.tool)
            key, input_hash, _ = self._intake.key_maker(call.tool, digest, call.stale_after_s)(call.input)
        except BaseException as exc:  # on the tool queue's thread: answered, never passed on
            # judged by its real type and name: a foreign error's own may raise on this thread
            if not is_a(exc, Exception):
                name = type_name(exc)
                exc = DispatchError(f"{call.tool.tool_id}: asking for its credentials again raised {name}")
            fail(call.future, exc)
            return
        now = time.monotonic()
        left = call.timeout_s if call.timed_from is None else call.timeout_s - (now - call.timed_from)
        if left <= 0:  # its timeout counts from the first send: none left for another
            fail(
                call.future, ToolTimeoutError(f"{call.tool.tool_id} did not return within {call.timeout_s} s")
            )
            return
        fresh = attrs.evolve(
            call, key=key, input_hash=input_hash, credential_digest=digest, requeued=True, role=Role.OWNER,
            submitted_at=now, timeout_s=left, timed_from=None,
        )  # fmt: skip
        if fresh.key == call.key:
            fail(
                call.future,
                AuthScopeChangedError(
                    f"credentials changed but the receipt key did not: {error_text(error)}"
                ),
            )
            return
        self.stats_.add("requeued")
        self._intake.submit(call.tool.tool_id, [fresh])

    # -- observation ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: calls, live (executions of a tool), cached, in_flight (calls answered
        by joining an execution already running, a count, not a gauge), deduped,
        provider_calls, batches, retries, backpressure, failures, salvaged (entries this
        system wrote to the salvage file, a stop's own included), completed (receipts it
        stored completed with an output of its own), lease_lost,
        refused_by_latch, requeued, cancelled, errors, unavailable, timed_out, requests
        (every attempt sent), owner_waits (calls that waited on another live owner's
        receipt), waiting_on_owner (calls waiting so right now), answered (lookups, calls or
        batch members, in requests the provider answered anew: what it bills) and replayed
        (those it answered from its record of their idempotency key), receipts_created,
        orphan_leases_released and lease_cleanup_failed (leases a failed claim or release left
        this process holding, given back or given up: see :mod:`actors.lifecycle.cleanup`),
        refresh_uncertain (calls answered with a receipt's last good output while a refresh
        of it has an uncertain outcome: ``ToolResult.refresh_uncertain``), refresh_running
        (likewise while a refresh of it is under way: ``ToolResult.refresh_running``); plus
        ``outages`` (each outage of the receipt store or of a shared pacer this system's
        calls met, oldest first: ``service``, ``where``, ``began_at``, ``duration_s``,
        ``ongoing``, ``failures``, ``cause``; see :class:`actors.stats.Outages`),
        ``latch_tripped``, ``phases`` (p50/p95 ms), ``tools`` (tool id -> its own
        counters) and ``pacing`` ("org/provider" -> current rate and how it was learnt,
        limit estimate, pauses with their Retry-After, 429s, circuit state, time waited;
        see :func:`actors.pacing.bucket.pacing_report`); ``spent``: what the answers
        this system was sent cost by their tools' prices (``Tool.price``), as
        ``{"total": {currency: Money}, "tools": {tool id: {currency: Money}}}`` (a
        replayed answer is not counted: it was paid before); ``saved``: in the same shape,
        what the calls answered from receipts (``cached``) cost when their receipts were
        paid (``Receipt.cost``; a receipt paid before it kept a cost counts nothing);
        ``wasted``: in the same shape plus ``"reasons"``, what paid calls whose answer
        could not be used cost (see :data:`actors.stats.WASTE_REASONS`); ``waits``: where
        the time of each execution (a distinct call) went, in seconds summed over
        executions, by reason (:data:`actors.stats.WAIT_REASONS`: ``running``, ``slot``,
        ``pacing``, ``pause``, ``retry_backoff``, ``owner``, ``store``, ``batch_grace``), as
        ``{"tools": {tool id: {reason: s}}, "providers": {provider: {reason: s}}}``.
        """
        out: dict[str, Any] = self.stats_.snapshot()
        out["salvaged"] = self.salvage.appended  # what is in the file, however it got there
        out["tools"] = self.stats_.snapshot_tools()
        out["spent"] = self.stats_.snapshot_spent()
        out["saved"] = self.stats_.snapshot_saved()
        out["wasted"] = self.stats_.snapshot_wasted()
        out["waits"] = self._waits()
        out["latch_tripped"] = self.latch.tripped
        out["latch_refused"] = out.get("refused_by_latch", 0)
        out["phases"] = self.stats_.percentiles()
        out["runtime"] = self.runtime
        outages = self.stats_.outages.snapshot()
        log_of_pacer = getattr(self._pacer, "outage_log", None)
        if log_of_pacer is not None:
            outages = sorted([*outages, *log_of_pacer.snapshot()], key=lambda o: float(o["began_at"]))
        out["outages"] = outages
        try:
            out["pacing"] = self._governor.proxy().pacing_report().get(timeout=2.0)
        except Exception:  # stopped, or busy past the bound: stats never hang
            out["pacing"] = {}
        return out

    def _pacing_rates(self) -> dict[str, Any]:
        """The governor's pacing report (the pacing-rate gauge's callback, on the metric
        reader's thread; never on an actor's)."""
        report: dict[str, Any] = self._governor.proxy().pacing_report().get(timeout=2.0)
        return report

    def _waits(self) -> dict[str, Any]:
        """``{"tools": {tool id: {reason: s}}, "providers": {provider: {reason: s}}}``."""
        tools = self.stats_.snapshot_waits()
        providers: dict[str, dict[str, float]] = {}
        for tool_id, by in tools.items():
            tool = self.tools.get(tool_id)
            sums = providers.setdefault(tool.provider_name if tool is not None else tool_id, {})
            for reason, seconds in by.items():
                sums[reason] = sums.get(reason, 0.0) + seconds
        return {"tools": tools, "providers": providers}

    def replay_salvage(self) -> ReplayReport:
        """Put salvaged outputs into the store (see :meth:`SalvageLog.replay`)."""
        return self.salvage.replay(self.store)

    # -- lifecycle --------------------------------------------------------------------

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop within ``timeout_s`` seconds: reject what is not sent, let running calls finish.

        Calls not yet sent are rejected with CallCancelledError and their receipts
        released; provider calls already running finish and their completions are
        flushed (or salvaged) before this returns, unless ``timeout_s`` runs out first
        (a hung tool: its worker is a daemon and never keeps the process alive; its
        lease simply expires). Idempotent; a call submitted meanwhile gets
        CallCancelledError. A stop called while another thread's is under way waits for it
        within its own bound, and salvages what is still held if that runs out first.
        Called on an actor's thread (a future's done callback), it returns at once and the
        stop goes on on a thread of its own (a later stop() from the host waits for it).
        Called from inside a stop under way on the same thread (a signal handler), it
        salvages what is held and returns at once. Interrupted (``KeyboardInterrupt``, a
        signal handler's ``SystemExit``) or failing, it salvages what is still held before
        the error leaves it.
        """
        if on_actor() and not self._stop_done.is_set():
            # on an actor's thread (a future's done callback): the stop waits on that very
            # actor, which would wait out the whole bound and leave the results coming back
            # meanwhile unread (paid results lost); it goes on on a thread of its own, and
            # this returns at once
            threading.Thread(
                target=self.stop, args=(timeout_s,), name="tooldispatch-stop", daemon=True
            ).start()
            return
        with host_signals.stopping():  # (under gevent: a host handler running meanwhile, after it)
            first = False
            try:
                with self._lock:
                    first = not self._stopped
                    if first:
                        self.launch.stop()  # from here on no request leaves, not even one a worker holds
                        self._stopped = True
                        self._stopper = threading.get_ident()
                if first:
                    self._stop(timeout_s)
                elif self._stopper == threading.get_ident() and not self._stop_done.is_set():
                    # this thread's own stop is under way, and this call came from inside it (a
                    # signal handler): waiting for it would wait out the whole bound. What is
                    # held goes on disk, for the handler may exit; the stop goes on after it
                    self._salvage_held()
                elif not wait_interjected(self._stop_done, min(timeout_s, MAX_WAIT_S)):
                    self._salvage_held()  # on disk before this caller goes on (it may exit)
            except BaseException:
                # interrupted (Ctrl-C, a signal handler's exit) or failed: what the flusher
                # holds goes on disk before this leaves, as when the bound runs out; the
                # actors' threads are daemons, and the process may exit now
                self._salvage_held()
                raise
            finally:
                if first:
                    self._stop_done.set()
                    host_signals.release()

    def _stop(self, timeout_s: float) -> None:
        self._stopping.set()
        untrack(self)
        end = time.monotonic() + min(timeout_s, MAX_WAIT_S)  # a huge bound means "wait as long as it takes"
        self._intake.join_read_ahead(min(1.0, timeout_s / 4))  # (a page's read at most)
        idle = []
        for ref in self._queues.values():
            reply, done = new_future(), new_future()
            try:
                ref.tell(StopQueue(reply=reply, idle=done))
            except pykka.ActorDeadError:
                continue
            idle.append(done)
        with contextlib.suppress(Exception):
            self._governor.proxy().stop_waiters().get(timeout=max(0.0, end - time.monotonic()))
        # running calls finish and are persisted; a write waiting on the completion ladder
        # (1 s, 3 s, 9 s) is not waited out past half the bound: it is given up (latch,
        # read-back, salvage), so a paid result is stored or salvaged before stop returns
        halfway = time.monotonic() + (end - time.monotonic()) / 2
        pending = list(idle)
        while pending:
            try:
                pending[0].get(timeout=max(0.0, halfway - time.monotonic()))
                pending.pop(0)
            except pykka.Timeout:
                break
        if pending:
            with contextlib.suppress(Exception):
                self._flusher.proxy().give_up_now().get(timeout=max(0.1, end - time.monotonic()))
        ran_out = False
        for done in pending:
            try:
                done.get(timeout=max(0.0, end - time.monotonic()))
            except pykka.Timeout:
                ran_out = True
                break
        if ran_out or self._writing:  # on disk first: a host may exit as soon as stop returns
            self._salvage_held()
        self._pool.shutdown()
        refs: list[Any] = [
            *self._queues.values(),
            self._heartbeat,
            self._governor,
            self._flusher,
            self._store_ref,
        ]
        for ref in refs:  # typed Any: pykka 4.4 types the mixed list as object
            with contextlib.suppress(Exception):
                ref.stop(timeout=max(0.1, end - time.monotonic()))
        if self._writing:  # taken meanwhile, and still waiting on the store
            self._salvage_held()
        self.timers.stop()

    def _salvage_held(self) -> None:
        """The bound ran out while writes wait on the store: salvage, from this thread,
        what is being written or held by the flusher, and the flush requests it has not
        read yet (its thread, a daemon, may never get to them before the process exits)."""
        with contextlib.suppress(Exception):
            salvage_writing(self._writing, self.salvage)
        with contextlib.suppress(Exception):
            salvage_unread(self._flusher.actor_inbox, self.salvage, self.run.scope)

    def __enter__(self) -> DispatchSystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _default_salvage_path(store: ReceiptStore) -> str:
    path = store.capabilities.file_path
    if path is not None:
        return f"{path}.salvage.jsonl"
    return os.path.abspath("tooldispatch-salvage.jsonl")
