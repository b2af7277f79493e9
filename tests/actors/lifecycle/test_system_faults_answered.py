"""Faults found by trying to break the lifecycle: each left a caller waiting forever, a slot
held, or a paid result unsaved. Real SQLite files; both runtimes."""

from __future__ import annotations

import glob
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import DispatchSystem, Pacing, Policy, RecordedFailureError, RunInfo, Tool, ToolDispatchError
from actors.tool import BatchStrategy
from stores import SqliteReceiptStore

WAIT_S = 15.0
ONE_SLOT = Policy(max_concurrency=1, batch_grace_s=0.05)


class _BadMessage(Exception):
    def __str__(self) -> str:
        raise AttributeError("the response is gone")


class _BadKey:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __hash__(self) -> int:
        return 1


def _until(done: Any, what: str) -> None:
    """Poll ``done()`` until it holds, failing with ``what`` after WAIT_S."""
    end = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def _after(make_system: Any, fn: Any, policy: Policy = ONE_SLOT, batch: BatchStrategy | None = None) -> Any:
    """Run one bad call, then check the only slot came back: a later call succeeds."""
    tools = [
        Tool(tool_id="bad", fn=fn, provider="p", batch=batch),
        Tool(tool_id="ok", fn=lambda i, c: i, provider="p"),
    ]
    system = make_system(tools, policy=policy)
    with pytest.raises(Exception):  # noqa: B017 - whatever it is, the call is answered
        system.proxy().execute("bad", {"n": 0}).get(timeout=WAIT_S)
    assert system.proxy().execute("ok", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}
    return system


def test_break_an_error_whose_message_raises_is_answered_and_frees_its_slot(make_system: Any) -> None:
    def fn(i: Any, c: Any) -> Any:
        raise _BadMessage()

    _after(make_system, fn)


def test_break_an_output_whose_key_repr_raises_is_answered_and_frees_its_slot(make_system: Any) -> None:
    _after(make_system, lambda i, c: {_BadKey(): 1})


def test_break_a_batch_build_that_raises_fails_its_calls_and_frees_the_slot(make_system: Any) -> None:
    def build(inputs: list[Any]) -> Any:
        raise ValueError("cannot build payload")

    batch = BatchStrategy(batch_fn=lambda p, c: p, max_batch_size=5, build=build)
    system = make_system(
        [
            Tool(tool_id="bad", fn=lambda i, c: i, provider="p", batch=batch),
            Tool(tool_id="ok", fn=lambda i, c: i, provider="p"),
        ],
        policy=ONE_SLOT,
    )
    futures = [system.proxy().execute("bad", {"n": n}) for n in range(2)]
    for future in futures:
        with pytest.raises(ValueError, match="cannot build"):
            future.get(timeout=WAIT_S)
    assert system.proxy().execute("ok", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}


def test_break_a_forced_refresh_behind_a_running_call_never_stalls_a_batch_tool(make_system: Any) -> None:
    started, release = threading.Event(), threading.Event()

    def fn(i: Any, c: Any) -> Any:
        if i["k"] == 1 and not started.is_set():
            started.set()
            release.wait(WAIT_S)
        return {"v": i["k"]}

    batch = BatchStrategy(batch_fn=lambda p, c: [fn(i, c) for i in p], max_batch_size=10)
    system = make_system([Tool(tool_id="t", fn=fn, batch=batch)], policy=Policy(batch_grace_s=0.05))
    normal = system.proxy().execute("t", {"k": 1})
    assert started.wait(WAIT_S)
    forced = system.proxy().execute("t", {"k": 1}, force_refresh=True)
    release.set()
    assert normal.get(timeout=WAIT_S).value == {"v": 1}
    assert forced.get(timeout=WAIT_S).execution == "live"
    assert system.proxy().execute("t", {"k": 2}).get(timeout=WAIT_S).value == {"v": 2}  # not wedged


def test_break_a_nested_call_joining_a_waiting_group_borrows_the_parents_slot(make_system: Any) -> None:
    holder: dict[str, Any] = {}
    host_call_queued = threading.Event()

    def parent(i: Any, c: Any) -> Any:
        host_call_queued.wait(WAIT_S)  # the host's own call of the child's key waits for our slot
        return holder["proxy"].execute("child", {"n": 1}).get(timeout=WAIT_S).value

    tools = [
        Tool(tool_id="parent", fn=parent, provider="P"),
        Tool(tool_id="child", fn=lambda i, c: i, provider="C"),
    ]
    system = make_system(tools, policy=Policy(max_concurrency=1))
    holder["proxy"] = system.proxy()
    parent_future = system.proxy().execute("parent", {"n": 0})
    child_future = system.proxy().execute("child", {"n": 1})
    threading.Timer(0.3, host_call_queued.set).start()
    assert parent_future.get(timeout=WAIT_S).value == {"n": 1}
    assert child_future.get(timeout=WAIT_S).value == {"n": 1}


