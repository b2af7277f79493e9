"""Where one idle call's time goes: a timeline of its hand-offs (issue 8, target e).

    python bench/idle_trace.py [--rounds 300]
    python bench/idle_trace.py --bulk 20000     # hand-offs per call, idle and in a bulk

One durable no-op call at a time on a new SQLite file, 2 ms idle between calls (as
``dispatch_bench.py --only latency``). Each step of the call's life is stamped on entry
and exit (``time.perf_counter``, by wrapping the lifecycle's transitions, the effects
that leave the tool's queue and the store's methods for the run), and the table prints
the median of each stamp, in µs from the call's ``execute``, in the order they happen,
with the gap from the previous stamp: a gap before a step that starts on another thread
is a hand-off (a message, or a thread woken); a step's own span is its work. The stamps
cost about 1 µs each, so the total is a little above the bench's p50.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import click
import pykka

try:
    import stores  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from actors import DispatchSystem, RunInfo, Tool
from actors.lifecycle import Lifecycle
from actors.queue import ActorEffects, LocalEffects
from actors.runtime.actor import WorkerPool
from stores import SqliteReceiptStore

STEPS: dict[Any, tuple[str, ...]] = {
    Lifecycle: ("drained", "on_claimed", "on_granted", "on_marked", "on_finished", "on_persisted"),
    ActorEffects: ("claim", "acquire", "mark_running", "persist"),
    LocalEffects: ("start", "answer"),
    SqliteReceiptStore: ("claim_many", "mark_running_many", "complete_many"),
}


def _stamped(log: list[tuple[str, float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log.append((name, time.perf_counter()))
        try:
            return fn(*args, **kwargs)
        finally:
            log.append((name + " end", time.perf_counter()))

    return wrapper


def _noop(input: Any, ctx: Any) -> dict[str, Any]:
    return {"ok": True}


def _count_handoffs(bulk: int) -> None:
    """Print the actor messages and worker tasks per call: one idle call at a time, then
    ``bulk`` fresh calls in one ``execute_many`` (each message or task is a hand-off to
    another thread; the caller's own wake for its result is not counted)."""
    counts = {"messages": 0, "tasks": 0}

    def counted(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[kind] += 1
            return fn(*args, **kwargs)

        return wrapper

    pykka.ActorRef.tell = counted("messages", pykka.ActorRef.tell)  # type: ignore[method-assign]
    pykka.ActorRef.ask = counted("messages", pykka.ActorRef.ask)  # type: ignore[method-assign]
    WorkerPool.submit = counted("tasks", WorkerPool.submit)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as directory:
        store = SqliteReceiptStore(os.path.join(directory, "count.db"))
        run = RunInfo(run_id="count", org_id="bench", scope="count")
        try:
            with DispatchSystem.start(tools=[Tool(tool_id="noop", fn=_noop)], store=store, run=run) as system:
                proxy = system.proxy()
                proxy.execute("noop", {"i": -1}).get(timeout=30)
                for label, shape in (("one idle call", 1), (f"a bulk of {bulk:,}", bulk)):
                    rounds = 50 if shape == 1 else 1
                    time.sleep(0.05)
                    counts.update(messages=0, tasks=0)
                    for r in range(rounds):
                        time.sleep(0.002 if shape == 1 else 0)
                        inputs = [{"s": shape, "r": r, "i": i} for i in range(shape)]
                        for future in proxy.execute_many("noop", inputs):
                            future.get(timeout=60)
                    per = shape * rounds
                    m, t = counts["messages"] / per, counts["tasks"] / per
                    print(f"{label:<22} actor messages {m:7.3f}  worker tasks {t:7.3f}  both {m + t:.3f}")
        finally:
            store.close()


@click.command()
@click.option("--rounds", default=300, show_default=True, help="Idle calls timed.")
@click.option("--bulk", default=0, help="Count hand-offs per call instead: idle, and N in one execute_many.")
def main(rounds: int, bulk: int) -> None:
    if bulk:
        _count_handoffs(bulk)
        return
    log: list[tuple[str, float]] = []
    for cls, names in STEPS.items():
        for name in names:
            if hasattr(cls, name):
                setattr(cls, name, _stamped(log, name, getattr(cls, name)))
    stamps: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as directory:
        store = SqliteReceiptStore(os.path.join(directory, "trace.db"))
        run = RunInfo(run_id="trace", org_id="bench", scope="trace")
        try:
            with DispatchSystem.start(tools=[Tool(tool_id="noop", fn=_noop)], store=store, run=run) as system:
                proxy = system.proxy()
                for i in range(20):
                    proxy.execute("noop", {"i": -1 - i}).get(timeout=30)
                for i in range(rounds):
                    time.sleep(0.002)
                    log.clear()
                    t0 = time.perf_counter()
                    proxy.execute("noop", {"i": i}).get(timeout=30)
                    stamps["result in hand"].append((time.perf_counter() - t0) * 1e6)
                    seen: set[str] = set()
                    for name, at in list(log):
                        if name not in seen:  # the first of each (a step may come twice)
                            seen.add(name)
                            stamps[name].append((at - t0) * 1e6)
        finally:
            store.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"one idle durable no-op call, {rounds} rounds, load {load:.2f}: median µs from execute()")
    print(f"{'step':<28}{'at µs':>8}{'gap µs':>8}   seen")
    previous = 0.0
    for name, values in sorted(stamps.items(), key=lambda kv: statistics.median(kv[1])):
        at = statistics.median(values)
        print(f"{name:<28}{at:8.0f}{at - previous:8.0f}   {len(values)}/{rounds}")
        previous = at


if __name__ == "__main__":
    main()
