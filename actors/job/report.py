"""Live progress and the end-of-run report (rich).

On a terminal a live line redraws in place; otherwise a plain line is printed every
``interval_s`` seconds. Both are driven by :class:`ProgressDisplay` from the CLI's
thread; nothing here touches the actors except reading ``stats()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .runner import RunSummary

__all__ = ["ProgressDisplay", "progress_line", "report_table", "tools_table"]


def progress_line(done: int, total: int | None, stats: dict[str, Any], elapsed_s: float) -> str:
    """One line: rows done, calls live/cached/in-flight, provider calls, 429s, ETA."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    if total:
        eta = f"{(total - done) / rate:.0f}s" if rate > 0 else "?"
        rows = f"rows {done}/{total} ({100.0 * done / total:.1f}%)"
    else:
        eta, rows = "?", f"rows {done}"
    return (
        f"{rows} | live {stats.get('live', 0)} cached {stats.get('cached', 0)} "
        f"in-flight {stats.get('in_flight', 0)} | provider calls {stats.get('provider_calls', 0)} "
        f"| 429s {stats.get('backpressure', 0)} | {rate:.0f} rows/s | ETA {eta}"
    )


class ProgressDisplay:
    """Shows progress until :meth:`close`.

    Args:
        console: where to draw: live redraws when it is interactive (a terminal that is
            not ``TERM=dumb``), else plain lines (rich's ``is_interactive``).
        total: rows expected (None if unknown).
        stats: ``stats() -> dict`` of the dispatch system.
        interval_s: seconds between plain lines (non-terminal).
    """

    def __init__(
        self,
        console: Console,
        total: int | None,
        stats: Callable[[], dict[str, Any]],
        interval_s: float = 2.0,
    ) -> None:
        self.console, self.total, self.stats, self.interval_s = console, total, stats, interval_s
        self.done = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._live: Live | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ProgressDisplay:
        if self.console.is_interactive:
            self._live = Live(Text(self._line()), console=self.console, refresh_per_second=8, transient=False)
            self._live.start()
        self._thread = threading.Thread(target=self._loop, name="tooldispatch-progress", daemon=True)
        self._thread.start()
        return self

    def advance(self) -> None:
        self.done += 1

    def _line(self) -> str:
        return progress_line(self.done, self.total, self.stats(), time.monotonic() - self.started)

    def _loop(self) -> None:
        interval = 0.125 if self._live is not None else self.interval_s
        while not self._stop.wait(interval):
            if self._live is not None:
                self._live.update(Text(self._line()))
            else:
                self.console.print(f"progress: {self._line()}", highlight=False, soft_wrap=True)

    def close(self, *, final: bool = True) -> None:
        """Stop the display; ``final`` leaves a last progress line (False erases the live
        line and prints none, so a configuration error stays the only line)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._live is not None:
            if final:
                self._live.update(Text(self._line()))
            else:
                self._live.transient = True
            self._live.stop()
        elif final:
            self.console.print(f"progress: {self._line()}", highlight=False, soft_wrap=True)


_COUNTERS = (
    ("calls", "calls"), ("live", "live"), ("cached", "cached"), ("in_flight", "in-flight"),
    ("deduped", "deduped"), ("provider_calls", "provider calls"), ("batches", "batches"),
    ("retries", "retries"), ("backpressure", "429s"), ("failures", "failures"), ("salvaged", "salvaged"),
    ("unavailable", "refused, provider down"),
)  # fmt: skip


def report_table(stats: dict[str, Any], summary: RunSummary) -> Table:
    """The end-of-run report: counters, p50/p95 per phase, wall time, rows/s."""
    table = Table(title="tooldispatch run report", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("rows", f"{summary.rows} ({summary.ok} ok, {summary.failed} failed)")
    for key, label in _COUNTERS:
        table.add_row(label, str(stats.get(key, 0)))
    for phase, figures in sorted(stats.get("phases", {}).items()):
        table.add_row(f"{phase} p50 / p95", f"{figures['p50_ms']:.2f} / {figures['p95_ms']:.2f} ms")
    table.add_row("wall time", f"{summary.wall_s:.2f} s")
    table.add_row("rows/s", f"{summary.rows_per_s:.1f}")
    if stats.get("latch_tripped"):
        table.add_row("latch", f"TRIPPED ({stats.get('latch_refused', 0)} calls refused)")
    for error, count in summary.errors.most_common(3):
        table.add_row(f"error ({count} rows)", error)
    if summary.interrupted:
        table.add_row("status", "interrupted: run the same command again to resume")
    return table


_TOOL_COLUMNS = (
    ("calls", "calls"), ("live", "live"), ("cached", "cached"), ("in_flight", "in-flight"),
    ("deduped", "deduped"), ("provider_calls", "provider calls"), ("backpressure", "429s"),
    ("failures", "failures"), ("unavailable", "refused, provider down"),
)  # fmt: skip


def tools_table(stats: dict[str, Any]) -> Table:
    """Per tool: its calls and how they were served (``stats["tools"]``), so a local
    tool's calls are not mistaken for a paid provider's."""
    tools = sorted(stats.get("tools", {}).items())
    table = Table(title="per tool", show_header=True, header_style="bold")
    table.add_column("metric")
    for tool, _ in tools:  # a column per tool: a few tools fit a terminal's width
        table.add_column(tool, justify="right")
    for key, label in _TOOL_COLUMNS:
        table.add_row(label, *(str(counts.get(key, 0)) for _, counts in tools))
    return table
