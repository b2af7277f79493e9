"""Calls nobody waits for are not paid for (issue 10 section 4): ``future.cancel()`` and
an ``asyncio`` cancellation remove a call not yet sent, unless another caller shares it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from actors import CallCancelledError, Policy, Tool
from actors.tool import BatchStrategy

WAIT_S = 15.0


def _batched(recorder: Any) -> Tool:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [{"n": item["n"]} for item in payload]

    def fn(item: Any, ctx: Any) -> Any:  # a batch of one goes as a single call
        return batch_fn([item], ctx)[0]

    return Tool(tool_id="t", fn=fn, batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=500))


def test_cancel_before_the_grace_window_ends_costs_nothing(make_system: Any, recorder: Any) -> None:
    system = make_system([_batched(recorder)], policy=Policy(batch_grace_s=0.3))
    futures = system.proxy().execute_many("t", [{"n": n} for n in range(100)])
    kept = futures[:3]
    for future in futures[3:]:
        assert future.cancel()
    assert [f.get(timeout=WAIT_S).value for f in kept] == [{"n": 0}, {"n": 1}, {"n": 2}]
    for future in futures[3:]:
        with pytest.raises(CallCancelledError):
            future.get(timeout=WAIT_S)
    (batch,) = recorder.of("batch")
    assert len(batch.input) == 3  # the batch went without the 97 calls nobody waits for
    assert system.stats()["cancelled"] == 97


def test_cancel_of_a_shared_call_keeps_it_for_the_other_caller(make_system: Any, recorder: Any) -> None:
    system = make_system([_batched(recorder)], policy=Policy(batch_grace_s=0.3))
    gone, stays = system.proxy().execute("t", {"n": 1}), system.proxy().execute("t", {"n": 1})
    assert gone.cancel()
    assert stays.get(timeout=WAIT_S).value == {"n": 1}
    assert recorder.count("batch") == 1


def test_cancel_after_sending_is_persisted_as_usual(make_system: Any, recorder: Any) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(i: Any, c: Any) -> Any:
        recorder.record("slow", i, c)
        started.set()
        release.wait(WAIT_S)
        return {"ok": True}

    system = make_system([Tool(tool_id="s", fn=slow)])
    future = system.proxy().execute("s", {"n": 1})
    assert started.wait(WAIT_S)
    future.cancel()  # too late: the request is out
    release.set()
    assert future.get(timeout=WAIT_S).value == {"ok": True}
    again = system.proxy().execute("s", {"n": 1}).get(timeout=WAIT_S)
    assert again.execution == "cached" and recorder.count("slow") == 1


def test_cancel_by_asyncio_removes_an_awaited_call(make_system: Any, recorder: Any) -> None:
    system = make_system([_batched(recorder)], policy=Policy(batch_grace_s=0.3))

    async def main() -> Any:
        kept = system.proxy().execute("t", {"n": 1})
        task = asyncio.ensure_future(_await(system))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await kept

    result = asyncio.run(main())
    assert result.value == {"n": 1}
    (batch,) = recorder.of("batch")
    assert batch.input == [{"n": 1}]


async def _await(system: Any) -> Any:
    return await system.proxy().execute("t", {"n": 2})
