"""A rerun's receipts are read ahead into the tool's memo (actors/queue/read_ahead.py):
its calls, from many threads, are then memo hits, and what is read ahead is only what
a plain read of each call would have answered."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from actors import Policy, Tool
from actors.flusher.salvage import SalvageLog, salvage_entry
from actors.messages import RememberOutputs
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


def _big(recorder: Any) -> Tool:
    """A tool whose outputs are 20 KB each."""

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("big", input, ctx)
        return {"i": input["i"], "pad": "x" * 20_000}

    return Tool(tool_id="big", fn=fn)


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
    # without reading ahead every call reads its own receipt (3,000 keys asked); with it,
    # 100-1,200 here: the calls read their own until the reading ahead is ahead of them,
    # later on a machine whose cores are busy elsewhere (the reader gets its share of the GIL)
    assert CountingStore.asked < 2000, CountingStore.asked


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
    _until(lambda: wanted <= set(memo.entries) | set(memo.ahead), "the receipts read ahead")
    assert set(memo.entries) | set(memo.ahead) == wanted  # nothing else


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
    for ahead_at in (time.monotonic(), None):
        entries = ((key, '{"echo": 1, "n": 1}', None),)
        queue.tell(RememberOutputs(entries=entries, forgets=0, ahead_at=ahead_at))
    queue.tell(RememberOutputs(entries=(("another-key", "1", None),), forgets=0))
    _until(lambda: "another-key" in memo.entries, "the messages handled")
    assert key not in memo.entries and key not in memo.ahead
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
    """A tool without a memo reads nothing ahead; with a small one, what is read ahead
    stays within half of it, and the memo as a whole within its bound."""
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
    memo = rerun._memos["echo"]
    assert ahead.read > 0
    assert memo.ahead_bytes * 2 <= memo_max_bytes and memo.bytes + memo.ahead_bytes <= memo_max_bytes
    _until(lambda: not ahead.running, "the reading to stop (no more calls)")
    assert ahead.read < len(inputs)


class BigOutputs(SqliteReceiptStore):
    """Records the output bytes each page read returns."""

    pages: ClassVar[list[int]] = []

    def read_completed_since(self, *args: Any, **kwargs: Any) -> Any:
        rows = super().read_completed_since(*args, **kwargs)
        type(self).pages.append(sum(len(row[2]) for row in rows or ()))
        return rows


def test_a_page_holds_no_more_output_than_the_room_left(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    """Large outputs: a page ends once its outputs fill the room left in the memo (a
    page of 1,000 receipts of 100 KB each held 100 MB in flight)."""

    big = _big(recorder)
    inputs = [{"i": i} for i in range(300)]
    _first_run(make_system, [big], inputs, tool_id="big")
    BigOutputs.pages = []
    policy = Policy(batch_grace_s=0.05, memo_max_bytes=200_000)
    rerun = make_system([big], run_id="rerun", policy=policy, store=BigOutputs(db_path))
    results = _on_threads(rerun.proxy(), "big", inputs)
    assert [r.value["i"] for r in results] == list(range(300)) and {r.execution for r in results} == {
        "cached"
    }
    assert BigOutputs.pages and max(BigOutputs.pages) <= 100_000 + 20_100, BigOutputs.pages
    memo = rerun._memos["big"]
    assert memo.bytes + memo.ahead_bytes <= 200_000


def test_what_is_read_ahead_is_used_for_a_short_while_only(
    make_system: Any,
    db_path: Path,
    recorder: Any,
    key_of: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process refreshed a key after it was read ahead: once the output read
    ahead is older than AHEAD_TTL_S, the key's call reads the store again (the refresh)."""
    import actors.queue.memo

    monkeypatch.setattr(actors.queue.memo, "AHEAD_TTL_S", 0.3)
    inputs = [{"i": i} for i in range(200)]
    echo = _echo(recorder)
    _first_run(make_system, [echo], inputs)
    rerun = make_system([echo], run_id="rerun")
    rerun.proxy().execute("echo", inputs[0]).get(timeout=WAIT_S)
    memo, key = rerun._memos["echo"], key_of(echo, {"i": 20})
    _until(lambda: key in memo.ahead, "the key read ahead")

    def refreshed(input: Any, ctx: Any) -> Any:
        return {"echo": "refreshed"}

    other = make_system([Tool(tool_id="echo", fn=refreshed)], run_id="other")
    assert other.proxy().execute("echo", {"i": 20}, force_refresh=True).get(timeout=WAIT_S).value == {
        "echo": "refreshed"
    }
    time.sleep(0.4)
    assert rerun.proxy().execute("echo", {"i": 20}).get(timeout=WAIT_S).value == {"echo": "refreshed"}