@pytest.mark.parametrize("again", ["retry", "429"])
def test_break_a_nested_call_that_joined_a_running_call_goes_again_on_its_parents_slot(
    make_system: Any, again: str
) -> None:
    """The host's own call of the child holds the child provider's only slot; a running
    parent's nested call joins it; its attempt fails and goes again (a retry, a 429) while
    another host call took the freed slot and holds it: the retry borrows the parent's
    slot, as a nested call does, instead of waiting behind the ceiling."""
    from actors.errors import ProviderError, RateLimitedError
    from stores.types import FailureKind

    holder: dict[str, Any] = {}
    joined, release = threading.Event(), threading.Event()
    attempts: list[int] = []

    def child(i: Any, c: Any) -> Any:
        if i["n"] == 2:  # the other host call: holds the slot until the test is done
            release.wait(WAIT_S)
            return i
        attempts.append(1)
        if len(attempts) == 1:
            joined.wait(WAIT_S)  # the parent's nested call joins this attempt
            if again == "429":
                raise RateLimitedError("busy", retry_after="0.05")
            raise ProviderError("503", failure_kind=FailureKind.TRANSIENT)
        return i

    def parent(i: Any, c: Any) -> Any:
        return holder["proxy"].execute("child", {"n": 1}).get(timeout=WAIT_S).value

    tools = [
        Tool(tool_id="parent", fn=parent, provider="P"),
        Tool(tool_id="child", fn=child, provider="C", retry_safe=True, pacing=Pacing(max_concurrency=1)),
    ]
    system = make_system(tools, policy=Policy(retry_backoff_s=0.05))
    proxy = holder["proxy"] = system.proxy()
    host_child = proxy.execute("child", {"n": 1})
    _until(lambda: bool(attempts), "the host's call never started")
    other = proxy.execute("child", {"n": 2})  # waits for the slot, takes it when the retry frees it
    parent_future = proxy.execute("parent", {"n": 0})
    _until(lambda: system.stats().get("deduped", 0) >= 1, "the nested call never joined the running call")
    joined.set()
    try:
        assert parent_future.get(timeout=WAIT_S).value == {"n": 1}  # while n=2 still holds the slot
        assert host_child.get(timeout=WAIT_S).value == {"n": 1}
    finally:
        release.set()
    assert other.get(timeout=WAIT_S).value == {"n": 2}


def test_break_a_tool_calling_itself_with_the_input_it_runs_for_is_refused_at_once(make_system: Any) -> None:
    """The nested call would wait for its own result (until the timeout, then leave an
    uncertain receipt): refused at once, naming the cycle; another input still runs."""
    from actors import CallCycleError

    holder: dict[str, Any] = {}
    seen: dict[str, Any] = {}

    def recursive(i: Any, c: Any) -> Any:
        if i["n"] == 0:
            return {"leaf": True}
        try:
            holder["proxy"].execute("t", i).get(timeout=WAIT_S)
        except CallCycleError as exc:
            seen["cycle"] = exc
        return holder["proxy"].execute("t", {"n": i["n"] - 1}).get(timeout=WAIT_S).value

    system = make_system([Tool(tool_id="t", fn=recursive, provider="p")], policy=ONE_SLOT)
    holder["proxy"] = system.proxy()
    assert system.proxy().execute("t", {"n": 2}).get(timeout=WAIT_S).value == {"leaf": True}
    assert "inside its own call" in str(seen["cycle"])


def test_break_a_cycle_through_another_tool_is_refused_at_once(make_system: Any) -> None:
    """A calls B, B calls A with A's own input: that call would wait for A, which waits
    for B. Refused at once, so B and then A can answer."""
    from actors import CallCycleError

    holder: dict[str, Any] = {}

    def a(i: Any, c: Any) -> Any:
        return {"a": holder["proxy"].execute("b", i).get(timeout=WAIT_S).value}

    def b(i: Any, c: Any) -> Any:
        try:
            holder["proxy"].execute("a", i).get(timeout=WAIT_S)
        except CallCycleError:
            return {"b": "cycle refused"}
        return {"b": "no cycle seen"}

    tools = [Tool(tool_id="a", fn=a, provider="A"), Tool(tool_id="b", fn=b, provider="B")]
    system = make_system(tools)
    holder["proxy"] = system.proxy()
    assert system.proxy().execute("a", {"n": 1}).get(timeout=WAIT_S).value == {"a": {"b": "cycle refused"}}


