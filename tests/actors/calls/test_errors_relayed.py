"""A tool whose function made its own (paid) request and then passes on a nested call's
refusal (budget spent, not sent, a 429, a lost lease) fails as its own call: its receipt is
recorded failed, never released (released, every rerun paid the provider again), and the
nested call's provider troubles are not held against the parent's provider (no pause, no
circuit count, no refunded request). Real systems on SQLite files, both runtimes.
"""

from __future__ import annotations

import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from actors import (
    BudgetExceededError,
    LeaseLostError,
    NotSentError,
    Policy,
    RateLimitedError,
    RecordedFailureError,
    Tool,
)

WAIT_S = 15.0


def _statuses(path: Path) -> dict[str, tuple[str, str | None]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT tool_id, status, failure_kind FROM receipts").fetchall()
    return {tool: (status, kind) for tool, status, kind in rows}


@pytest.mark.parametrize("lent", [False, True], ids=["own-thread", "lent-executor-thread"])
def test_a_parent_that_paid_then_hit_the_budget_in_a_nested_call_is_paid_once(
    make_system: Any, db_path: Path, recorder: Any, lent: bool
) -> None:
    """``lent``: the nested call is made, and its refusal raised, on an executor thread the
    parent lent to itself (``ctx.wrap``), then raised on by the parent."""
    holder: dict[str, Any] = {}

    def child(i: Any, c: Any) -> Any:
        recorder.record("child", i, c)
        return {"c": i}

    def parent(i: Any, c: Any) -> Any:
        recorder.record("parent", i, c)  # the parent's own request: paid
        nested = lambda: holder["proxy"].execute("child", {"x": i["x"]}).get(timeout=WAIT_S).value  # noqa: E731
        if not lent:
            return {"child": nested()}
        with ThreadPoolExecutor(1) as pool:
            return {"child": pool.submit(c.wrap(nested)).result(WAIT_S)}

    tools = [Tool(tool_id="parent", fn=parent, provider="pa"), Tool(tool_id="child", fn=child, provider="ch")]
    for run in range(3):
        system = make_system(
            tools, run_id=f"run-{run}", policy=Policy(batch_grace_s=0.02, max_provider_calls=1)
        )
        holder["proxy"] = system.proxy()
        error = BudgetExceededError if run == 0 else RecordedFailureError
        with pytest.raises(error):
            holder["proxy"].execute("parent", {"x": 1}).get(timeout=WAIT_S)
        system.stop()
        assert _statuses(db_path)["parent"][0] == "uncertain"  # not retry-safe: it acted
    assert recorder.count("parent") == 1 and recorder.count("child") == 0


@pytest.mark.parametrize(
    ("nested_error", "runs"),
    [
        pytest.param(lambda: NotSentError("the child's turn came too late"), 2, id="not-sent"),
        pytest.param(lambda: LeaseLostError("the child's lease was lost"), 2, id="lease-lost"),
        pytest.param(
            lambda: RateLimitedError("429 from the child's provider", retry_after="30"), 1, id="429"
        ),
    ],
)
def test_a_nested_calls_refusal_passed_on_is_the_parents_own_failure(
    make_system: Any, db_path: Path, recorder: Any, nested_error: Any, runs: int
) -> None:
    """The child fails (its tool raises the error); the parent, which paid, re-raises it.
    The parent's receipt is recorded (failed, or uncertain: a parent that is not retry-safe
    acted and a rerun would retry these), not released, so a rerun does not pay again.
    The parent's provider is not paused by the child's 429: its next call runs at once."""
    holder: dict[str, Any] = {}

    def child(i: Any, c: Any) -> Any:
        recorder.record("child", i, c)
        raise nested_error()

    def parent(i: Any, c: Any) -> Any:
        recorder.record("parent", i, c)
        return holder["proxy"].execute("child", {"x": i["x"]}).get(timeout=WAIT_S).value

    def other(i: Any, c: Any) -> Any:
        recorder.record("other", i, c)
        return {"ok": i}

    tools = [
        Tool(tool_id="parent", fn=parent, provider="pa"),
        Tool(tool_id="child", fn=child, provider="ch"),
        Tool(tool_id="other", fn=other, provider="pa"),
    ]
    policy = Policy(batch_grace_s=0.02, retry_attempts=0)
    for run in range(runs):
        system = make_system(tools, run_id=f"run-{run}", policy=policy)
        holder["proxy"] = system.proxy()
        with pytest.raises(Exception):  # noqa: B017 - the relayed error, then the recorded failure
            holder["proxy"].execute("parent", {"x": 1}).get(timeout=WAIT_S)
        if run == 0:  # the parent's provider was not paused by the child's troubles
            assert system.proxy().execute("other", {"n": 1}).get(timeout=3.0).execution == "live"
        system.stop()
        assert _statuses(db_path)["parent"][0] in ("failed", "uncertain")
    assert recorder.count("parent") == 1


def test_a_tools_own_refusal_is_released_even_as_an_exception_object_used_before(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    """A host that pauses tools with one shared ``SuspendedError`` (its own, never from a
    nested call) has every receipt released, the first and the later ones alike (an error
    object once handed to a caller was taken for a relayed one). The same object passed on
    from a nested call in between does not change that."""
    from actors import SuspendedError

    paused = SuspendedError("the host paused the run")
    holder: dict[str, Any] = {}

    def own(i: Any, c: Any) -> Any:
        recorder.record("own", i, c)
        raise paused

    def parent(i: Any, c: Any) -> Any:
        recorder.record("parent", i, c)
        return holder["proxy"].execute("own", {"n": -1}).get(timeout=WAIT_S).value

    tools = [Tool(tool_id="own", fn=own), Tool(tool_id="parent", fn=parent, provider="pa")]
    system = make_system(tools, policy=Policy(batch_grace_s=0.02))
    holder["proxy"] = proxy = system.proxy()
    with pytest.raises(SuspendedError):
        proxy.execute("parent", {"p": 1}).get(timeout=WAIT_S)  # relayed: the parent is recorded
    for n in (1, 2):
        with pytest.raises(SuspendedError):
            proxy.execute("own", {"n": n}).get(timeout=WAIT_S)
    system.stop()
    with sqlite3.connect(db_path) as conn:
        rows = dict(conn.execute("SELECT input_hash, status FROM receipts WHERE tool_id = 'own'").fetchall())
    assert sorted(rows.values()) == ["pending"] * 3
    assert _statuses(db_path)["parent"][0] in ("failed", "uncertain")


def test_a_batch_member_whose_outcome_is_a_nested_calls_refusal_is_recorded(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    """A batch function that paid for its request gives a nested call's NotSentError as
    one member's outcome (an item that is an exception is that member's outcome): the
    member is recorded failed, never released, so reruns do not pay for the batch again
    (before: released on every run, the batch paid three times in three runs)."""
    from actors import BatchStrategy

    holder: dict[str, Any] = {}

    def child(i: Any, c: Any) -> Any:
        recorder.record("child", i, c)
        raise NotSentError("the child's turn came too late")

    def batch_fn(payload: Any, c: Any) -> Any:
        recorder.record("batch", payload, c)
        out: list[Any] = []
        for item in payload:
            try:
                out.append(
                    {"v": holder["proxy"].execute("child", {"x": item["x"]}).get(timeout=WAIT_S).value}
                )
            except Exception as exc:
                out.append(exc)
        return out

    def one(i: Any, c: Any) -> Any:
        raise AssertionError("a batch of two is sent as a batch")

    tools = [
        Tool(
            tool_id="parent", fn=one, provider="pa", batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10)
        ),
        Tool(tool_id="child", fn=child, provider="ch"),
    ]
    for run in range(3):
        system = make_system(tools, run_id=f"run-{run}", policy=Policy(batch_grace_s=0.05, retry_attempts=0))
        holder["proxy"] = system.proxy()
        for future in system.proxy().execute_many("parent", [{"x": 1}, {"x": 2}]):
            with pytest.raises(Exception):  # noqa: B017 - the relayed error, then the recorded failure
                future.get(timeout=WAIT_S)
        system.stop()
    with sqlite3.connect(db_path) as conn:
        statuses = [s for (s,) in conn.execute("SELECT status FROM receipts WHERE tool_id = 'parent'")]
    assert sorted(statuses) in (["failed", "failed"], ["uncertain", "uncertain"])
    assert recorder.count("batch") == 1


def test_a_retry_safe_parent_stopped_in_a_nested_call_is_completed_by_the_rerun(
    make_system: Any, db_path: Path, recorder: Any
) -> None:
    """The run stops while a retry-safe parent waits on its nested call (refused:
    ``CallCancelledError``): the parent is recorded ``transient``, not failed for good,
    so running again completes it, paying the parent once more and the child once
    (before: ``permanent``, every rerun answered RecordedFailureError)."""
    import threading
    import time

    holder: dict[str, Any] = {}
    waiting = threading.Event()

    def child(i: Any, c: Any) -> Any:
        recorder.record("child", i, c)
        return {"c": i["c"]}

    def parent(i: Any, c: Any) -> Any:
        recorder.record("parent", i, c)
        nested = holder["proxy"].execute("child", {"c": i["p"]})
        waiting.set()
        return {"child": nested.get(timeout=WAIT_S).value}

    from actors import Pacing

    tools = [
        Tool(tool_id="parent", fn=parent, retry_safe=True),
        Tool(tool_id="child", fn=child, provider="slow", pacing=Pacing(rps=0.2), retry_safe=True),
    ]
    system = make_system(tools, run_id="run-0")
    holder["proxy"] = system.proxy()
    (first, second) = system.proxy().execute_many("parent", [{"p": 1}, {"p": 2}])
    assert waiting.wait(WAIT_S)
    time.sleep(0.2)  # the second child waits for the provider's pace
    system.stop()
    outcomes = []
    for future in (first, second):
        try:
            outcomes.append(future.get(timeout=WAIT_S).execution)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    with sqlite3.connect(db_path) as conn:
        kinds = {k for (k,) in conn.execute("SELECT failure_kind FROM receipts WHERE status = 'failed'")}
    assert kinds <= {"transient"}
    rerun = make_system(tools, run_id="run-1", policy=Policy(batch_grace_s=0.02))
    holder["proxy"] = rerun.proxy()
    results = [f.get(timeout=30).value for f in rerun.proxy().execute_many("parent", [{"p": 1}, {"p": 2}])]
    assert results == [{"child": {"c": 1}}, {"child": {"c": 2}}]
    assert recorder.count("child") == 2  # each child paid once


def test_a_passed_on_error_neither_opens_nor_closes_the_parents_circuit(make_system: Any) -> None:
    """Relayed failures (the child refuses even inputs) are no evidence about the
    parent's provider: they no longer reset its failure count, so its own failures (odd
    inputs: the provider is down) open the circuit after two, as without them (before:
    each relayed error counted as the provider answering, and the circuit never opened)."""
    from actors import ProviderUnavailableError

    holder: dict[str, Any] = {}
    reached: list[int] = []

    def child(i: Any, c: Any) -> Any:
        if i["x"] % 2 == 0:
            raise ValueError("the child refuses even inputs")
        return {"ok": 1}

    def parent(i: Any, c: Any) -> Any:
        holder["proxy"].execute("child", {"x": i["x"]}).get(timeout=WAIT_S)
        reached.append(i["x"])
        raise ConnectionError("the parent's provider is down")

    tools = [
        Tool(tool_id="parent", fn=parent, provider="pa", retry_safe=True),
        Tool(tool_id="child", fn=child, provider="ch"),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.02, circuit_failures=2, retry_attempts=0))
    holder["proxy"] = system.proxy()
    errors = []
    for x in range(1, 9):
        try:
            system.proxy().execute("parent", {"x": x}).get(timeout=WAIT_S)
        except Exception as exc:
            errors.append(type(exc))
    assert len(reached) == 2, f"the parent's provider was reached {len(reached)} times"
    assert ProviderUnavailableError in errors


@pytest.mark.parametrize("how", ["wrapped", "own-get-timeout"])
def test_a_retry_safe_parent_whose_nested_wait_ran_out_is_completed_by_a_later_call(
    make_system: Any, db_path: Path, recorder: Any, how: str
) -> None:
    """The parent gives up on its nested call: it wraps the refusal (``raise X from e``),
    or its own ``get(timeout=)`` runs out. Recorded ``transient``, so a later call runs
    it again and gets the child's result (before: ``permanent``, RecordedFailureError)."""
    import threading
    import time

    holder: dict[str, Any] = {}
    release = threading.Event()

    class EnrichError(Exception):
        pass

    def child(i: Any, c: Any) -> Any:
        recorder.record("child", i, c)
        release.wait(WAIT_S)
        return {"c": i["c"]}

    def parent(i: Any, c: Any) -> Any:
        recorder.record("parent", i, c)
        nested = holder["proxy"].execute("child", {"c": i["p"]}, timeout_s=0.3 if how == "wrapped" else 30)
        try:
            return {"child": nested.get(timeout=None if how == "wrapped" else 0.3).value}
        except Exception as exc:
            if how == "wrapped":
                raise EnrichError("the child call failed") from exc
            raise

    tools = [
        Tool(tool_id="parent", fn=parent, retry_safe=True),
        Tool(tool_id="child", fn=child, retry_safe=True),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.02, retry_attempts=0))
    holder["proxy"] = system.proxy()
    with pytest.raises(Exception):  # noqa: B017 - the wrapper, or pykka's Timeout
        system.proxy().execute("parent", {"p": 1}).get(timeout=WAIT_S)
    with sqlite3.connect(db_path) as conn:
        row = conn.execute("SELECT status, failure_kind FROM receipts WHERE tool_id = 'parent'").fetchone()
    assert row == ("failed", "transient")
    release.set()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with sqlite3.connect(db_path) as conn:
            done = conn.execute("SELECT status FROM receipts WHERE tool_id = 'child'").fetchone()
        if done == ("completed",):
            break
        time.sleep(0.05)
    assert system.proxy().execute("parent", {"p": 1}).get(timeout=WAIT_S).value == {"child": {"c": 1}}
    assert recorder.count("child") == 1


