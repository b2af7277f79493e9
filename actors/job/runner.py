"""Runs a play over rows: rows concurrently, output in input order, stoppable.

Threads: ``concurrency`` workers (OS threads, or greenlets under gevent) each take the
next row, run ``play(row, ctx)``, encode the outcome as one JSONL line and hand it to
the ordered writer (:mod:`._ordered`), whose memory is bounded by bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Any

import attrs
import orjson

from actors.errors import CallCancelledError, UnknownToolError, cause_of, error_text, is_a, type_name
from actors.job.error_kinds import ErrorKinds
from actors.job.ordered import DEFAULT_MEMORY_BYTES, OrderedWriter
from actors.job.play import Play, PlayContext
from actors.job.rows import InputError, RowError

__all__ = ["FIRST_WORKERS", "STUCK_S", "RowOutcome", "RunSummary", "cut_short", "encode_outcome", "run_rows"]

FIRST_WORKERS = 4
"""Row workers a run starts with (fewer when ``concurrency`` is lower)."""
STUCK_S = 0.02
"""Seconds a worker's row runs before the run adds a worker for it (checked as often)."""


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
    aborted: bool = False
    """Set by the caller: a second signal aborted the run (its rows were not let finish)."""
    wall_s: float = 0.0
    config_error: str | None = None
    """Set when the run cannot go on (a row named an unknown tool, the input cannot be
    read on, the output cannot be written): it stops."""
    errors: ErrorKinds = attrs.field(factory=ErrorKinds)
    """Row errors grouped by kind, for the report."""
    written: int = 0
    """Lines in the output file (0 without --output); kept current while the rows run."""
    cut_short: int = 0
    """Rows a stop cut short: a call of theirs was cancelled (a signal stopped the
    dispatch system before it was sent). Neither written nor counted in ``rows``: not
    done, a rerun runs them."""
    buffer_peak_bytes: int = 0
    """Most bytes of finished rows held in memory waiting for an earlier row."""
    spilled_bytes: int = 0
    """Bytes of finished rows that waited on disk instead (the memory bound was reached)."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s > 0 else 0.0


def encode_outcome(outcome: RowOutcome) -> tuple[bytes, str | None]:
    """The outcome as one JSONL line, and the error that replaced its result (or None).

    orjson first; where it refuses (an integer beyond 64 bits, a lone surrogate, nesting
    deeper than 255, non-string keys) the standard library's exact encoder (``\\uXXXX``
    escapes, any integer). A result that neither can write (a set, bytes, NaN...) makes
    the row fail alone: its line has ``result: null`` and says why.
    """
    line = {"index": outcome.index, "row": outcome.row, "result": outcome.result, "error": outcome.error}
    try:
        return orjson.dumps(line) + b"\n", None
    except TypeError:
        pass
    try:
        return json.dumps(
            line, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode() + b"\n", None
    except (TypeError, ValueError, RecursionError) as exc:
        why = f"{type_name(exc)}: {error_text(exc)}"
        error = f"ResultNotWritableError: the row's result has no JSON form ({why})"
    failed = {"index": outcome.index, "row": outcome.row, "result": None, "error": error}
    try:
        return orjson.dumps(failed) + b"\n", error
    except TypeError:
        failed["row"] = None
        return orjson.dumps(failed) + b"\n", error


def cut_short(exc: BaseException) -> bool:
    """Whether a row's error is a call cancelled by a stop (:class:`CallCancelledError`,
    raised or the cause of what the play raised): the row did not run to its end."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        if is_a(error, CallCancelledError):
            return True
        seen.add(id(error))
        error = cause_of(error) or _context_of(error)
    return False


_CONTEXT = BaseException.__dict__["__context__"]


def _context_of(exc: BaseException) -> BaseException | None:
    """What ``exc`` was raised while handling, read from the slot (a play's own error
    class cannot make it raise)."""
    try:
        context = _CONTEXT.__get__(exc)
    except Exception:
        return None
    return context if is_a(context, BaseException) else None


