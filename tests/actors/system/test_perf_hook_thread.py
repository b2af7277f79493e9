"""The perf hook is user code: it runs on a thread of its own, in order, never on an actor
(a slow hook held the tool's queue actor: every call of that tool waited for it, and a
call with a 0.5 s timeout was answered after 3.4 s) nor on a tool's worker. Real systems
on SQLite files, both runtimes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import Policy, Tool, ToolTimeoutError
from actors.stats import HOOK_BACKLOG, Stats

WAIT_S = 15.0


@pytest.mark.waits
def test_a_slow_perf_hook_delays_no_call(make_system: Any) -> None:
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def hook(phase: str, ms: float, extra: dict[str, Any]) -> None:
        with lock:
            seen.append((phase, threading.current_thread().name))
        if phase == "provider":
            time.sleep(2.0)

    def fn(i: Any, ctx: Any) -> Any:
        time.sleep(i["s"])
        return {"v": i["s"]}

    system = make_system([Tool(tool_id="t", fn=fn)], policy=Policy(batch_grace_s=0.02, perf_hook=hook))
    proxy = system.proxy()
    start = time.monotonic()
    first = proxy.execute("t", {"s": 0.05}, timeout_s=5)
    assert first.get(timeout=WAIT_S).execution == "live"
    second = proxy.execute("t", {"s": 0.01}, timeout_s=5)  # sent while the hook sleeps
    slow = proxy.execute("t", {"s": 1.0}, timeout_s=0.5)  # (stop waits for it at teardown)
    assert second.get(timeout=WAIT_S).execution == "live"
    with pytest.raises(ToolTimeoutError):
        slow.get(timeout=WAIT_S)
    took = time.monotonic() - start
    assert took < 1.5, f"calls waited {took:.2f} s for a slow perf hook"
    deadline = time.monotonic() + WAIT_S
    while sum(1 for p, _ in seen if p == "provider") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with lock:
        assert {name for _, name in seen} == {"tooldispatch-perf-hook"}
        assert sum(1 for p, _ in seen if p == "provider") >= 2  # every timing reaches it, late


def test_a_perf_hook_hears_timings_in_order_and_a_backlog_past_the_bound_is_counted() -> None:
    release = threading.Event()
    heard: list[float] = []

    def hook(phase: str, ms: float, extra: dict[str, Any]) -> None:
        release.wait(WAIT_S)
        heard.append(ms)

    stats = Stats(hook)
    total = HOOK_BACKLOG + 50
    for i in range(total):
        stats.record("provider", float(i))
    assert stats.snapshot()["perf_hook_dropped"] >= 49
    release.set()
    deadline = time.monotonic() + WAIT_S
    while len(heard) < total - stats.snapshot()["perf_hook_dropped"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert heard == sorted(heard) and len(heard) >= HOOK_BACKLOG