def test_a_parent_that_is_not_retry_safe_keeps_a_permanent_relayed_failure_failed(
    make_system: Any, db_path: Path
) -> None:
    """A relayed error a rerun would not retry (the child's ValueError) leaves a parent
    that is not retry-safe ``failed`` (not ``uncertain``): nothing would run it again."""
    holder: dict[str, Any] = {}

    def child(i: Any, c: Any) -> Any:
        raise ValueError("no such record")

    def parent(i: Any, c: Any) -> Any:
        return holder["proxy"].execute("child", {"x": 1}).get(timeout=WAIT_S).value

    system = make_system([Tool(tool_id="parent", fn=parent), Tool(tool_id="child", fn=child)])
    holder["proxy"] = system.proxy()
    with pytest.raises(ValueError):
        system.proxy().execute("parent", {"p": 1}).get(timeout=WAIT_S)
    assert _statuses(db_path)["parent"] == ("failed", "permanent")


@pytest.mark.parametrize(
    "how", ["polled-on-own-thread", "polled-on-a-lent-thread", "after-99-other-failures"]
)
@pytest.mark.waits
def test_a_relayed_error_stays_relayed_however_much_the_function_waited_or_got_after_it(
    make_system: Any, how: str
) -> None:
    """The parent gets its first child's failure (an unreachable provider), then polls a
    slow second child with a short ``get(timeout=)`` 100+ times, or waits on 99 more
    children that fail, and raises the first failure on: it is still passed on, so the
    parent's provider circuit (two failures open it) stays closed (before: only the
    latest 64 errors a function got were remembered, the first was forgotten, and the
    parent's provider was held down)."""
    import time

    import pykka

    from actors import ProviderUnavailableError, ProviderUnreachableError

    holder: dict[str, Any] = {}
    failed = (ProviderUnreachableError, ProviderUnavailableError)  # down, then its circuit open

    def child(i: Any, c: Any) -> Any:
        if i["x"] % 2 == 0 and how != "after-99-other-failures":
            time.sleep(0.6)  # the slow one: polled meanwhile
            return {"ok": True}
        raise ProviderUnreachableError(f"child {i['x']}: its provider is down")

    def first_error(x: int) -> BaseException:
        try:
            holder["proxy"].execute("child", {"x": x}).get(timeout=WAIT_S)
        except failed as exc:
            return exc
        raise AssertionError("the child should have failed")

    def poll(x: int) -> Any:
        error = first_error(2 * x + 1)
        slow = holder["proxy"].execute("child", {"x": 2 * x})
        while True:
            try:
                slow.get(timeout=0.002)
                raise error
            except pykka.Timeout:
                continue

    def parent(i: Any, c: Any) -> Any:
        if how == "polled-on-own-thread":
            return poll(i["x"])
        if how == "polled-on-a-lent-thread":
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(c.wrap(poll), i["x"]).result(WAIT_S)
        error = first_error(i["x"] * 1000 + 1)
        for n in range(1, 100):  # more failures after the first
            with contextlib.suppress(*failed):
                holder["proxy"].execute("child", {"x": i["x"] * 1000 + 2 * n + 1}).get(timeout=WAIT_S)
        raise error

    tools = [
        Tool(tool_id="parent", fn=parent, provider="pa", retry_safe=True, timeout_s=WAIT_S),
        Tool(tool_id="child", fn=child, provider="ch", retry_safe=True),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.01, circuit_failures=2, retry_attempts=0))
    holder["proxy"] = system.proxy()
    for x in (1, 2, 3):
        with pytest.raises(failed):
            system.proxy().execute("parent", {"x": x}).get(timeout=WAIT_S)
    assert system.stats()["pacing"]["acme/pa"]["circuit"] == "closed"