@pytest.mark.parametrize("mode", ["force_refresh", "retry_failed"])
def test_break_a_nested_call_held_behind_the_hosts_call_of_its_key_borrows_a_slot(
    make_system: Any, mode: str
) -> None:
    """One slot, held by the running parent. The host's call of the child's key waits for
    it; the parent's nested call of that key in another mode cannot join, so it waits
    until that key settles: the host's call now borrows the parent's slot."""
    holder: dict[str, Any] = {}
    running, go = threading.Event(), threading.Event()

    def parent(i: Any, c: Any) -> Any:
        running.set()
        go.wait(WAIT_S)
        return holder["proxy"].execute("child", {"n": 1}, **{mode: True}).get(timeout=WAIT_S).value

    tools = [
        Tool(tool_id="parent", fn=parent, provider="P"),
        Tool(tool_id="child", fn=lambda i, c: i, provider="C"),
    ]
    system = make_system(tools, policy=ONE_SLOT)
    proxy = holder["proxy"] = system.proxy()
    parent_future = proxy.execute("parent", {"n": 0})
    assert running.wait(WAIT_S)  # the parent runs on the only slot
    host_child = proxy.execute("child", {"n": 1})
    _until(lambda: system.stats().get("receipts_created", 0) >= 2, "the host's call was never claimed")
    go.set()  # the host's call waits for the only slot, which the parent holds
    assert parent_future.get(timeout=WAIT_S).value == {"n": 1}
    assert host_child.get(timeout=WAIT_S).value == {"n": 1}


def test_break_a_nested_call_held_behind_its_key_in_a_batch_window_still_drains_the_window(
    make_system: Any,
) -> None:
    """A batched child: the parent's nested force_refresh of a key the host's call runs
    opens the batch window (held behind that key); its next nested call joins the window,
    which must drain at its grace deadline, not when the held key settles (it never did:
    the host's call waits for the parent)."""
    holder: dict[str, Any] = {}
    release = threading.Event()

    def batch_fn(items: Any, c: Any) -> Any:
        if any(i["n"] == 1 for i in items) and not release.is_set():
            release.wait(WAIT_S)  # the host's call of n=1 runs until the parent has n=2
        return items

    def parent(i: Any, c: Any) -> Any:
        proxy = holder["proxy"]
        refreshed = proxy.execute("child", {"n": 1}, force_refresh=True)  # held behind the host's
        other = proxy.execute("child", {"n": 2}).get(timeout=WAIT_S).value  # the same window
        release.set()
        return {"other": other, "refreshed": refreshed.get(timeout=WAIT_S).value}

    child = Tool(
        tool_id="child",
        fn=lambda i, c: i,
        provider="C",
        batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10),
    )
    system = make_system([Tool(tool_id="parent", fn=parent, provider="P"), child])
    proxy = holder["proxy"] = system.proxy()
    host = proxy.execute("child", {"n": 1})
    _until(lambda: system.stats().get("requests", 0) >= 1, "the host's batch never went out")
    try:
        assert proxy.execute("parent", {"n": 0}).get(timeout=WAIT_S).value == {
            "other": {"n": 2},
            "refreshed": {"n": 1},
        }
    finally:
        release.set()
    assert host.get(timeout=WAIT_S).value == {"n": 1}


def test_break_a_nested_call_on_the_half_open_probes_provider_is_not_held_by_it(make_system: Any) -> None:
    """The parent's call is the half-open circuit's probe; its nested call on the same
    provider waited for the probe to settle, which waited on it: hung, and every later
    call of that provider with it."""
    from actors.errors import ProviderUnreachableError

    holder: dict[str, Any] = {}
    down = {"on": True}

    def flaky(i: Any, c: Any) -> Any:
        if down["on"]:
            raise ProviderUnreachableError("down")
        return i

    def parent(i: Any, c: Any) -> Any:
        return holder["proxy"].execute("child", i).get(timeout=WAIT_S).value

    tools = [
        Tool(tool_id="flaky", fn=flaky, provider="P"),
        Tool(tool_id="parent", fn=parent, provider="P"),
        Tool(tool_id="child", fn=lambda i, c: i, provider="P"),
    ]
    system = make_system(tools, policy=Policy(circuit_failures=3, circuit_open_s=0.3, batch_grace_s=0.05))
    proxy = holder["proxy"] = system.proxy()
    for n in range(3):
        with pytest.raises(ProviderUnreachableError):
            proxy.execute("flaky", {"n": n}).get(timeout=WAIT_S)
    assert system.stats()["pacing"][f"{system.run.org_id}/P"]["circuit"] == "open"
    time.sleep(0.5)  # circuit_open_s passes: half-open, the next call is the probe
    assert proxy.execute("parent", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}
    assert proxy.execute("child", {"n": 2}).get(timeout=WAIT_S).value == {"n": 2}


