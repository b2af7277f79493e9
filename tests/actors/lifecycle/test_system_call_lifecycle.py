"""System tests of the call lifecycle (issue 8): one per defect, real SQLite files, both runtimes.

Each test names the defect it pins. Tools simulate slow providers by waiting on an event
with a timeout (the provider's latency), never to wait for a result; results are waited
for on futures with timeouts.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import (
    BatchStrategy,
    CallCancelledError,
    Pacing,
    PersistenceCircuitOpenError,
    Policy,
    ProviderError,
    SuspendedError,
    Tool,
)
from actors.errors import BudgetExceededError, ProviderUnavailableError
from actors.governor.decisions import Governor
from stores import SqliteReceiptStore

WAIT_S = 10.0


def outcome(future: Any, timeout: float = WAIT_S) -> Any:
    try:
        return future.get(timeout=timeout)
    except Exception as exc:
        return exc


def _pause(seconds: float) -> None:
    """A provider's latency (not a wait for a result)."""
    threading.Event().wait(seconds)


def _until(condition: Any, what: str) -> None:
    """Wait (bounded by WAIT_S) for ``condition()``, a count kept by a store or a tool
    on threads of their own (under gevent, the store's are native threads, which cannot
    set a greenlet's event)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        _pause(0.002)


class Running:
    """Start/end log of provider calls: how many ran at once, which overlapped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.max = 0
        self.spans: list[list[float]] = []
        self.done = threading.Condition(self.lock)

    def __enter__(self) -> Running:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
            self.spans.append([time.monotonic(), float("inf")])
            self._span = self.spans[-1]
        return self

    def enter(self) -> list[float]:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
            span = [time.monotonic(), float("inf")]
            self.spans.append(span)
            return span

    def leave(self, span: list[float]) -> None:
        with self.lock:
            self.now -= 1
            span[1] = time.monotonic()
            self.done.notify_all()

    def __exit__(self, *exc: object) -> None:
        pass

    def overlapping(self) -> int:
        """Requests that started while an earlier one was still running."""
        with self.lock:
            spans = sorted(self.spans)
        count = 0
        latest_end = float("-inf")
        for start, end in spans:
            if start < latest_end:
                count += 1
            latest_end = max(latest_end, end)
        return count

    def wait_idle(self, n: int) -> None:
        with self.lock:
            assert self.done.wait_for(lambda: len(self.spans) >= n and self.now == 0, WAIT_S), (
                f"{len(self.spans)} calls, {self.now} running"
            )


# -- (1) timeouts hold


@pytest.mark.waits
def test_lifecycle_timed_out_call_keeps_its_slot_and_its_late_result_is_reused(
    make_system: Any, db_path: Path
) -> None:
    gauge = Running()

    def slow(input: Any, ctx: Any) -> Any:
        span = gauge.enter()
        try:
            _pause(2.0)
            return {"late": input["x"]}
        finally:
            gauge.leave(span)

    tool = Tool(tool_id="slow", fn=slow, pacing=Pacing(max_concurrency=1), timeout_s=0.5)
    system = make_system([tool])
    outcomes = [outcome(system.proxy().execute("slow", {"x": 1}), timeout=WAIT_S) for _ in range(3)]
    gauge.wait_idle(1)
    assert gauge.max == 1, f"{gauge.max} executions of one key ran at once at max_concurrency=1"
    assert all(isinstance(o, Exception) or o.value == {"late": 1} for o in outcomes)
    system.stop(timeout_s=WAIT_S)
    runs = len(gauge.spans)
    again = make_system([tool], run_id="r2").proxy().execute("slow", {"x": 1}).get(timeout=WAIT_S)
    assert (again.value, again.execution) == ({"late": 1}, "cached"), "the late result was thrown away"
    assert len(gauge.spans) == runs


# -- (2) a store error at every step: every caller answered, every slot back


