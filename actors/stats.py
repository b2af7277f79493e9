"""Counters and per-phase timings of a dispatch system (thread-safe)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["PHASES", "Stats"]

PHASES = (
    "provider",
    "local_run",
    "receipt_prepare",
    "receipt_complete",
    "group",
    "recovery",
)
"""Phases timed (docs/how-it-works.md, Observability)."""

_KEEP = 50_000
"""Timings kept per phase for percentiles (the newest)."""


class Stats:
    """Counters (``calls``, ``live``, ``cached``, ``in_flight``, ``deduped``,
    ``provider_calls``, ``batches``, ``retries``, ``backpressure``, ``failures``,
    ``salvaged``, ``lease_lost``, ``refused_by_latch``, ``requeued``, ``cancelled``,
    ``errors``, ``unavailable``: calls refused by an open provider circuit)
    and phase timings in milliseconds.

    Args:
        perf_hook: ``hook(phase, ms, extra)``, called on the thread that timed the
            phase (a drain worker or an actor).
    """

    COUNTERS = (
        "calls", "live", "cached", "in_flight", "deduped", "provider_calls", "batches",
        "retries", "backpressure", "failures", "salvaged", "lease_lost", "refused_by_latch",
        "requeued", "cancelled", "errors", "unavailable", "orphan_leases_released", "lease_cleanup_failed",
        "requests", "receipts_created", "batches_compiled", "owner_waits", "waiting_on_owner",
        "salvage_failed",
    )  # fmt: skip

    def __init__(self, perf_hook: Callable[[str, float, dict[str, Any]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(self.COUNTERS, 0))
        self.timings: dict[str, collections.deque[float]] = {
            p: collections.deque(maxlen=_KEEP) for p in PHASES
        }
        self.perf_hook = perf_hook
        self.per_tool: dict[str, collections.Counter[str]] = {}

    def add(self, name: str, n: int = 1, tool: str | None = None) -> None:
        """Add ``n`` to a counter (and to ``tool``'s own counter, when given)."""
        with self._lock:
            self.counters[name] += n
            if tool is not None:
                counts = self.per_tool.get(tool)
                if counts is None:
                    counts = self.per_tool[tool] = collections.Counter()
                counts[name] += n

    def record(self, phase: str, ms: float, **extra: Any) -> None:
        """Record one timing of ``phase`` in milliseconds and call the perf hook."""
        self.timings.setdefault(phase, collections.deque(maxlen=_KEEP)).append(ms)
        if self.perf_hook is not None:
            try:
                self.perf_hook(phase, ms, extra)
            except BaseException:  # an observer never breaks a call (nor stops an actor)
                logging.getLogger("tooldispatch").exception("perf hook failed on %s", phase)

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
        """A copy of the counters."""
        with self._lock:
            return dict(self.counters)

    def snapshot_tools(self) -> dict[str, dict[str, int]]:
        """Tool id -> a copy of that tool's counters (``calls``, ``live``, ``cached``,
        ``in_flight``, ``deduped``, ``errors``, ``provider_calls``, ``backpressure``,
        ``failures``)."""
        with self._lock:
            return {tool: dict(counts) for tool, counts in self.per_tool.items()}