def test_break_an_oversized_outputs_joiner_gets_a_dispatch_error(make_system: Any) -> None:
    started, release = threading.Event(), threading.Event()

    def huge(i: Any, c: Any) -> Any:
        started.set()
        release.wait(WAIT_S)
        return {"blob": "x" * (33 * 1024 * 1024)}

    system = make_system([Tool(tool_id="h", fn=huge)])
    first = system.proxy().execute("h", {"n": 1})
    assert started.wait(WAIT_S)
    joiner = system.proxy().execute("h", {"n": 1})
    release.set()
    assert len(first.get(timeout=WAIT_S * 4).value["blob"]) == 33 * 1024 * 1024  # the caller gets it
    try:
        result = joiner.get(timeout=WAIT_S * 4)
    except ToolDispatchError as exc:  # never an internal type
        assert isinstance(exc, RecordedFailureError)
    else:
        assert len(result.value["blob"]) == 33 * 1024 * 1024


@pytest.mark.waits
def test_break_stop_during_the_completion_ladder_salvages_before_it_returns(tmp_path: Path) -> None:
    class Down(SqliteReceiptStore):
        def complete_many(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError("disk I/O error")

    paid = threading.Event()

    def fn(i: Any, c: Any) -> Any:
        paid.set()
        return {"k": i["k"], "paid": True}

    db = tmp_path / "ladder.db"
    store = Down(db)
    system = DispatchSystem.start(
        tools=[Tool(tool_id="t", fn=fn)], store=store, run=RunInfo(run_id="r", org_id="o", scope="s")
    )
    try:
        future = system.proxy().execute("t", {"k": 1})
        assert paid.wait(WAIT_S)
        threading.Event().wait(0.3)  # the first write failed; the next is 1 s away on the ladder
    finally:
        system.stop(timeout_s=2.0)
        store.close()
    salvaged = [
        line
        for path in glob.glob(str(tmp_path / "*salvage*.jsonl"))
        for line in Path(path).read_text().splitlines()
    ]
    assert len(salvaged) == 1 and '"paid":true' in salvaged[0].replace(" ", "")
    assert future.get(timeout=1.0).value == {"k": 1, "paid": True}  # answered: salvaged, not lost
    assert os.path.exists(str(db))


@pytest.mark.parametrize("error", [MemoryError, OSError, ValueError])
def test_break_a_pool_that_cannot_start_a_tool_answers_the_call_and_frees_its_slot(
    make_system: Any, error: type[BaseException]
) -> None:
    # starting a worker can fail for other reasons than a pool shut down (no thread could
    # start, memory): the attempt was never sent, its caller is answered, the slot freed,
    # and it is no request sent (the report counts what reached the provider)
    system = make_system([Tool(tool_id="ok", fn=lambda i, c: i, provider="p")], policy=ONE_SLOT)
    pool = system.ports.pool
    real, failed = pool.submit, []

    def submit(fn: Any, *args: Any) -> None:
        if not failed:
            failed.append(fn)
            raise error("can't start new thread")
        real(fn, *args)

    pool.submit = submit
    with pytest.raises(ToolDispatchError, match="can't start new thread"):
        system.proxy().execute("ok", {"n": 0}).get(timeout=WAIT_S)
    assert failed
    assert system.proxy().execute("ok", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}
    assert system.stats()["tools"]["ok"]["requests"] == 1


def test_break_an_unwritable_salvage_file_still_answers_an_unstorable_output(
    make_system: Any, tmp_path: Path
) -> None:
    # an output with no JSON form is salvaged (described) before its failure is recorded;
    # when the salvage file cannot be written (disk full, a path that is no directory),
    # the caller must still hear back and the only slot come back
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    policy = Policy(max_concurrency=1, batch_grace_s=0.05, salvage_path=str(blocker / "salvage.jsonl"))
    tools = [
        Tool(tool_id="bad", fn=lambda i, c: {1, 2}, provider="p"),
        Tool(tool_id="ok", fn=lambda i, c: i, provider="p"),
    ]
    system = make_system(tools, policy=policy)
    with pytest.raises(ToolDispatchError):  # answered (not a pykka Timeout)
        system.proxy().execute("bad", {"n": 0}).get(timeout=WAIT_S)
    assert system.proxy().execute("ok", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}
