"""Calls answered on the caller's thread (actors/front.py): memo hits, per-call errors.

A memo hit's future is resolved when ``execute`` returns (no message, no wait) and
behaves like any other future; each hit gets its own copy of the output. Real systems
on SQLite files, both runtimes.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from actors import CallCancelledError, InvalidInputError, RecordedFailureError, Tool, UnknownToolError
from actors.front import READ_FIRST

WAIT_S = 10.0


def test_memo_hit_is_a_resolved_future_with_its_own_copy(make_system: Any, recorder: Any) -> None:
    tool = Tool(tool_id="t", fn=lambda x, ctx: recorder.record("t", x, ctx) and {"n": [x["i"]]})
    system = make_system([tool])
    proxy = system.proxy()
    first = proxy.execute("t", {"i": 1}).get(timeout=WAIT_S)
    assert first.execution == "live"
    hits = proxy.execute_many("t", [{"i": 1}, {"i": 1}])
    assert all(f.done for f in hits)  # answered on the caller's thread
    a, b = (f.get(timeout=0) for f in hits)
    assert (
        a.execution == b.execution == "cached"
        and a.value == {"n": [1]}
        and a.receipt_key == first.receipt_key
    )
    a.value["n"].append(2)  # a caller changing its copy changes nobody else's
    assert b.value == {"n": [1]}
    assert proxy.execute("t", {"i": 1}).get(timeout=0).value == {"n": [1]}
    assert not hits[0].cancel()
    seen: list[Any] = []
    hits[0].add_done_callback(seen.append)
    assert seen == [hits[0]]

    async def wait() -> Any:
        return await proxy.execute("t", {"i": 1})

    assert asyncio.run(wait()).value == {"n": [1]}
    assert recorder.count("t") == 1
    stats = system.stats()
    assert stats["calls"] == 5 and stats["cached"] == 4 and stats["tools"]["t"]["cached"] == 4


def test_errors_fail_their_own_calls(make_system: Any, recorder: Any) -> None:
    tool = Tool(tool_id="t", fn=lambda x, ctx: recorder.record("t", x, ctx) and {"ok": True})
    system = make_system([tool])
    proxy = system.proxy()
    good, bad = proxy.execute_many("t", [{"i": 1}, {"i": float("nan")}])
    assert good.get(timeout=WAIT_S).value == {"ok": True}
    with pytest.raises(InvalidInputError):
        bad.get(timeout=WAIT_S)
    for future in proxy.execute_many("nope", [{"i": 1}, {"i": 2}]):
        with pytest.raises(UnknownToolError):
            future.get(timeout=WAIT_S)
    stats = system.stats()
    assert stats["calls"] == 4 and stats["errors"] == 3
    system.stop()
    with pytest.raises(CallCancelledError):
        proxy.execute("t", {"i": 1}).get(timeout=WAIT_S)


def test_cold_rerun_of_many_calls_is_answered_from_one_read(make_system: Any, recorder: Any) -> None:
    def fn(x: Any, ctx: Any) -> Any:
        recorder.record("t", x, ctx)
        if x["i"] == 3:
            raise ValueError("bad input")  # a permanent failure: recorded
        return {"i": x["i"]}

    tool = Tool(tool_id="t", fn=fn)
    first = make_system([tool], run_id="r1").proxy()
    n = READ_FIRST + 8
    for i, future in enumerate(first.execute_many("t", [{"i": i} for i in range(n)])):
        if i != 3:
            assert future.get(timeout=WAIT_S).execution == "live"
        else:
            with pytest.raises(Exception, match="bad input"):
                future.get(timeout=WAIT_S)
    calls = recorder.count("t")
    second = make_system([tool], run_id="r2")
    futures = second.proxy().execute_many("t", [{"i": i} for i in range(n + 2)])  # two new keys
    cached = [f for i, f in enumerate(futures) if i < n and i != 3]
    assert all(f.done for f in cached)  # answered on the caller's thread
    assert [f.get(timeout=0).value for f in cached] == [{"i": i} for i in range(n) if i != 3]
    assert {f.get(timeout=0).execution for f in cached} == {"cached"}
    with pytest.raises(RecordedFailureError):  # a recorded failure still goes through the claim
        futures[3].get(timeout=WAIT_S)
    assert [f.get(timeout=WAIT_S).execution for f in futures[n:]] == ["live", "live"]
    assert recorder.count("t") == calls + 2
    stats = second.stats()
    assert stats["cached"] == n - 1 and stats["calls"] == n + 2


def test_settled_calls_leave_no_reference_cycles(make_system: Any, recorder: Any) -> None:
    # Every fresh call used to leave a cycle (its future's cancel hook held the call; a
    # group and its unit held each other), freed only by the cyclic collector, whose full
    # passes then dominated the cost of a large run. With the collector off, nothing of
    # a finished call may stay alive once the system is idle.
    from actors.lifecycle.calls import Call, Group, Unit

    tool = Tool(tool_id="t", fn=lambda x, ctx: recorder.record("t", x, ctx) and {"i": x["i"]})
    system = make_system([tool])
    gc.collect()
    gc.disable()
    try:
        futures = system.proxy().execute_many("t", [{"i": i} for i in range(20)])
        assert [f.get(timeout=WAIT_S).execution for f in futures] == ["live"] * 20
        system.stop()
        left = [o for o in gc.get_objects() if isinstance(o, (Call, Group, Unit))]
        assert left == []
    finally:
        gc.enable()
