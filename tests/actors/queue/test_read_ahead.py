"""A rerun's receipts are read ahead into the tool's memo (actors/queue/read_ahead.py):
its calls, from many threads, are then memo hits, and what is read ahead is only what
a plain read of each call would have answered."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from actors import Policy, Tool
from actors.flusher.salvage import SalvageLog, salvage_entry
from actors.messages import RememberOutputs
from actors.queue.read_ahead import AHEAD_PAGES, PAGE
from stores import SqliteReceiptStore
from stores.keys import key_and_input_hash

from ..conftest import ORG, SCOPE, WAIT_S

THREADS = 8


class CountingStore(SqliteReceiptStore):
    """Counts the keys callers' plain reads ask for."""

    asked = 0

    def read_reusable(self, org_id: str, keys: Sequence[str], **kwargs: Any) -> Any:
        type(self).asked += len(keys)
        return super().read_reusable(org_id, keys, **kwargs)


def _echo(recorder: Any, tool_id: str = "echo") -> Tool:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record(tool_id, input, ctx)
        return {"echo": input["i"]}

    return Tool(tool_id=tool_id, fn=fn)


def _on_threads(proxy: Any, tool_id: str, inputs: list[Any]) -> list[Any]:
    """Each input called by one of :data:`THREADS` threads, one ``execute(...).get()`` at
    a time (a play's rows); the results in the inputs' order."""
    results: list[Any] = [None] * len(inputs)

    def rows(k: int) -> None:
        for i in range(k, len(inputs), THREADS):
            results[i] = proxy.execute(tool_id, inputs[i]).get(timeout=WAIT_S)

    threads = [threading.Thread(target=rows, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _until(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _first_run(make_system: Any, tools: list[Tool], inputs: list[Any], tool_id: str = "echo") -> None:
    first = make_system(tools, run_id="first")
    for future in first.proxy().execute_many(tool_id, inputs):
        future.get(timeout=WAIT_S)
    first.stop(timeout_s=WAIT_S)


def test_a_rerun_on_many_threads_is_answered_from_receipts_read_ahead(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    inputs = [{"i": i} for i in range(3000)]
    tools = [_echo(recorder)]
    _first_run(make_system, tools, inputs)
    CountingStore.asked = 0
    rerun = make_system(tools, run_id="rerun", store=CountingStore(db_path))
    try:
        results = _on_threads(rerun.proxy(), "echo", inputs)
    finally:
        rerun.stop(timeout_s=WAIT_S)
    assert [r.value for r in results] == [{"echo": i} for i in range(3000)]
    assert {r.execution for r in results} == {"cached"}
    assert recorder.count("echo") == 3000  # the first run's: nothing ran again
    # without reading ahead every call reads its own receipt (3,000 keys asked)
    assert CountingStore.asked < 1000, CountingStore.asked


def test_only_receipts_the_calls_would_claim_are_read_ahead(
    make_system: Any, db_path: Path, recorder: Any, key_of: Callable[..., str]
) -> None:
    """Receipts of another tool, of the same tool under other credentials or another
    scope, a receipt whose input hash was changed by hand, a failed one, and one the
    salvage file holds an output for: none of them enters the memo."""
    echo = _echo(recorder)
    inputs = [{"i": i} for i in range(40)]
    _first_run(make_system, [echo, _echo(recorder, "other")], inputs)
    _first_run(make_system, [_echo(recorder, "other")], inputs, tool_id="other")
    elsewhere = make_system([echo], run_id="elsewhere", scope="another-scope")
    elsewhere.proxy().execute("echo", {"i": 1000}).get(timeout=WAIT_S)
    elsewhere.stop(timeout_s=WAIT_S)
    tampered, failed, salvaged = key_of(echo, {"i": 5}), key_of(echo, {"i": 6}), key_of(echo, {"i": 7})
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE receipts SET input_hash = ? WHERE key = ?", ("0" * 64, tampered))
        conn.execute("UPDATE receipts SET status = 'failed' WHERE key = ?", (failed,))
    _, input_hash = key_and_input_hash(
        org_id=ORG, scope=SCOPE, tool_id="echo", input={"i": 7}, version=echo.version
    )
    SalvageLog(f"{db_path}.salvage.jsonl").append([
        salvage_entry(key=salvaged, org_id=ORG, scope=SCOPE, tool_id="echo", input_hash=input_hash,
                      output={"echo": "salvaged"}, attempts=1, first_error_at=None, error="test")
    ])  # fmt: skip
    rerun = make_system([echo], run_id="rerun")
    rerun.proxy().execute("echo", {"i": 0}).get(timeout=WAIT_S)  # a plain read finds it: a rerun
    memo = rerun._memos["echo"]
    wanted = {key_of(echo, x) for x in inputs} - {tampered, failed, salvaged}
    _until(lambda: wanted <= set(memo.entries), "the receipts read ahead")
    assert set(memo.entries) == wanted  # nothing else


def test_a_call_with_a_staleness_bound_starts_no_reading_ahead(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    """What is read ahead has no known age in the memo: a call with ``stale_after_s``
    could not use it, so such calls read nothing ahead."""
    inputs = [{"i": i} for i in range(20)]
    echo = _echo(recorder)
    first = make_system([echo], run_id="first")
    for future in first.proxy().execute_many("echo", inputs, stale_after_s=3600):
        future.get(timeout=WAIT_S)
    first.stop(timeout_s=WAIT_S)
    rerun = make_system([echo], run_id="rerun")
    for x in inputs:
        assert rerun.proxy().execute("echo", x, stale_after_s=3600).get(timeout=WAIT_S).execution == "cached"
    assert rerun._intake._ahead == {}
    assert recorder.count("echo") == 20


def test_a_rerun_in_bulk_reads_nothing_ahead(make_system: Any, db_path: Path, recorder: Any) -> None:
    """An ``execute_many`` of many calls reads all their receipts in one read already:
    nothing is read ahead for it."""
    inputs = [{"i": i} for i in range(2000)]
    echo = _echo(recorder)
    _first_run(make_system, [echo], inputs)
    rerun = make_system([echo], run_id="rerun")
    for start in range(0, len(inputs), 500):
        for future in rerun.proxy().execute_many("echo", inputs[start : start + 500]):
            assert future.get(timeout=WAIT_S).execution == "cached"
    assert rerun._intake._ahead == {}


def test_a_key_claimed_since_it_was_read_is_not_put_in_the_memo(
    make_system: Any, db_path: Path, recorder: Any, key_of: Callable[..., str]
) -> None:
    """A refresh claimed the key after its old output was read (ahead, or by a caller):
    its running group answers the key's later calls (marked ``refresh_running``), so the
    old output is not put in the memo for them."""
    gate, started = threading.Event(), threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("echo", input, ctx)
        if recorder.count("echo") > 1:
            started.set()
            assert gate.wait(WAIT_S)
        return {"echo": input["i"], "n": recorder.count("echo")}

    echo = Tool(tool_id="echo", fn=fn)
    system = make_system([echo])
    assert system.proxy().execute("echo", {"i": 1}).get(timeout=WAIT_S).value["n"] == 1
    key = key_of(echo, {"i": 1})
    memo = system._memos["echo"]
    refresh = system.proxy().execute("echo", {"i": 1}, force_refresh=True)
    assert started.wait(WAIT_S)
    assert key not in memo.entries  # the claim of the refresh took the memo's copy out
    queue = system._queues["echo"]
    for ahead in (True, False):
        queue.tell(RememberOutputs(entries=((key, '{"echo": 1, "n": 1}'),), ahead=ahead))
    queue.tell(RememberOutputs(entries=(("another-key", "1"),)))
    _until(lambda: "another-key" in memo.entries, "the messages handled")
    assert key not in memo.entries
    gate.set()
    assert refresh.get(timeout=WAIT_S).value["n"] == 2


def test_stop_ends_the_reading_ahead(make_system: Any, db_path: Path, recorder: Any) -> None:
    inputs = [{"i": i} for i in range(4000)]
    echo = _echo(recorder)
    _first_run(make_system, [echo], inputs)
    rerun = make_system([echo], run_id="rerun")
    rerun.proxy().execute("echo", inputs[0]).get(timeout=WAIT_S)
    rerun.stop(timeout_s=WAIT_S)
    assert not any(t.name.startswith("tooldispatch-read-ahead") for t in threading.enumerate())


@pytest.mark.parametrize("memo_max_bytes", [0, 2000])
def test_the_reading_ahead_keeps_within_the_memo(
    make_system: Any, db_path: Path, recorder: Any, memo_max_bytes: int
) -> None:
    """A tool without a memo reads nothing ahead; with a small one, the reading stops
    once half of it is used (the rest is for what the run completes)."""
    inputs = [{"i": i} for i in range(5000)]
    echo = _echo(recorder)
    _first_run(make_system, [echo], inputs)
    policy = Policy(batch_grace_s=0.05, memo_max_bytes=memo_max_bytes)
    rerun = make_system([echo], run_id="rerun", policy=policy)
    results = _on_threads(rerun.proxy(), "echo", inputs[:300])
    assert {r.execution for r in results} == {"cached"}
    if memo_max_bytes == 0:
        assert rerun._intake._ahead == {}
        return
    ahead = rerun._intake._ahead["echo"]
    _until(lambda: not ahead.running, "the reading to stop")
    assert ahead._ended and ahead.read <= (AHEAD_PAGES + 1) * PAGE < len(inputs)
    assert rerun._memos["echo"].bytes <= memo_max_bytes