@pytest.mark.waits
def test_an_early_wait_that_ran_out_raised_after_many_more_is_still_passed_on(
    make_system: Any, db_path: Path
) -> None:
    """The function polls its nested call 40 times (each ``get(timeout=)`` runs out), then
    raises the first of those waits: still its own wait on a nested call, recorded
    ``transient`` for a retry-safe tool (before: only the latest 16 were remembered and
    it was recorded ``permanent``, so no rerun ran it again)."""
    import time

    import pykka

    holder: dict[str, Any] = {}

    def child(i: Any, c: Any) -> Any:
        time.sleep(2.0)
        return {"ok": True}

    def parent(i: Any, c: Any) -> Any:
        future = holder["proxy"].execute("child", {"x": i["x"]})
        waits = []
        for _ in range(40):
            try:
                future.get(timeout=0.005)
            except pykka.Timeout as exc:
                waits.append(exc)
        raise waits[0]

    tools = [
        Tool(tool_id="parent", fn=parent, provider="pa", retry_safe=True, timeout_s=WAIT_S),
        Tool(tool_id="child", fn=child, provider="ch"),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.01, retry_attempts=0))
    holder["proxy"] = system.proxy()
    with pytest.raises(pykka.Timeout):
        system.proxy().execute("parent", {"x": 1}).get(timeout=WAIT_S)
    assert _statuses(db_path)["parent"] == ("failed", "transient")


