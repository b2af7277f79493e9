"""A call that joins an execution already sent (same key: it attaches) times out at its own
``timeout_s``, counted from when it came: never later (no timer was armed for it, so it
waited for the provider however long that took), never earlier (the execution's own
deadline answered it after a fraction of its wait). The execution runs as long as its most
patient caller waits, and one provider call serves them all. Real systems on SQLite files,
both runtimes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import BatchStrategy, Policy, Tool, ToolTimeoutError

WAIT_S = 15.0


def _slow(recorder: Any, seconds: float, started: threading.Event | None = None) -> Any:
    def fn(i: Any, ctx: Any) -> Any:
        recorder.record("slow", i, ctx)
        if started is not None:
            started.set()
        time.sleep(seconds)
        return {"v": i}

    return fn


def _timed_get(future: Any) -> tuple[Any, float]:
    start = time.monotonic()
    try:
        return future.get(timeout=WAIT_S), time.monotonic() - start
    except ToolTimeoutError as exc:
        return exc, time.monotonic() - start


@pytest.mark.waits
def test_a_joiner_with_a_short_timeout_is_answered_at_its_own_deadline(
    make_system: Any, recorder: Any
) -> None:
    started = threading.Event()
    system = make_system([Tool(tool_id="t", fn=_slow(recorder, 1.5, started))])
    proxy = system.proxy()
    owner = proxy.execute("t", {"k": 1}, timeout_s=10)
    assert started.wait(WAIT_S)
    joiner = proxy.execute("t", {"k": 1}, timeout_s=0.2)
    outcome, waited = _timed_get(joiner)
    assert isinstance(outcome, ToolTimeoutError), outcome
    assert waited < 0.9, f"the joiner waited {waited:.2f} s on a 0.2 s timeout"
    assert owner.get(timeout=WAIT_S).value == {"v": {"k": 1}}
    assert recorder.count("slow") == 1


@pytest.mark.waits
def test_a_patient_joiner_outwaits_the_execution_deadline_and_gets_the_result(
    make_system: Any, recorder: Any
) -> None:
    """The owner gives up at 0.4 s; a caller that came at ~0.1 s with 5 s gets the result
    at ~1 s, from the same provider call (before: answered ToolTimeoutError at 0.4 s); the
    only call answered with that execution's output, it is ``live``."""
    started = threading.Event()
    system = make_system([Tool(tool_id="t", fn=_slow(recorder, 1.0, started))])
    proxy = system.proxy()
    owner = proxy.execute("t", {"k": 2}, timeout_s=0.4)
    assert started.wait(WAIT_S)
    joiner = proxy.execute("t", {"k": 2}, timeout_s=5)
    with pytest.raises(ToolTimeoutError):
        owner.get(timeout=WAIT_S)
    result = joiner.get(timeout=WAIT_S)
    assert (result.value, result.execution) == ({"v": {"k": 2}}, "live")
    assert recorder.count("slow") == 1


@pytest.mark.waits
def test_a_joiner_of_an_execution_already_timed_out_keeps_its_own_timeout(
    make_system: Any, recorder: Any
) -> None:
    """The execution's callers timed out; it runs on. A caller joining it then waits its
    own ``timeout_s``: a short one is answered at it, a long one gets the late result."""
    started = threading.Event()
    system = make_system([Tool(tool_id="t", fn=_slow(recorder, 1.6, started))])
    proxy = system.proxy()
    owner = proxy.execute("t", {"k": 3}, timeout_s=0.2)
    assert started.wait(WAIT_S)
    with pytest.raises(ToolTimeoutError):
        owner.get(timeout=WAIT_S)
    short = proxy.execute("t", {"k": 3}, timeout_s=0.2)
    long = proxy.execute("t", {"k": 3}, timeout_s=10)
    outcome, waited = _timed_get(short)
    assert isinstance(outcome, ToolTimeoutError), outcome
    assert waited < 0.9, f"the late joiner waited {waited:.2f} s on a 0.2 s timeout"
    assert long.get(timeout=WAIT_S).value == {"v": {"k": 3}}
    assert recorder.count("slow") == 1


@pytest.mark.waits
def test_a_batch_members_joiner_times_out_alone(make_system: Any, recorder: Any) -> None:
    """In a compiled batch already sent, a joiner of one member with a short timeout is
    answered at it; a joiner with a long one outwaits the batch mates' deadline."""
    started = threading.Event()

    def batch_fn(payload: Any, ctx: Any) -> Any:
        recorder.record("batch", payload, ctx)
        started.set()
        time.sleep(1.0)
        return [{"v": i} for i in payload]

    tool = Tool(tool_id="b", fn=_slow(recorder, 0), batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10))
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    proxy = system.proxy()
    mates = proxy.execute_many("b", [{"m": i} for i in range(3)], timeout_s=0.4)
    assert started.wait(WAIT_S)
    short = proxy.execute("b", {"m": 1}, timeout_s=0.1)
    long = proxy.execute("b", {"m": 2}, timeout_s=5)
    outcome, waited = _timed_get(short)
    assert isinstance(outcome, ToolTimeoutError), outcome
    assert waited < 0.35, f"the joiner waited {waited:.2f} s on a 0.1 s timeout"
    for future in mates:
        with pytest.raises(ToolTimeoutError):
            future.get(timeout=WAIT_S)
    assert long.get(timeout=WAIT_S).value == {"v": {"m": 2}}
    assert recorder.count("batch") == 1