class FlakyStore(SqliteReceiptStore):
    """A real SQLite store whose ``fail_once`` method raises the first time it is called."""

    fail_once = ""

    def _maybe_fail(self, name: str) -> None:
        if self.fail_once == name:
            self.fail_once = ""
            raise sqlite3.OperationalError(f"injected: {name} failed")

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("claim_many")
        return super().claim_many(*args, **kwargs)

    def mark_running_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("mark_running_many")
        return super().mark_running_many(*args, **kwargs)

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("complete_many")
        return super().complete_many(*args, **kwargs)

    def fail_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("fail_many")
        return super().fail_many(*args, **kwargs)

    def release(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("release")
        return super().release(*args, **kwargs)


@pytest.mark.parametrize("step", ["claim_many", "mark_running_many", "complete_many", "fail_many", "release"])
def test_lifecycle_store_error_at_each_step_answers_and_gives_every_slot_back(
    make_system: Any, db_path: Path, step: str
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        if input.get("fail"):
            raise ProviderError("bad request")
        if input.get("suspend"):
            raise SuspendedError("paused")
        return {"ok": input["x"]}

    store = FlakyStore(db_path)
    try:
        tool = Tool(tool_id="api", fn=fn, pacing=Pacing(max_concurrency=1))
        policy = Policy(batch_grace_s=0.01, max_concurrency=1, completion_ladder_s=(0.05,))
        system = make_system([tool], policy=policy, store=store)
        store.fail_once = step
        first = {"x": 1, "fail": step == "fail_many", "suspend": step == "release"}
        answer = outcome(system.proxy().execute("api", first))
        assert not isinstance(answer, type(None)), "no answer"
        for x in range(2, 5):  # at max_concurrency=1, a leaked slot stops the next call for good
            if step == "fail_many":  # recording a failure failed: the latch trips (SEMANTICS.md)
                later = outcome(system.proxy().execute("api", {"x": x}))
                assert isinstance(later, PersistenceCircuitOpenError), repr(later)
                continue
            result = system.proxy().execute("api", {"x": x}).get(timeout=WAIT_S)
            assert result.value == {"ok": x}
        system.stop(timeout_s=WAIT_S)
    finally:
        store.close()


# -- (3) stop races


@pytest.mark.waits
def test_lifecycle_stop_with_a_hung_tool_returns_and_later_calls_are_cancelled(make_system: Any) -> None:
    hang, started = threading.Event(), threading.Event()

    def hung(input: Any, ctx: Any) -> Any:
        started.set()
        hang.wait(60)
        return {}

    system = make_system([Tool(tool_id="hung", fn=hung)])
    try:
        system.proxy().execute("hung", {"x": 1})
        assert started.wait(WAIT_S)
        stopped = threading.Event()
        threading.Thread(target=lambda: (system.stop(timeout_s=1.0), stopped.set()), daemon=True).start()
        assert stopped.wait(WAIT_S), "stop(timeout_s=1) did not return with a hung tool"
        late = outcome(system.proxy().execute("hung", {"x": 2}))
        assert isinstance(late, CallCancelledError), repr(late)
    finally:
        hang.set()


def test_lifecycle_execute_while_stopping_always_answers(make_system: Any) -> None:
    """Eight threads submit in a loop before, while and after stop() runs (on a thread of
    its own), and one call is inside execute() for the whole of stop(): its tool's
    credentials hook (a vault lookup, run by execute on the caller's thread) returns only
    once stop() has returned. execute never raises (no ActorDeadError), and every future
    resolves, with a result or a CallCancelledError, within one shared bound."""
    ran, in_hook = threading.Event(), threading.Event()
    stopping, stopped = threading.Event(), threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        ran.set()
        _pause(0.005)
        return input

    def vault_credentials() -> str:
        in_hook.set()
        stopped.wait(WAIT_S)  # the lookup is slow: stop() runs meanwhile
        return "account-1"

    tools = [Tool(tool_id="api", fn=fn), Tool(tool_id="vault", fn=fn, credentials=vault_credentials)]
    system = make_system(tools, policy=Policy(max_concurrency=4))
    submitted: list[list[Any]] = [[] for _ in range(9)]

    def submit(out: list[Any]) -> None:
        after_stop = 0
        while after_stop < 25:
            if stopped.is_set():
                after_stop += 1
            elif len(out) == 50:  # some before stop(), the rest while it runs and after
                stopping.wait(WAIT_S)
            elif len(out) >= 400:
                stopped.wait(WAIT_S)
                continue
            try:
                out.append(system.proxy().execute("api", {"t": id(out), "i": len(out)}))
            except Exception as exc:  # execute itself must not raise (ActorDeadError)
                out.append(exc)
            time.sleep(0)  # let the others (and stop) run, greenlets too

    def submit_through_the_vault(out: list[Any]) -> None:
        assert ran.wait(WAIT_S), "no call ran"
        try:
            out.append(system.proxy().execute("vault", {"x": 1}))
        except Exception as exc:
            out.append(exc)

    def stop() -> None:
        assert ran.wait(WAIT_S) and in_hook.wait(WAIT_S)
        stopping.set()
        system.stop(timeout_s=WAIT_S)
        stopped.set()

    threads = [threading.Thread(target=submit, args=(out,), daemon=True) for out in submitted[:-1]]
    threads.append(threading.Thread(target=submit_through_the_vault, args=(submitted[-1],), daemon=True))
    threads.append(threading.Thread(target=stop, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 2)
        assert not thread.is_alive()
    assert stopped.is_set()
    deadline = time.monotonic() + WAIT_S
    answers: dict[str, int] = {}
    for future in (f for out in submitted for f in out):
        assert not isinstance(future, Exception), f"execute raised {future!r}"
        got = outcome(future, timeout=max(0.0, deadline - time.monotonic()))
        assert not isinstance(got, Exception) or isinstance(got, CallCancelledError), (
            f"{got!r} (a future that never resolves times out); answers so far: {answers}"
        )
        kind = type(got).__name__
        answers[kind] = answers.get(kind, 0) + 1
    assert answers.get("CallCancelledError"), answers  # some calls came too late


@pytest.mark.waits
def test_lifecycle_process_with_a_hung_tool_exits_after_stop(tmp_path: Path) -> None:
    script = tmp_path / "host.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import threading
            from actors import DispatchSystem, Policy, RunInfo, Tool
            from stores import SqliteReceiptStore

            started = threading.Event()

            def hung(input, ctx):
                started.set()
                threading.Event().wait(3600)

            store = SqliteReceiptStore({str(tmp_path / "r.db")!r})
            system = DispatchSystem.start(
                tools=[Tool(tool_id="hung", fn=hung)], store=store,
                run=RunInfo(run_id="r", org_id="o", scope="s"), policy=Policy(batch_grace_s=0.01),
            )
            system.proxy().execute("hung", {{"x": 1}})
            assert started.wait(10)
            system.stop(timeout_s=0.5)
            print("stopped", flush=True)
            """
        )
    )
    cmd = [sys.executable, str(script)]
    if "gevent" in sys.modules and sys.modules["gevent.monkey"].is_module_patched("threading"):
        cmd = [sys.executable, "-m", "gevent.monkey", str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(
            f"the process did not exit after stop (a non-daemon thread kept it alive): {out} {err[-2000:]}"
        )
    assert "stopped" in out, err[-2000:]


# -- (6) waits hold no threads


def test_lifecycle_a_paced_provider_never_delays_an_unrelated_tool(make_system: Any) -> None:
    order: list[str] = []
    lock = threading.Lock()

    def paced(input: Any, ctx: Any) -> Any:
        with lock:
            order.append("paced")
        return input

    def fast(input: Any, ctx: Any) -> Any:
        return input

    tools = [
        Tool(tool_id="paced", fn=paced, provider="slowco", pacing=Pacing(rps=1.0, burst=1.0)),
        Tool(tool_id="fast", fn=fast, provider="local"),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.01, max_concurrency=32))
    proxy = system.proxy()
    paced_futures = []
    for i in range(40):  # rows 5 ms apart: each its own drain
        paced_futures.append(proxy.execute("paced", {"i": i}))
        _pause(0.005)
    fast_futures = [proxy.execute("fast", {"i": i}) for i in range(200)]
    for future in fast_futures:
        future.get(timeout=WAIT_S * 3)
    with lock:
        paced_before = len(order)
    assert paced_before < 5, f"the unrelated tool's 200 calls finished only after {paced_before} paced calls"
    system.stop(timeout_s=1.0)


# -- (7) tools calling tools


def test_lifecycle_nested_calls_complete_at_the_concurrency_ceiling(make_system: Any) -> None:
    holder: list[Any] = []

    def child(input: Any, ctx: Any) -> Any:
        return {"child": input["i"]}

    def parent(input: Any, ctx: Any) -> Any:
        inner = holder[0].execute("child", {"i": input["i"]}).get(timeout=WAIT_S)
        return {"parent": inner.value}

    system = make_system(
        [Tool(tool_id="parent", fn=parent), Tool(tool_id="child", fn=child)],
        policy=Policy(batch_grace_s=0.01, max_concurrency=2),
    )
    holder.append(system.proxy())
    futures = [system.proxy().execute("parent", {"i": i}) for i in range(4)]
    results = [outcome(f, timeout=WAIT_S * 2) for f in futures]
    assert [getattr(r, "value", r) for r in results] == [{"parent": {"child": i}} for i in range(4)]


# -- (8) await never blocks the loop


def test_lifecycle_await_of_a_thousand_futures_keeps_the_loop_ticking(make_system: Any) -> None:
    release = threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        release.wait(WAIT_S * 2)
        return input

    system = make_system([Tool(tool_id="api", fn=fn, durable=False)], policy=Policy(max_concurrency=64))
    released_by: list[str] = []
    fallback = threading.Timer(5.0, lambda: (released_by.append("fallback"), release.set()))
    fallback.daemon = True

    async def main() -> list[Any]:
        futures = [system.proxy().execute("api", {"i": i}) for i in range(1000)]

        async def ticker() -> None:
            for _ in range(5):
                await asyncio.sleep(0.01)
            if not release.is_set():
                released_by.append("ticker")
                release.set()

        results = await asyncio.gather(ticker(), *(_await(f) for f in futures))
        return list(results[1:])

    fallback.start()
    try:
        results = asyncio.run(main())
    finally:
        fallback.cancel()
        release.set()
    assert released_by[:1] == ["ticker"], "awaiting the futures blocked the event loop"
    assert [r.value for r in results] == [{"i": i} for i in range(1000)]


async def _await(future: Any) -> Any:
    return await future


# -- (9) half-open probe with a refused budget charge


def test_lifecycle_half_open_probe_refused_by_the_budget_leaves_no_waiter_stuck() -> None:
    policy = Policy(max_provider_calls=1, circuit_failures=1, circuit_open_s=1.0)
    gov = Governor(policy, {"p": Pacing()})
    first = gov.acquire("o", "p", 1, "first", 0.0)
    assert [reply for reply, _ in first.grants] == ["first"]
    gov.release("o", "p", 1, 0, 0.5, unavailable=1)  # the circuit opens
    probe = gov.acquire("o", "p", 1, "probe", 2.0)  # half-open: the probe's charge is refused
    assert [reply for reply, _ in probe.refusals] == ["probe"]
    after = gov.acquire("o", "p", 1, "after", 2.1)
    refused = {reply: exc for reply, exc in after.refusals}
    assert "after" in refused, "a waiter behind a refused probe was never woken"
    assert isinstance(refused["after"], (BudgetExceededError, ProviderUnavailableError))


# -- (10) the latch stops calls already waiting for admission


class BrokenCompletions(SqliteReceiptStore):
    """Every completion write fails; every claimed receipt is counted."""

    claimed: list[int]

    def claim_many(self, org_id: str, requests: Any, *args: Any, **kwargs: Any) -> Any:
        dispositions = super().claim_many(org_id, requests, *args, **kwargs)
        self.claimed.extend(1 for _ in requests)
        return dispositions

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("injected: disk I/O error")


def test_lifecycle_tripped_latch_refuses_calls_waiting_for_admission(make_system: Any, db_path: Path) -> None:
    """At a ceiling of 4, a first wave of 4 calls holds every slot while 20 more calls,
    sent one by one (one drain each), are claimed and wait for a slot. The first wave
    returns, its completions fail, the latch trips: the 20 waiting calls are refused.
    Every provider call looks at the latch as it starts: none may start once tripped."""
    ceiling, waiting = 4, 20
    started: list[bool] = []  # per provider call: was the latch tripped when it started?
    first_wave_back = threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        started.append(system.latch.tripped)
        if input["i"] < ceiling:
            first_wave_back.wait(WAIT_S)
        else:
            _pause(0.05)  # the provider's latency
        return input

    store = BrokenCompletions(db_path)
    store.claimed = []
    try:
        tool = Tool(tool_id="api", fn=fn, pacing=Pacing(max_concurrency=ceiling))
        policy = Policy(batch_grace_s=0.01, max_concurrency=ceiling, completion_ladder_s=(0.01,))
        system = make_system([tool], policy=policy, store=store)
        futures = [system.proxy().execute("api", {"i": i}) for i in range(ceiling)]
        _until(lambda: len(started) == ceiling, "the first wave to start")
        for i in range(ceiling, ceiling + waiting):
            futures.append(system.proxy().execute("api", {"i": i}))
            _until(lambda: len(store.claimed) > i, f"call {i} to be claimed")  # noqa: B023
        first_wave_back.set()
        outcomes = [outcome(f) for f in futures]
        after_trip = started.count(True)
        assert after_trip == 0, f"{after_trip} provider calls started after the latch tripped"
        assert len(started) == ceiling, (
            f"{len(started)} provider calls; the latch tripped after the first wave"
        )
        refused = [o for o in outcomes[ceiling:] if isinstance(o, PersistenceCircuitOpenError)]
        assert len(refused) == waiting, outcomes[ceiling:]
        system.stop(timeout_s=WAIT_S)
    finally:
        first_wave_back.set()
        store.close()


# -- (11) an output that raises while serialised fails its own call only


class Poisoned:
    """An ORM row whose session closed: touching it raises."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("the session is closed")

    def __iter__(self) -> Any:
        raise RuntimeError("the session is closed")


@attrs.define
class PoisonedRow:
    """An attrs-mapped row whose session closed: reading a field raises (not a TypeError)."""

    id: int

    def __getattribute__(self, name: str) -> Any:
        if name == "id":
            raise RuntimeError("the session is closed")
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("poison", [Poisoned, lambda: PoisonedRow(1)], ids=["object", "attrs-row"])
def test_lifecycle_output_that_raises_when_serialised_fails_alone(make_system: Any, poison: Any) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        return [poison() if item["i"] == 1 else {"ok": item["i"]} for item in payload]

    tool = Tool(tool_id="rows", fn=lambda i, c: i, batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=3))
    system = make_system([tool], policy=Policy(batch_grace_s=0.2))
    futures = [system.proxy().execute("rows", {"i": i}) for i in range(3)]
    outcomes = [outcome(f) for f in futures]
    assert isinstance(outcomes[1], Exception)
    assert [outcomes[0].value, outcomes[2].value] == [{"ok": 0}, {"ok": 2}]
    stopped = threading.Event()
    threading.Thread(target=lambda: (system.stop(timeout_s=WAIT_S), stopped.set()), daemon=True).start()
    assert stopped.wait(WAIT_S * 2), "stop() hung"


# -- (12) slots free only once results are persisted


class SlowCompletions(SqliteReceiptStore):
    """Completions take a while (a slow disk); each claim and each completion written is
    counted."""

    claimed: list[int]
    persisted: list[int]

    def claim_many(self, org_id: str, requests: Any, *args: Any, **kwargs: Any) -> Any:
        dispositions = super().claim_many(org_id, requests, *args, **kwargs)
        self.claimed.extend(1 for _ in requests)
        return dispositions

    def complete_many(self, org_id: str, completions: Any, *args: Any, **kwargs: Any) -> Any:
        _pause(0.05)
        report = super().complete_many(org_id, completions, *args, **kwargs)
        self.persisted.extend(1 for _ in completions)
        return report


def test_lifecycle_slots_free_only_once_results_are_persisted(make_system: Any, db_path: Path) -> None:
    """Work in flight is the provider calls started whose result is not written yet; at a
    ceiling of 4 it never exceeds 4, however slow the writes. A first wave of 4 calls
    holds every slot while 20 more, sent one by one (one drain each), are claimed and wait
    for a slot; then the first wave returns. A slot given back when its call returns,
    before its result is written, would let a fifth call start."""
    ceiling, waiting = 4, 20
    store = SlowCompletions(db_path)
    store.claimed, store.persisted = [], []
    started: list[int] = []
    in_flight: list[int] = []  # at each provider call's start: started - persisted
    first_wave_back = threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        started.append(1)
        in_flight.append(len(started) - len(store.persisted))
        if input["i"] < ceiling:
            first_wave_back.wait(WAIT_S)
        return input

    try:
        tool = Tool(tool_id="api", fn=fn, pacing=Pacing(max_concurrency=ceiling))
        system = make_system([tool], policy=Policy(batch_grace_s=0.01, max_concurrency=ceiling), store=store)
        futures = [system.proxy().execute("api", {"i": i}) for i in range(ceiling)]
        _until(lambda: len(started) == ceiling, "the first wave to start")
        for i in range(ceiling, ceiling + waiting):
            futures.append(system.proxy().execute("api", {"i": i}))
            _until(lambda: len(store.claimed) > i, f"call {i} to be claimed")  # noqa: B023
        first_wave_back.set()
        for f in futures:
            f.get(timeout=WAIT_S * 3)
        assert len(in_flight) == ceiling + waiting
        assert max(in_flight) <= ceiling, f"work in flight reached {max(in_flight)} at a ceiling of {ceiling}"
        system.stop(timeout_s=WAIT_S)
    finally:
        first_wave_back.set()
        store.close()


# -- (13) continuous admission


@pytest.mark.waits
def test_lifecycle_admission_is_continuous_whatever_the_latency(make_system: Any) -> None:
    gauge = Running()

    def fn(input: Any, ctx: Any) -> Any:
        span = gauge.enter()
        try:
            _pause(0.2)
            return input
        finally:
            gauge.leave(span)

    tool = Tool(tool_id="api", fn=fn, pacing=Pacing(rps=50.0))
    system = make_system([tool], policy=Policy(batch_grace_s=0.01))
    proxy = system.proxy()
    inputs = [{"i": i} for i in range(100)]
    many = getattr(proxy, "execute_many", None)
    futures = many("api", inputs) if many else [proxy.execute("api", x) for x in inputs]
    for f in futures:
        f.get(timeout=WAIT_S * 6)
    assert gauge.overlapping() >= 20, f"only {gauge.overlapping()} of 100 requests overlapped another"