def test_the_errors_nested_calls_raised_are_not_held_while_the_function_runs(make_system: Any) -> None:
    """A function that makes thousands of failing nested calls: the dispatcher holds none of
    their errors (before: every one, with its traceback, until the function returned;
    100,000 calls took 340 MB)."""
    import gc

    class ChildError(Exception):
        pass

    holder: dict[str, Any] = {}
    alive: list[int] = []

    def child(i: Any, c: Any) -> Any:
        raise ChildError(f"no {i['x']}")

    def parent(i: Any, c: Any) -> Any:
        for x in range(2_000):
            with contextlib.suppress(ChildError):
                holder["proxy"].execute("child", {"x": x}).get(timeout=WAIT_S)
        gc.collect()
        alive.append(sum(1 for o in gc.get_objects() if type(o) is ChildError))
        return {"ok": True}

    tools = [
        Tool(tool_id="parent", fn=parent, provider="pa", timeout_s=60.0),
        Tool(tool_id="child", fn=child, provider="ch", durable=False),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.0, retry_attempts=0, circuit_failures=10**6))
    holder["proxy"] = system.proxy()
    system.proxy().execute("parent", {"x": 1}).get(timeout=90.0)
    assert alive and alive[0] < 50, f"{alive[0]} nested errors held while the function ran"