def run_rows(
    play: Play,
    rows: Iterable[Any],
    ctx: PlayContext | None,
    *,
    concurrency: int,
    out: IO[bytes] | None,
    stop: threading.Event,
    on_row: Callable[[RowOutcome], None] | None = None,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    summary: RunSummary | None = None,
    writer: OrderedWriter | None = None,
) -> RunSummary:
    """Run ``play`` over ``rows`` with up to ``concurrency`` workers until done or ``stop``
    is set.

    The run starts :data:`FIRST_WORKERS` workers and adds one each time a row waits for
    a call not answered at once (``ctx.tool``), and one for each row that has run
    :data:`STUCK_S` or more (waiting on something else), up to ``concurrency``: rows
    answered at once (a rerun's receipts) run on a few threads, which take the GIL in
    turn with less waiting, and rows that wait get the width.

    Rows not started when ``stop`` is set are skipped (a rerun resumes them), and so are
    rows a stop cut short (once ``stop`` is set: the row raised :func:`cut_short` error,
    or one of its ``ctx.tool`` calls was cancelled and the play caught it): neither is
    written nor counted, nor passed to ``on_row`` (``summary.cut_short`` counts the latter).
    Finished rows wait for earlier ones in at most ``memory_bytes`` of memory, then in a
    temporary file next to ``out`` (see :class:`OrderedWriter`). ``summary``: the
    object to fill (the caller reads it while the rows run), else a new one; ``writer``:
    the writer of ``out`` to use (the caller may close it early), else a new one.
    """
    summary = summary if summary is not None else RunSummary()
    writer = writer if writer is not None else OrderedWriter(out, memory_bytes=memory_bytes)
    source = iter(enumerate(rows))
    source_lock = threading.Lock()
    count_lock = threading.Lock()
    started = time.monotonic()
    exhausted = threading.Event()
    """Every input row was taken: a stop after that interrupts nothing (the run completes)."""
    workers: list[threading.Thread] = []
    busy_since: list[float | None] = []
    """Per worker: ``time.monotonic()`` when its row began, None between rows."""

    def take(slot: int) -> tuple[int, Any] | None:
        busy_since[slot] = None
        with source_lock:
            if stop.is_set():
                return None
            try:
                item = next(source, None)
                if item is None:
                    exhausted.set()
                return item
            except Exception as exc:  # the input cannot be read on: stop, say so (exit 2)
                reason = error_text(exc)
                if not isinstance(exc, InputError):
                    reason = f"{type_name(exc)}: {reason}"
                summary.config_error = summary.config_error or f"cannot read the input: {reason}"
                stop.set()
                return None

    def work(slot: int) -> None:
        try:
            _work(slot)
        except Exception as exc:  # writing the output failed (disk full, ...): stop, say so
            summary.config_error = (
                summary.config_error or f"cannot write the output: {type_name(exc)}: {error_text(exc)}"
            )
            stop.set()

    def _work(slot: int) -> None:
        while (item := take(slot)) is not None:
            index, row = item
            busy_since[slot] = time.monotonic()
            if isinstance(row, RowError):
                outcome = RowOutcome(index, None, error=f"RowError: {row}")
            else:
                try:
                    if ctx is not None:
                        ctx.start_row()
                    outcome = RowOutcome(index, row, result=play.run(row, ctx))
                    if stop.is_set() and ctx is not None and ctx.cancelled_in_row():
                        with count_lock:  # the play caught the refusal: the row did not run all the same
                            summary.cut_short += 1
                        continue
                except UnknownToolError as exc:
                    summary.config_error = error_text(exc)
                    stop.set()
                    outcome = RowOutcome(index, row, error=f"UnknownToolError: {error_text(exc)}")
                except BaseException as exc:  # SystemExit & co from a play fail its row, not the run
                    if stop.is_set() and cut_short(exc):  # not a failure: the row did not run
                        with count_lock:
                            summary.cut_short += 1
                        continue
                    outcome = RowOutcome(index, row, error=f"{type_name(exc)}: {error_text(exc)}")
            if out is not None:
                line, unwritable = encode_outcome(outcome)
                if unwritable is not None:
                    outcome = attrs.evolve(outcome, result=None, error=unwritable)
                writer.put(index, line)
                summary.written = writer.written
            with count_lock:
                summary.rows += 1
                if outcome.error is None:
                    summary.ok += 1
                else:
                    summary.failed += 1
                    summary.errors.add(outcome.error)
            if on_row is not None:
                on_row(outcome)

    widen_lock = threading.Lock()
    width = concurrency
    """The most workers (``concurrency``, or fewer once the system refused a thread)."""

    def add_worker() -> bool:
        """Start one more worker while rows are left to take and the width allows; False
        when none was started (a thread the system refuses ends the widening)."""
        nonlocal width
        with widen_lock:
            if len(workers) >= width or exhausted.is_set() or stop.is_set():
                return False
            slot = len(workers)
            worker = threading.Thread(target=work, args=(slot,), name=f"tooldispatch-row-{slot}", daemon=True)
            busy_since.append(None)
            workers.append(worker)
            try:
                worker.start()
            except RuntimeError:  # "can't start new thread": the width reached is the width
                workers.pop()
                busy_since.pop()
                width = len(workers)
                return False
            return True

    for _ in range(min(concurrency, FIRST_WORKERS)):
        add_worker()
    if ctx is not None:  # a row about to wait for a call: another worker takes the next row
        ctx.before_wait = add_worker

    def widen() -> None:
        """Add a worker for each one stuck in a row (waiting on something other than a
        call: the play's own I/O) while rows are left to take."""
        while not exhausted.wait(STUCK_S) and not stop.is_set() and len(workers) < width:
            now = time.monotonic()
            stuck = sum(1 for since in busy_since if since is not None and now - since >= STUCK_S)
            for _ in range(stuck):
                if not add_worker():
                    break

    widener = threading.Thread(target=widen, name="tooldispatch-rows-widen", daemon=True)
    widener.start()
    widener.join()  # it ends once every row is taken, at a stop or at the width: then so does adding
    with widen_lock:
        every = list(workers)
    for worker in every:
        worker.join()
    if ctx is not None:
        ctx.before_wait = None
    try:
        writer.close()
    except Exception as exc:
        why = f"cannot write the output: {type_name(exc)}: {error_text(exc)}"
        summary.config_error = summary.config_error or why
    summary.written = writer.written
    summary.buffer_peak_bytes = writer.peak_memory_bytes
    summary.spilled_bytes = writer.spilled_bytes
    left = not exhausted.is_set() or summary.cut_short > 0  # rows not run, or not to their end
    summary.interrupted = stop.is_set() and left and summary.config_error is None
    summary.wall_s = time.monotonic() - started
    return summary
