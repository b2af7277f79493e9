"""The front door gathers submissions: calls put while a tool's queue actor is busy reach
it in one message (:class:`actors.runtime.gathering.Gathering`, ``Intake.submit``).

The gathering's rules on their own (ring on the first put, ride along, refuse once
closed), then a real system: a queue actor held inside one message while threads call,
and a system stopped while calls wait in the gathering (each caller hears back).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from actors import Tool
from actors.errors import CallCancelledError
from actors.messages import SubmitCalls
from actors.queue.actor import ToolQueueActor
from actors.runtime.gathering import Gathering

from ..conftest import WAIT_S


def test_the_first_put_rings_later_ones_ride_along_until_taken() -> None:
    waiting: Gathering[int] = Gathering()
    assert waiting.put([1, 2]) is True
    assert waiting.put([3]) is False and len(waiting) == 3
    assert waiting.take() == [1, 2, 3]
    assert waiting.put([]) is False  # nothing to take: no ring
    assert waiting.put([4]) is True  # empty again: rings
    assert waiting.close() == [4]
    assert waiting.put([5]) is None and waiting.closed and waiting.take() == []


def test_calls_submitted_while_the_queue_actor_is_busy_reach_it_in_one_message(
    make_system: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held, go = threading.Event(), threading.Event()
    received: list[int] = []
    original_submit, original_receive = ToolQueueActor._submit, ToolQueueActor.on_receive

    def submit(self: Any, call: Any, now: float) -> None:
        if call.input == {"i": -1}:  # the first call holds the actor inside its message
            held.set()
            go.wait(WAIT_S)
        original_submit(self, call, now)

    def on_receive(self: Any, message: Any) -> Any:
        if isinstance(message, SubmitCalls):
            received.append(len(message.waiting))
        return original_receive(self, message)

    monkeypatch.setattr(ToolQueueActor, "_submit", submit)
    monkeypatch.setattr(ToolQueueActor, "on_receive", on_receive)
    system = make_system([Tool(tool_id="echo", fn=lambda value, ctx: value)])
    proxy = system.proxy()
    first = proxy.execute("echo", {"i": -1})
    assert held.wait(WAIT_S)
    futures: list[Any] = []
    lock = threading.Lock()

    def caller(k: int) -> None:
        for i in range(k, 40, 8):
            future = proxy.execute("echo", {"i": i})
            with lock:
                futures.append((i, future))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    go.set()
    assert first.get(timeout=WAIT_S).value == {"i": -1}
    assert sorted(f.get(timeout=WAIT_S).value["i"] for _, f in futures) == list(range(40))
    assert received == [1, 40]  # one message for the first call, one for the 40 put meanwhile


def test_calls_waiting_in_the_gathering_when_the_system_stops_are_answered(
    make_system: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held, go = threading.Event(), threading.Event()
    original_submit = ToolQueueActor._submit

    def submit(self: Any, call: Any, now: float) -> None:
        if call.input == {"i": -1}:
            held.set()
            go.wait(WAIT_S)
        original_submit(self, call, now)

    monkeypatch.setattr(ToolQueueActor, "_submit", submit)
    system = make_system([Tool(tool_id="echo", fn=lambda value, ctx: value)])
    proxy = system.proxy()
    proxy.execute("echo", {"i": -1})
    assert held.wait(WAIT_S)
    waiting = [proxy.execute("echo", {"i": i}) for i in range(5)]
    stopper = threading.Thread(target=system.stop)
    stopper.start()
    go.set()
    stopper.join(WAIT_S)
    for future in waiting:  # answered (run before the stop came, or refused): never left waiting
        with contextlib.suppress(CallCancelledError):
            assert future.get(timeout=WAIT_S).value["i"] in range(5)
    with pytest.raises(CallCancelledError):
        proxy.execute("echo", {"i": 99}).get(timeout=WAIT_S)
