"""Counters and per-phase timings of a dispatch system (thread-safe)."""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from stores.money import Money

__all__ = ["PHASES", "WAIT_REASONS", "WASTE_REASONS", "Outages", "Stats"]

PHASES = (
    "provider",
    "local_run",
    "receipt_prepare",
    "receipt_complete",
    "group",
    "recovery",
)
"""Phases timed (docs/host-api.md, Configuration: perf_hook)."""

_KEEP = 50_000
"""Timings kept per phase for percentiles (the newest)."""

HOOK_BACKLOG = 10_000
"""Most timings waiting for a slow perf hook; past it, timings skip the hook (counted in
``perf_hook_dropped``)."""

log = logging.getLogger("tooldispatch")


class _HookRunner:
    """Calls the perf hook on a daemon thread of its own, in the order timings came, so
    that user code never runs on an actor or a worker: a slow hook delays nothing but
    later hook calls. The thread starts with the first timing and ends after 5 s idle."""

    def __init__(self, hook: Callable[[str, float, dict[str, Any]], None]) -> None:
        self.hook = hook
        self.dropped = 0
        self._queue: queue.SimpleQueue[tuple[str, float, dict[str, Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False

    def put(self, phase: str, ms: float, extra: dict[str, Any]) -> None:
        if self._queue.qsize() >= HOOK_BACKLOG:
            self.dropped += 1
            return
        self._queue.put((phase, ms, extra))
        with self._lock:
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._run, name="tooldispatch-perf-hook", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                phase, ms, extra = self._queue.get(timeout=5.0)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._running = False
                        return
                continue
            try:
                self.hook(phase, ms, extra)
            except BaseException:  # an observer never breaks anything (SystemExit included)
                log.exception("perf hook failed on %s", phase)


class Outages:
    """Outages of the services a dispatch system calls (the receipt store, a shared pacer),
    as its callers see them: a call that fails because the service is away opens one (or
    counts in the one open), the next call it answers closes it. Thread-safe.

    Each outage is named by ``service`` (``"receipt store"``, ``"pacer"``) and ``where``
    (its address, password left out). :meth:`snapshot` gives them in the order they began.

    Args:
        clock: monotonic seconds (durations); ``wall``: epoch seconds (when each began).
    """

    KEEP = 100
    """Outages kept (the newest); older ones are only counted (``dropped``)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], dict[str, Any]] = {}
        self._done: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.KEEP)
        self.dropped = 0
        """Outages no longer kept (more than :attr:`KEEP` ended)."""

    def failed(self, service: str, where: str, error: str, since: float | None = None) -> tuple[float, float]:
        """A call to ``service`` at ``where`` failed with ``error`` (its text) because the
        service is away; ``since``: when that call began (``clock`` seconds; default now),
        which begins the outage if none is open (a call may wait long for a connection
        before it fails). Returns when this outage began: (``clock`` seconds, epoch seconds)."""
        with self._lock:
            outage = self._open.get((service, where))
            if outage is None:
                now = self._clock()
                began = now if since is None else min(since, now)
                outage = self._open[service, where] = {
                    "service": service, "where": where, "began_at": self._wall() - (now - began),
                    "began": began, "failures": 0, "cause": error,
                }  # fmt: skip
            outage["failures"] += 1
            outage["last_error"] = error
            return float(outage["began"]), float(outage["began_at"])

    def answered(self, service: str, where: str) -> float | None:
        """A call to ``service`` at ``where`` was answered: the outage open, if any, ends.
        Returns its duration in seconds (None: none was open). Cheap when none is open."""
        if not self._open:  # the usual case: no lock taken
            return None
        with self._lock:
            outage = self._open.pop((service, where), None)
            if outage is None:
                return None
            outage["duration_s"] = self._clock() - outage.pop("began")
            if len(self._done) == self._done.maxlen:
                self.dropped += 1
            self._done.append(outage)
            duration: float = outage["duration_s"]
            return duration

    def since(self, service: str, where: str) -> float | None:
        """When the outage of ``service`` at ``where`` open now began (``clock`` seconds), or None."""
        outage = self._open.get((service, where))
        return None if outage is None else float(outage["began"])

    def snapshot(self) -> list[dict[str, Any]]:
        """Every outage kept, oldest first: ``service``, ``where``, ``began_at`` (epoch
        seconds), ``duration_s`` (so far, for one still open), ``ongoing``, ``failures``
        (calls that failed on it), ``cause`` (the first error) and ``last_error``."""
        now = self._clock()
        with self._lock:
            done = [{**o, "ongoing": False} for o in self._done]
            ongoing = [
                {
                    **{k: v for k, v in o.items() if k != "began"},
                    "duration_s": now - o["began"],
                    "ongoing": True,
                }
                for o in self._open.values()
            ]
        return sorted(done + ongoing, key=lambda o: float(o["began_at"]))


WAIT_REASONS = {
    "batch_grace": "gathered into a batch: the grace a batch tool's queue waits for more calls",
    "running": "sent and waiting for the provider's answer",
    "slot": "waiting for a slot: the provider's rate or concurrency, or the run's ceiling",
    "pacing": "granted, waiting for its turn at the provider's send gate",
    "pause": "held by a 429's Retry-After (at the governor, or at the send gate)",
    "quota": "waiting for a spent quota's window (a Limit over a minute, an hour, a day) to renew",
    "retry_backoff": "waiting out the back-off before a retry",
    "owner": "waiting for another run's execution of the same call (its receipt)",
    "store": "waiting for the receipt store: a claim, or the write of an answer",
}
"""Where an execution's time goes (``stats()["waits"]``; the report's "time at P")."""

WASTE_REASONS = {
    "refused": "paid answers another run's output replaced: it completed the receipt first",
    "uncertain": "sends whose outcome is uncertain (no answer, the provider may have acted), at the "
    "tool's stated price (``Tool.stated_price``: its Money price or its price_estimate)",
}
"""Why paid calls were wasted (``stats()["wasted"]["reasons"]``)."""


class Stats:
    """Counters (``calls``, ``live``, ``cached``, ``in_flight``, ``deduped``,
    ``provider_calls``, ``batches``, ``retries``, ``backpressure``, ``failures``,
    ``salvaged``, ``lease_lost``, ``refused_by_latch``, ``requeued``, ``cancelled``,
    ``errors``, ``unavailable``: calls refused by an open provider circuit, ``answered``:
    lookups (calls, or batch members) in requests the provider answered anew, what it
    bills; ``replayed``: those it answered from its record of their idempotency key,
    ``refresh_uncertain``: calls answered with a receipt's last good output while a
    refresh of it has an uncertain outcome, ``refresh_running``: likewise while a refresh
    of it is under way; ``requests_resent``: requests a lost owner recorded, taken over
    and sent again whole; ``completed``: receipts this system stored completed with an output
    of its own, not those whose output it salvaged)
    and phase timings in milliseconds.

    Args:
        perf_hook: ``hook(phase, ms, extra)``, called on a thread of its own
            (``tooldispatch-perf-hook``), in the order the phases were timed, soon after
            each: never on an actor or a tool's worker, so a slow hook delays no call.
    """

    COUNTERS = (
        "calls", "live", "cached", "in_flight", "deduped", "provider_calls", "batches",
        "retries", "backpressure", "failures", "salvaged", "lease_lost", "refused_by_latch",
        "requeued", "cancelled", "errors", "unavailable", "orphan_leases_released", "lease_cleanup_failed",
        "requests", "receipts_created", "batches_compiled", "owner_waits", "waiting_on_owner",
        "salvage_failed", "answered", "replayed", "refresh_uncertain", "refresh_running", "requests_resent",
        "completed",
    )  # fmt: skip

    def __init__(self, perf_hook: Callable[[str, float, dict[str, Any]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(self.COUNTERS, 0))
        self.timings: dict[str, collections.deque[float]] = {
            p: collections.deque(maxlen=_KEEP) for p in PHASES
        }
        self.perf_hook = perf_hook
        self._hook = _HookRunner(perf_hook) if perf_hook is not None else None
        self.per_tool: dict[str, collections.Counter[str]] = {}
        self.outages = Outages()
        """Outages of the receipt store seen by this system's calls (see :class:`Outages`)."""
        self.spent: dict[str, Money] = {}
        """Currency -> what the answers this system was sent cost (``Tool.price``)."""
        self.spent_by_tool: dict[str, dict[str, Money]] = {}
        """Tool id -> currency -> the same, per tool."""
        self.saved: dict[str, Money] = {}
        """Currency -> what the calls answered from receipts (``cached``) cost when their
        receipts were paid (``Receipt.cost``)."""
        self.saved_by_tool: dict[str, dict[str, Money]] = {}
        """Tool id -> currency -> the same, per tool."""
        self.wasted: dict[str, Money] = {}
        """Currency -> what paid calls whose answer this system could not use cost, or may
        have cost (see :data:`WASTE_REASONS`)."""
        self.wasted_by_tool: dict[str, dict[str, Money]] = {}
        """Tool id -> currency -> the same, per tool."""
        self.waits: dict[str, dict[str, float]] = {}
        """Tool id -> reason (:data:`WAIT_REASONS`) -> seconds its executions spent so
        (each distinct call counted once: a batch request's wait counts once per member)."""
        self.wasted_by_reason: dict[str, dict[str, Money]] = {}
        """Reason (:data:`WASTE_REASONS`) -> currency -> the same, per reason."""
        self.telemetry: Any = None
        """The system's instruments when telemetry is on: told of money spent and saved."""

    def add(self, name: str, n: int = 1, tool: str | None = None) -> None:
        """Add ``n`` to a counter (and to ``tool``'s own counter, when given)."""
        with self._lock:
            self.counters[name] += n
            if tool is not None:
                counts = self.per_tool.get(tool)
                if counts is None:
                    counts = self.per_tool[tool] = collections.Counter()
                counts[name] += n

    def spend(self, costs: Sequence[Money], tool: str) -> None:
        """Add what answers of ``tool`` cost (paid this run) to its and the system's sums."""
        self._add_money(costs, tool, self.spent, self.spent_by_tool, "spent")
        if self.telemetry is not None:
            self.telemetry.money(costs, tool, saved=False)

    def save(self, costs: Sequence[Money], tool: str) -> None:
        """Add what calls of ``tool`` answered from receipts cost when they were paid."""
        self._add_money(costs, tool, self.saved, self.saved_by_tool, "saved")
        if self.telemetry is not None:
            self.telemetry.money(costs, tool, saved=True)

    def waited(self, tool: str, reason: str, seconds: float) -> None:
        """Add ``seconds`` that executions of ``tool`` spent on ``reason`` (:data:`WAIT_REASONS`)."""
        if seconds > 0.0:
            with self._lock:
                by = self.waits.get(tool)
                if by is None:
                    by = self.waits[tool] = {}
                by[reason] = by.get(reason, 0.0) + seconds

    def snapshot_waits(self) -> dict[str, dict[str, float]]:
        """Tool id -> reason -> seconds (see :attr:`waits`)."""
        with self._lock:
            return {tool: dict(by) for tool, by in self.waits.items()}

    def waste(self, costs: Sequence[Money], tool: str, reason: str) -> None:
        """Add what paid calls of ``tool`` whose answer was not used cost (``reason``: one
        of :data:`WASTE_REASONS`)."""
        self._add_money(costs, tool, self.wasted, self.wasted_by_tool, "wasted")
        self._add_money(costs, reason, {}, self.wasted_by_reason, "wasted")

    def _add_money(
        self, costs: Sequence[Money], tool: str, total: dict[str, Money],
        by_tool: dict[str, dict[str, Money]], what: str,
    ) -> None:  # fmt: skip
        with self._lock:
            for cost in costs:
                for sums in (total, by_tool.setdefault(tool, {})):
                    held = sums.get(cost.currency)
                    try:
                        sums[cost.currency] = cost if held is None else held + cost
                    except ValueError as exc:  # past Money's bound: the sum stays as it was
                        log.warning("%s: what it %s is past what a sum can hold: %s", tool, what, exc)

    def record(self, phase: str, ms: float, **extra: Any) -> None:
        """Record one timing of ``phase`` in milliseconds and call the perf hook."""
        self.timings.setdefault(phase, collections.deque(maxlen=_KEEP)).append(ms)
        if self._hook is not None:
            self._hook.put(phase, ms, extra)

    @contextmanager
    def timed(self, phase: str, **extra: Any) -> Iterator[None]:
        """Time the block as ``phase``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(phase, (time.perf_counter() - start) * 1000.0, **extra)

    def percentiles(self) -> dict[str, dict[str, float]]:
        """Per phase: count, p50 and p95 in milliseconds (phases with timings only)."""
        out = {}
        for phase, values in self.timings.items():
            data = sorted(values)
            if data:
                out[phase] = {
                    "count": float(len(data)),
                    "p50_ms": data[len(data) // 2],
                    "p95_ms": data[min(len(data) - 1, int(len(data) * 0.95))],
                }
        return out

    def snapshot(self) -> dict[str, int]:
        """A copy of the counters (and ``perf_hook_dropped`` with a perf hook)."""
        with self._lock:
            out = dict(self.counters)
        if self._hook is not None:
            out["perf_hook_dropped"] = self._hook.dropped
        return out

    def snapshot_spent(self) -> dict[str, Any]:
        """``{"total": {currency: Money}, "tools": {tool id: {currency: Money}}}``."""
        with self._lock:
            return {"total": dict(self.spent), "tools": {t: dict(s) for t, s in self.spent_by_tool.items()}}

    def snapshot_saved(self) -> dict[str, Any]:
        """As :meth:`snapshot_spent`, for what the answers from receipts saved."""
        with self._lock:
            return {"total": dict(self.saved), "tools": {t: dict(s) for t, s in self.saved_by_tool.items()}}

    def snapshot_wasted(self) -> dict[str, Any]:
        """As :meth:`snapshot_spent`, for what was wasted, with ``"reasons": {reason:
        {currency: Money}}`` (:data:`WASTE_REASONS`)."""
        with self._lock:
            return {
                "total": dict(self.wasted),
                "tools": {t: dict(s) for t, s in self.wasted_by_tool.items()},
                "reasons": {r: dict(s) for r, s in self.wasted_by_reason.items()},
            }

    def snapshot_tools(self) -> dict[str, dict[str, int]]:
        """Tool id -> a copy of that tool's counters (``calls``, ``live``, ``cached``,
        ``in_flight``, ``deduped``, ``errors``, ``provider_calls``, ``requests``,
        ``backpressure``, ``failures``, ``answered``, ``replayed``, ...; a counter the
        tool never moved is absent)."""
        with self._lock:
            return {tool: dict(counts) for tool, counts in self.per_tool.items()}
