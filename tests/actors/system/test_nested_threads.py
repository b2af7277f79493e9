"""Nested calls made off the tool's own thread: a tool that fans out on threads (or, under
gevent, greenlets) of its own and waits for those calls. Made inside ``ctx.nested()`` (or
through ``ctx.wrap``) they are the call's nested calls wherever they run: they borrow the
waiting parent's slot (no deadlock at the concurrency ceiling), a call of an input they
were made inside is refused at once, and an error their futures raise counts as passed
on (``test_relayed_errors.py``, lent-executor-thread). Made outside it, the parents hold
every slot while their children wait for one: the callers time out, and the dispatcher
says why. Real systems on SQLite files, both runtimes.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from actors import (
    CallCycleError,
    Policy,
    Tool,
    ToolTimeoutError,
)

WAIT_S = 15.0


def _child(input: Any, ctx: Any) -> Any:
    return {"child": input["c"]}


def test_a_parent_fanning_out_on_an_executor_through_wrap_completes_at_the_ceiling(make_system: Any) -> None:
    holder: dict[str, Any] = {}

    def parent(input: Any, ctx: Any) -> Any:
        proxy = holder["proxy"]
        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(
                ctx.wrap(lambda c: proxy.execute("child", {"c": c}).get(timeout=WAIT_S).value),
                [input["p"] * 10 + j for j in range(3)],
            ))  # fmt: skip
        return {"got": got}

    system = make_system(
        [Tool(tool_id="parent", fn=parent, timeout_s=WAIT_S), Tool(tool_id="child", fn=_child)],
        policy=Policy(batch_grace_s=0.01, max_concurrency=2),
    )
    holder["proxy"] = system.proxy()
    futures = system.proxy().execute_many("parent", [{"p": p} for p in range(4)])
    results = [f.get(timeout=WAIT_S) for f in futures]
    assert [r.value for r in results] == [
        {"got": [{"child": p * 10 + j} for j in range(3)]} for p in range(4)
    ]


def test_a_parent_waiting_on_a_thread_of_its_own_inside_nested_completes_at_the_ceiling(
    make_system: Any,
) -> None:
    holder: dict[str, Any] = {}

    def parent(input: Any, ctx: Any) -> Any:
        got: list[Any] = []

        def work() -> None:
            with ctx.nested():
                got.append(holder["proxy"].execute("child", {"c": input["p"]}).get(timeout=WAIT_S).value)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(WAIT_S)
        return {"got": got}

    system = make_system(
        [Tool(tool_id="parent", fn=parent, timeout_s=WAIT_S), Tool(tool_id="child", fn=_child)],
        policy=Policy(batch_grace_s=0.01, max_concurrency=1),
    )
    holder["proxy"] = system.proxy()
    futures = system.proxy().execute_many("parent", [{"p": p} for p in range(3)])
    assert [f.get(timeout=WAIT_S).value for f in futures] == [{"got": [{"child": p}]} for p in range(3)]


def test_a_call_of_its_own_input_from_a_lent_thread_is_refused_at_once(make_system: Any) -> None:
    holder: dict[str, Any] = {}
    seen: list[BaseException] = []

    def parent(input: Any, ctx: Any) -> Any:
        def again() -> None:
            try:
                holder["proxy"].execute("parent", input).get(timeout=WAIT_S)
            except Exception as exc:
                seen.append(exc)

        with ThreadPoolExecutor(1) as pool:
            pool.submit(ctx.wrap(again)).result(WAIT_S)
        return {"ok": True}

    system = make_system(
        [Tool(tool_id="parent", fn=parent, timeout_s=WAIT_S)], policy=Policy(batch_grace_s=0.01)
    )
    holder["proxy"] = system.proxy()
    assert system.proxy().execute("parent", {"p": 1}).get(timeout=WAIT_S).value == {"ok": True}
    assert len(seen) == 1 and isinstance(seen[0], CallCycleError), seen


def test_a_thread_lent_after_the_call_returned_acts_for_nobody(make_system: Any) -> None:
    """A context kept past its call (a thread the function left behind): its block changes
    nothing, so that thread's calls are ordinary ones, counted against the ceiling."""
    kept: list[Any] = []

    def parent(input: Any, ctx: Any) -> Any:
        kept.append(ctx)
        return {"ok": True}

    system = make_system([Tool(tool_id="parent", fn=parent)], policy=Policy(batch_grace_s=0.01))
    system.proxy().execute("parent", {"p": 1}).get(timeout=WAIT_S)
    from actors.runtime.nesting import in_tool, running_keys

    seen: list[Any] = []

    def late() -> None:
        with kept[0].nested():
            seen.append((in_tool(), running_keys()))

    thread = threading.Thread(target=late)
    thread.start()
    thread.join(WAIT_S)
    assert seen == [(False, frozenset())]


def test_calls_made_off_the_tools_thread_outside_nested_time_out_and_the_dispatcher_says_why(
    make_system: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Outside ``ctx.nested()`` the children wait for the slots their parents hold: the
    parents' callers get ``ToolTimeoutError`` at their timeout, and the log names the fix."""
    holder: dict[str, Any] = {}

    def parent(input: Any, ctx: Any) -> Any:
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(lambda: holder["proxy"].execute("child", {"c": input["p"]}).get(timeout=2.0))
            try:
                return {"got": job.result(WAIT_S).value}
            except Exception as exc:
                return {"error": type(exc).__name__}

    system = make_system(
        [Tool(tool_id="parent", fn=parent, timeout_s=0.5), Tool(tool_id="child", fn=_child)],
        policy=Policy(batch_grace_s=0.01, max_concurrency=1),
    )
    holder["proxy"] = system.proxy()
    with caplog.at_level(logging.WARNING, logger="tooldispatch"), pytest.raises(ToolTimeoutError):
        system.proxy().execute("parent", {"p": 1}).get(timeout=WAIT_S)
    assert any("ctx.nested()" in r.getMessage() and "parent" in r.getMessage() for r in caplog.records)


@pytest.mark.waits
def test_a_tool_that_is_only_slow_past_its_timeout_is_told_as_maybe_slow_provider(
    make_system: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The same warning for a function that simply takes longer than its timeout (no
    nested calls at all) names a slow provider first, not only threads of its own."""

    def slow(input: Any, ctx: Any) -> Any:
        time.sleep(1.0)
        return {"ok": True}

    system = make_system([Tool(tool_id="slow", fn=slow, timeout_s=0.3)], policy=Policy(batch_grace_s=0.01))
    with caplog.at_level(logging.WARNING, logger="tooldispatch"), pytest.raises(ToolTimeoutError):
        system.proxy().execute("slow", {"s": 1}).get(timeout=WAIT_S)
    told = [r.getMessage() for r in caplog.records if "passed their timeout" in r.getMessage()]
    assert told and all("provider may be slow" in text for text in told), told
