"""How many row workers a run uses: a few for rows answered at once, the width for rows
that wait (on a call, or on the play's own I/O), never more than ``concurrency``.

Real dispatch systems on SQLite files in ``tmp_path``; the rows run on threads (or
greenlets under the gevent runtime), counted by name as they start.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import DispatchSystem, RunInfo, Tool
from actors.job.play import Play, PlayContext
from actors.job.runner import FIRST_WORKERS, run_rows
from stores import SqliteReceiptStore


class Peak:
    """Rows running at once, and the most seen, and the threads that ran them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.threads: set[str] = set()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.now -= 1


def _system(tmp_path: Path, tools: list[Tool], run_id: str = "r1") -> Any:
    store = SqliteReceiptStore(str(tmp_path / "r.db"))
    run = RunInfo(run_id=run_id, org_id="o", scope="s")
    return store, DispatchSystem.start(tools=tools, store=store, run=run)


def _rows(play: Any, rows: list[Any], ctx: PlayContext | None, concurrency: int) -> Any:
    return run_rows(
        Play(name="p", tools=[], run=play),
        rows,
        ctx,
        concurrency=concurrency,
        out=None,
        stop=threading.Event(),
    )


def test_rows_answered_at_once_run_on_a_few_workers(tmp_path: Path) -> None:
    tool = Tool(tool_id="echo", fn=lambda input, ctx: {"n": input["n"]})
    inputs = list(range(3000))
    store, system = _system(tmp_path, [tool])
    with store, system:  # the receipts a rerun answers from
        for future in system.proxy().execute_many("echo", [{"n": n} for n in inputs]):
            future.get(timeout=60)
    peak = Peak()

    def play(row: Any, ctx: PlayContext) -> Any:
        with peak:
            return ctx.tool("echo", {"n": row})["n"]

    store, system = _system(tmp_path, [tool], run_id="r2")
    with store, system:
        summary = _rows(play, inputs, PlayContext(system.proxy()), concurrency=256)

    assert summary.ok == len(inputs), summary
    # every call answered at once: no row waited, so no worker was added for a wait (a row
    # the OS kept off a core for STUCK_S may add one: a few, not the 256 of the width)
    assert len(peak.threads) < 32, (len(peak.threads), FIRST_WORKERS)


def test_rows_that_wait_for_their_calls_get_the_whole_width(tmp_path: Path) -> None:
    peak = Peak()

    def slow(input: Any, ctx: Any) -> Any:
        with peak:
            time.sleep(0.3)
        return {"n": input["n"]}

    tool = Tool(tool_id="slow", fn=slow)
    store, system = _system(tmp_path, [tool])
    with store, system:
        started = time.monotonic()
        summary = _rows(
            lambda row, ctx: ctx.tool("slow", {"n": row}),
            list(range(64)),
            PlayContext(system.proxy()),
            32,
        )
        wall = time.monotonic() - started

    assert summary.ok == 64
    assert peak.most == 32  # every row worker waiting on a call at once, and no more
    assert wall < 4 * 0.3, wall  # two rounds of 32, not sixteen of FIRST_WORKERS


def test_rows_widen_at_their_first_wait_for_a_call_however_short(
    tmp_path: Path,
) -> None:
    peak = Peak()

    def quick(input: Any, ctx: Any) -> Any:
        with peak:
            time.sleep(0.005)  # a fast provider: shorter than STUCK_S, each row waits all the same
        return {"n": input["n"]}

    tool = Tool(tool_id="quick", fn=quick)
    store, system = _system(tmp_path, [tool])
    with store, system:
        play = lambda row, ctx: ctx.tool("quick", {"n": row})  # noqa: E731
        summary = _rows(play, list(range(640)), PlayContext(system.proxy()), 32)

    assert summary.ok == 640
    assert 16 <= peak.most <= 32, peak.most


def test_rows_that_wait_on_the_plays_own_io_get_the_whole_width() -> None:
    peak = Peak()

    def play(row: Any, ctx: Any) -> Any:
        with peak:
            time.sleep(0.3)  # the play's own wait, no ctx.tool: seen as a row that runs on
        return row

    summary = _rows(play, list(range(64)), None, concurrency=32)

    assert summary.ok == 64
    assert peak.most == 32


@pytest.mark.parametrize("concurrency", [1, 3, FIRST_WORKERS + 1])
def test_row_workers_never_pass_the_concurrency(concurrency: int) -> None:
    peak = Peak()

    def play(row: Any, ctx: Any) -> Any:
        with peak:
            time.sleep(0.05)
        return row

    summary = _rows(play, list(range(4 * concurrency + 2)), None, concurrency=concurrency)

    assert summary.ok == 4 * concurrency + 2
    assert peak.most == concurrency
    assert len(peak.threads) == concurrency
