"""Runs a play over rows: rows concurrently, output in input order, stoppable.

Threads: ``concurrency`` workers (OS threads, or greenlets under gevent) each take the
next row, run ``play(row, ctx)`` and hand the outcome to the ordered writer.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

import attrs
import orjson

from ..errors import UnknownToolError
from .play import Play, PlayContext, RowError

__all__ = ["RowOutcome", "RunSummary", "run_rows"]


@attrs.frozen
class RowOutcome:
    """One row's result, as written to the output (JSONL)."""

    index: int
    row: Any
    result: Any = None
    error: str | None = None


@attrs.define
class RunSummary:
    """What a run did: row counts, wall time, whether it was interrupted."""

    rows: int = 0
    ok: int = 0
    failed: int = 0
    interrupted: bool = False
    wall_s: float = 0.0
    config_error: str | None = None
    """Set when the run cannot go on (a row named an unknown tool, the input cannot be
    read on, the output cannot be written): it stops."""
    errors: collections.Counter[str] = attrs.field(factory=collections.Counter)
    """Row errors by text (first 160 characters), for the report."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s > 0 else 0.0


class _OrderedWriter:
    """Writes outcomes in input order; out-of-order ones wait in a buffer."""

    def __init__(self, out: IO[bytes] | None) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.next = 0
        self.pending: dict[int, RowOutcome] = {}

    def put(self, outcome: RowOutcome) -> None:
        with self.lock:
            self.pending[outcome.index] = outcome
            while self.next in self.pending:
                self._write(self.pending.pop(self.next))
                self.next += 1

    def close(self) -> None:
        """Write what is left (rows after a gap left by an interruption), in order."""
        with self.lock:
            for index in sorted(self.pending):
                self._write(self.pending.pop(index))

    def _write(self, outcome: RowOutcome) -> None:
        if self.out is not None:
            line = {
                "index": outcome.index,
                "row": outcome.row,
                "result": outcome.result,
                "error": outcome.error,
            }
            self.out.write(orjson.dumps(line, default=repr) + b"\n")


def run_rows(
    play: Play,
    rows: Iterable[Any],
    ctx: PlayContext,
    *,
    concurrency: int,
    out: IO[bytes] | None,
    stop: threading.Event,
    on_row: Callable[[RowOutcome], None] | None = None,
) -> RunSummary:
    """Run ``play`` over ``rows`` with ``concurrency`` workers until done or ``stop`` is set.

    Rows not started when ``stop`` is set are skipped (a rerun resumes them).
    """
    summary = RunSummary()
    writer = _OrderedWriter(out)
    source = iter(enumerate(rows))
    source_lock = threading.Lock()
    count_lock = threading.Lock()
    started = time.monotonic()

    def take() -> tuple[int, Any] | None:
        with source_lock:
            if stop.is_set():
                return None
            try:
                return next(source, None)
            except Exception as exc:  # the input cannot be read on: stop, say so (exit 2)
                summary.config_error = (
                    summary.config_error or f"cannot read the input: {type(exc).__name__}: {exc}"
                )
                stop.set()
                return None

    def work() -> None:
        try:
            _work()
        except Exception as exc:  # writing the output failed (disk full, ...): stop, say so
            summary.config_error = (
                summary.config_error or f"cannot write the output: {type(exc).__name__}: {exc}"
            )
            stop.set()

    def _work() -> None:
        while (item := take()) is not None:
            index, row = item
            if isinstance(row, RowError):
                outcome = RowOutcome(index, None, error=f"RowError: {row}")
            else:
                try:
                    outcome = RowOutcome(index, row, result=play.run(row, ctx))
                except UnknownToolError as exc:
                    summary.config_error = str(exc)
                    stop.set()
                    outcome = RowOutcome(index, row, error=f"UnknownToolError: {exc}")
                except Exception as exc:
                    outcome = RowOutcome(index, row, error=f"{type(exc).__name__}: {exc}")
            writer.put(outcome)
            with count_lock:
                summary.rows += 1
                if outcome.error is None:
                    summary.ok += 1
                else:
                    summary.failed += 1
                    summary.errors[outcome.error[:160]] += 1
            if on_row is not None:
                on_row(outcome)

    workers = [
        threading.Thread(target=work, name=f"tooldispatch-row-{i}", daemon=True) for i in range(concurrency)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    try:
        writer.close()
    except Exception as exc:
        summary.config_error = summary.config_error or f"cannot write the output: {type(exc).__name__}: {exc}"
    summary.interrupted = stop.is_set() and summary.config_error is None
    summary.wall_s = time.monotonic() - started
    return summary