def test_an_output_read_ahead_that_cannot_be_read_fails_its_call_alone(
    make_system: Any, db_path: Path, recorder: Any, key_of: Callable[..., str]
) -> None:
    from stores.errors import UnreadableOutputError

    inputs = [{"i": i} for i in range(50)]
    echo = _echo(recorder)
    _first_run(make_system, [echo], inputs)
    broken = key_of(echo, {"i": 20})
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE receipts SET output = '{not json' WHERE key = ?", (broken,))
    rerun = make_system([echo], run_id="rerun")
    rerun.proxy().execute("echo", inputs[0]).get(timeout=WAIT_S)
    _until(lambda: broken in rerun._memos["echo"].ahead, "the broken output read ahead")
    futures = rerun.proxy().execute_many("echo", inputs[15:25])  # a future each, none raised here
    for i, future in zip(range(15, 25), futures, strict=True):
        if i == 20:
            with pytest.raises(UnreadableOutputError):
                future.get(timeout=WAIT_S)
        else:
            assert future.get(timeout=WAIT_S).value == {"echo": i}


class HeldPages(SqliteReceiptStore):
    """The first page read waits for ``release`` after its read (a slow page)."""

    release = threading.Event()
    holding = threading.Event()
    held: ClassVar[list[str]] = []

    def read_completed_since(self, *args: Any, **kwargs: Any) -> Any:
        rows = super().read_completed_since(*args, **kwargs)
        if not type(self).holding.is_set():
            type(self).held[:] = [row[0] for row in rows or ()]
            type(self).holding.set()
            assert type(self).release.wait(WAIT_S)
        return rows


def test_a_page_read_before_a_purge_is_not_kept(make_system: Any, db_path: Path, recorder: Any) -> None:
    from actors.messages import ForgetMemo

    inputs = [{"i": i} for i in range(100)]
    echo = _echo(recorder)
    _first_run(make_system, [echo], inputs)
    HeldPages.release.clear()
    HeldPages.holding.clear()
    rerun = make_system([echo], run_id="rerun", store=HeldPages(db_path))
    rerun.proxy().execute("echo", inputs[0]).get(timeout=WAIT_S)
    assert HeldPages.holding.wait(WAIT_S)
    memo = rerun._memos["echo"]
    rerun._queues["echo"].tell(ForgetMemo())  # as the purge watch does
    _until(lambda: memo.forgets == 1, "the memo forgotten")
    HeldPages.release.set()
    _until(lambda: not rerun._intake._ahead["echo"].running or len(memo.ahead) > 0, "the page handed over")
    rerun._queues["echo"].tell(RememberOutputs(entries=(("after", "1", None),), forgets=1))
    _until(lambda: "after" in memo.entries, "the page's message handled")
    assert HeldPages.held and not set(HeldPages.held) & set(memo.ahead)


def test_an_output_read_before_this_system_refreshed_the_key_does_not_replace_it(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    """A caller's plain read of a key, given to the memo later (gathered), arrives after
    this system refreshed that key: the memo keeps the refresh. (Bulk calls: their reads
    start no reading ahead.)"""
    n = [0]

    def fn(input: Any, ctx: Any) -> Any:
        n[0] += 1
        return {"echo": input["i"], "n": n[0]}

    tool = Tool(tool_id="echo", fn=fn)
    inputs = [{"i": i} for i in range(80)]
    _first_run(make_system, [tool], inputs)
    rerun = make_system([tool], run_id="rerun")
    proxy = rerun.proxy()
    first = [f.get(timeout=WAIT_S) for f in proxy.execute_many("echo", inputs[:40])]  # read, held back
    assert first[1].value["n"] <= 80
    assert proxy.execute("echo", {"i": 1}, force_refresh=True).get(timeout=WAIT_S).value["n"] == 81
    time.sleep(0.1)  # past REMEMBER_AFTER_S: the next read sends what was held back
    for future in proxy.execute_many("echo", inputs[40:]):
        future.get(timeout=WAIT_S)
    queue, memo = rerun._queues["echo"], rerun._memos["echo"]
    _until(lambda: not rerun._intake._remember, "what was held back sent")
    queue.tell(RememberOutputs(entries=(("after", "1", None),), forgets=memo.forgets))
    _until(lambda: "after" in memo.entries, "the messages handled")
    assert rerun._intake._ahead == {}
    assert proxy.execute("echo", {"i": 1}).get(timeout=WAIT_S).value["n"] == 81


def test_the_reading_goes_on_once_what_it_read_has_expired(
    make_system: Any, db_path: Path, recorder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs larger than the room read ahead: the room fills, and the reading goes on as
    what was read is used or expires (a key a call then reads for itself leaves it)."""
    import actors.queue.memo

    monkeypatch.setattr(actors.queue.memo, "AHEAD_TTL_S", 0.2)

    big = _big(recorder)
    inputs = [{"i": i} for i in range(200)]
    _first_run(make_system, [big], inputs, tool_id="big")
    policy = Policy(batch_grace_s=0.05, memo_max_bytes=200_000)  # room for 5 outputs read ahead
    rerun = make_system([big], run_id="rerun", policy=policy)
    proxy = rerun.proxy()

    def slowly(x: Any) -> Any:
        time.sleep(0.01)  # a play's own work: the calls span about a second
        return proxy.execute("big", x).get(timeout=WAIT_S)

    results = []
    for x in inputs[:100]:
        results.append(slowly(x))
    assert {r.execution for r in results} == {"cached"}
    assert rerun._intake._ahead["big"].read >= 30, rerun._intake._ahead["big"].read