@pytest.mark.parametrize("retry_safe", [True, False], ids=["retry-safe", "not-retry-safe"])
def test_a_nested_calls_quota_refusal_passed_on_is_a_refusal_that_passes(
    make_system: Any, db_path: Path, recorder: Any, retry_safe: bool
) -> None:
    """The parent takes the provider's one request a minute; its nested call cannot have
    one before its timeout (QuotaExhaustedError, not sent) and the parent passes it on: a
    refusal that passes, as a budget's: retry-safe, recorded ``transient`` (a rerun runs
    it again), else ``uncertain`` (it acted); never a permanent failure."""
    from actors import Limit, Pacing, QuotaExhaustedError

    holder: dict[str, Any] = {}
    pacing = Pacing(limits=[Limit(1, "minute")])

    def parent(i: Any, c: Any) -> Any:
        recorder.record("parent", i, c)
        return holder["proxy"].execute("child", {"x": i["x"]}).get(timeout=WAIT_S).value

    tools = [
        Tool(tool_id="parent", fn=parent, provider="p", pacing=pacing, retry_safe=retry_safe, timeout_s=3.0),
        Tool(tool_id="child", fn=lambda i, c: i, provider="p", pacing=pacing, timeout_s=1.0),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.02, retry_attempts=0))
    holder["proxy"] = system.proxy()
    with pytest.raises(QuotaExhaustedError):
        holder["proxy"].execute("parent", {"x": 1}).get(timeout=WAIT_S)
    system.stop()
    assert _statuses(db_path)["parent"] == ("failed" if retry_safe else "uncertain", "transient")
