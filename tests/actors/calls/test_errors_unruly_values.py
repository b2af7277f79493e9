"""User code that raises the unexpected: a ``BaseException`` (SystemExit, KeyboardInterrupt,
GeneratorExit) or an exception whose own ``str()`` raises, from a tool's output while it
is serialised, from a reconcile hook or its value, from a perf hook. Each fails its own
call (or is ignored, for an observer); the other calls of the same batch or system are
answered and stored, nothing waits forever, and ``stop()`` returns at once. Real
systems on SQLite files, both runtimes.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from actors import BatchStrategy, InvalidOutputError, Tool, UncertainOutcomeError
from stores import ReceiptStatus

WAIT_S = 15.0


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no message either")


def _raiser(kind: str) -> type[BaseException]:
    return {"unprintable": Unprintable, "system_exit": SystemExit, "keyboard": KeyboardInterrupt,
            "generator_exit": GeneratorExit}[kind]  # fmt: skip


KINDS = ["unprintable", "system_exit", "keyboard", "generator_exit"]


class Key:
    """A dict key that is not a string (refused as output) whose ``repr`` raises."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        raise _raiser(self.kind)()

    def __hash__(self) -> int:
        return 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_an_output_that_raises_anything_while_serialised_fails_its_member_alone(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any, kind: str, batched: bool
) -> None:
    def one(i: Any) -> Any:
        return {Key(kind): 1} if i.get("bad") else {"v": i["n"]}

    def batch_fn(payload: Any, ctx: Any) -> Any:
        recorder.record("batch", payload, ctx)
        return [one(i) for i in payload]

    def fn(i: Any, ctx: Any) -> Any:
        recorder.record("fn", i, ctx)
        return one(i)

    batch = BatchStrategy(batch_fn=batch_fn, max_batch_size=10) if batched else None
    tool = Tool(tool_id="t", fn=fn, batch=batch)
    system = make_system([tool])
    inputs = [{"n": 0}, {"n": 1, "bad": True}, {"n": 2}]
    futures = system.proxy().execute_many("t", inputs)
    with pytest.raises(InvalidOutputError, match=r"cannot be serialised|different value"):
        futures[1].get(timeout=WAIT_S)
    assert [futures[i].get(timeout=WAIT_S).value for i in (0, 2)] == [{"v": 0}, {"v": 2}]
    good = read_receipts([key_of(tool, inputs[0]), key_of(tool, inputs[2])])
    assert [r.status for r in good] == [ReceiptStatus.COMPLETED] * 2  # paid for, kept
    started = time.monotonic()
    system.stop(timeout_s=10.0)
    assert time.monotonic() - started < 5.0
    rerun = make_system([tool], run_id="r2").proxy().execute_many("t", [inputs[0], inputs[2]])
    assert [f.get(timeout=WAIT_S).execution for f in rerun] == ["cached", "cached"]  # free


@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_output_error_never_keeps_the_slot(make_system: Any, kind: str) -> None:
    from actors import Pacing

    def fn(i: Any, ctx: Any) -> Any:
        return {Key(kind): 1} if i.get("bad") else {"v": i["n"]}

    tool = Tool(tool_id="t", fn=fn, pacing=Pacing(max_concurrency=1))
    system = make_system([tool])
    with pytest.raises(InvalidOutputError):
        system.proxy().execute("t", {"n": 0, "bad": True}).get(timeout=WAIT_S)
    results = [system.proxy().execute("t", {"n": n}).get(timeout=WAIT_S).value for n in range(1, 4)]
    assert results == [{"v": 1}, {"v": 2}, {"v": 3}]  # the one slot came back


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["hook", "value"])
def test_a_reconcile_hook_that_raises_anything_answers_its_call(
    make_system: Any, kind: str, where: str
) -> None:
    sent = {"n": 0}

    def fn(i: Any, ctx: Any) -> Any:
        sent["n"] += 1
        if sent["n"] == 1:
            raise TimeoutError("read timed out after sending")  # not retry-safe: uncertain
        return {"v": i}

    def reconcile(i: Any, ctx: Any) -> Any:
        if where == "hook":
            raise _raiser(kind)("reconcile interrupted")
        return {Key(kind): 1}

    tool = Tool(tool_id="t", fn=fn, retry_safe=False, reconcile=reconcile)
    system = make_system([tool])
    with pytest.raises(Exception):  # noqa: B017 - the first attempt's outcome is uncertain
        system.proxy().execute("t", {"a": 1}).get(timeout=WAIT_S)
    expected = UncertainOutcomeError if where == "hook" else InvalidOutputError
    with pytest.raises(expected):
        system.proxy().execute("t", {"a": 1}).get(timeout=WAIT_S)
    assert system.proxy().execute("t", {"b": 1}).get(timeout=WAIT_S).value == {"v": {"b": 1}}
    started = time.monotonic()
    system.stop(timeout_s=10.0)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("kind", KINDS)
def test_a_perf_hook_that_raises_anything_breaks_no_call(make_system: Any, kind: str) -> None:
    from actors import Policy

    def hook(phase: str, ms: float, extra: Any) -> None:
        raise _raiser(kind)("observer")

    tool = Tool(tool_id="t", fn=lambda i, c: {"v": i["n"]})
    system = make_system([tool], policy=Policy(perf_hook=hook)) if _has_perf_hook() else make_system([tool])
    futures = system.proxy().execute_many("t", [{"n": n} for n in range(5)])
    assert [f.get(timeout=WAIT_S).value for f in futures] == [{"v": n} for n in range(5)]
    started = time.monotonic()
    system.stop(timeout_s=10.0)
    assert time.monotonic() - started < 5.0


def _has_perf_hook() -> bool:
    import attrs

    from actors import Policy

    return "perf_hook" in attrs.fields_dict(Policy)


def test_error_text_never_raises() -> None:
    from actors.errors import error_text

    class Exits(Exception):
        def __str__(self) -> str:
            raise SystemExit("no")

    assert error_text(Exits()) == "Exits (its message could not be read)"
    assert error_text(Unprintable()) == "Unprintable (its message could not be read)"
    assert sys.exc_info() == (None, None, None)


@pytest.mark.parametrize("huge", [1e10, 10**12], ids=["1e10", "10**12"])
@pytest.mark.waits
def test_a_huge_timeout_is_no_timeout_and_every_other_timer_still_fires(make_system: Any, huge: Any) -> None:
    """``timeout_s`` past ``threading.TIMEOUT_MAX`` (a common "no timeout") is accepted and
    breaks nothing: the shared timer thread keeps firing other calls' timeouts and batch
    grace windows."""
    from actors import Policy, ToolTimeoutError

    def slow(i: Any, ctx: Any) -> Any:
        time.sleep(i.get("sleep", 0))
        return {"v": i["n"]}

    tools = [
        Tool(tool_id="local", fn=slow, durable=False),
        Tool(tool_id="batched", fn=slow, durable=False,
             batch=BatchStrategy(batch_fn=lambda p, c: [{"v": i["n"]} for i in p], max_batch_size=10)),
    ]  # fmt: skip
    system = make_system(tools, policy=Policy(batch_grace_s=0.05))
    proxy = system.proxy()
    assert proxy.execute("local", {"n": 1}, timeout_s=huge).get(timeout=WAIT_S).value == {"v": 1}
    assert proxy.execute("local", {"n": 1}).get(timeout=huge).value == {"v": 1}  # a huge wait, too
    time.sleep(0.2)
    with pytest.raises(ToolTimeoutError):
        proxy.execute("local", {"n": 2, "sleep": 2.0}, timeout_s=0.2).get(timeout=WAIT_S)
    batch = proxy.execute_many("batched", [{"n": 3}, {"n": 4}])
    assert [f.get(timeout=WAIT_S).value for f in batch] == [{"v": 3}, {"v": 4}]  # the grace window drained
    started = time.monotonic()
    system.stop(timeout_s=huge)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("option", ["timeout_s", "stale_after_s"])
def test_a_duration_past_a_floats_range_is_a_clear_error_for_that_call(make_system: Any, option: str) -> None:
    from actors import InvalidInputError

    system = make_system([Tool(tool_id="t", fn=lambda i, c: {"v": i})])
    with pytest.raises(InvalidInputError, match=f"{option} must be a number of seconds"):
        system.proxy().execute("t", {"a": 1}, **{option: 10**400}).get(timeout=WAIT_S)
    assert system.proxy().execute("t", {"a": 1}).get(timeout=WAIT_S).value == {"v": {"a": 1}}


@pytest.mark.parametrize(
    ("tool_id", "options", "message"),
    [
        (["t"], {}, "tool_id must be a string"),
        (None, {}, "tool_id must be a string"),
        ("t", {"force_refresh": "no"}, "force_refresh must be True or False"),
        ("t", {"retry_failed": []}, "retry_failed must be True or False"),
        ("t", {"force_refresh": None}, "force_refresh must be True or False"),
    ],
    ids=["tool-id-list", "tool-id-none", "force-refresh-str", "retry-failed-list", "force-refresh-none"],
)
def test_a_bad_option_fails_those_calls_clearly_and_nothing_else(
    make_system: Any, tool_id: Any, options: dict[str, Any], message: str
) -> None:
    from actors import InvalidInputError

    system = make_system([Tool(tool_id="t", fn=lambda i, c: {"v": i})])
    futures = system.proxy().execute_many(tool_id, [{"a": 1}, {"b": 2}], **options)  # never raises here
    for future in futures:
        with pytest.raises(InvalidInputError, match=message):
            future.get(timeout=WAIT_S)
    assert system.proxy().execute("t", {"a": 1}).get(timeout=WAIT_S).value == {"v": {"a": 1}}
    stats = system.stats()
    assert (stats["calls"], stats["errors"], stats["live"]) == (3, 2, 1)


@pytest.mark.waits
def test_each_caller_times_out_at_its_own_timeout_not_a_batch_mates(make_system: Any, recorder: Any) -> None:
    """One caller's short ``timeout_s`` fails that caller only: the calls batched with it,
    and other callers of the same input, wait as long as their own timeouts say; the
    provider call runs for the most patient, and its result is stored."""
    from actors import Policy, ToolTimeoutError

    def one(i: Any, ctx: Any) -> Any:
        recorder.record("single", i, ctx)
        time.sleep(0.4)
        return {"v": i}

    def batch_fn(payload: Any, ctx: Any) -> Any:
        recorder.record("batch", payload, ctx)
        time.sleep(0.4)
        return [{"v": i} for i in payload]

    tools = [
        Tool(tool_id="b", fn=one, batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=50)),
        Tool(tool_id="s", fn=one),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.2))
    proxy = system.proxy()
    patient = proxy.execute_many("b", [{"p": i} for i in range(4)])
    impatient = proxy.execute("b", {"i": 0}, timeout_s=0.05)
    first = proxy.execute("s", {"same": 1})
    second = proxy.execute("s", {"same": 1}, timeout_s=0.05)
    with pytest.raises(ToolTimeoutError, match=r"within 0\.05 s"):
        impatient.get(timeout=WAIT_S)
    with pytest.raises(ToolTimeoutError, match=r"within 0\.05 s"):
        second.get(timeout=WAIT_S)
    assert [f.get(timeout=WAIT_S).value for f in patient] == [{"v": {"p": i}} for i in range(4)]
    assert first.get(timeout=WAIT_S).value == {"v": {"same": 1}}
    assert recorder.count("batch") == 1 and recorder.count("single") == 1  # one provider call each
    (ctx,) = [c.ctx for c in recorder.of("single")]
    assert ctx.timeout_s > 1.0  # the provider call runs for the patient caller
    again = make_system(tools, run_id="r2").proxy().execute("b", {"i": 0})
    assert again.get(timeout=WAIT_S).execution == "cached"  # the impatient caller's result was kept


class _Rows(list):  # type: ignore[type-arg]
    """An input whose own code raises while it is read (a lazy list whose loader exits)."""

    def __init__(self, raising: type[BaseException]) -> None:
        super().__init__([1])
        self.raising = raising

    def __iter__(self) -> Any:
        raise self.raising()


@pytest.mark.parametrize("raising", [SystemExit, GeneratorExit])
def test_an_input_that_raises_a_base_exception_while_keyed_fails_its_call_alone(
    make_system: Any, raising: type[BaseException]
) -> None:
    from actors import InvalidInputError

    system = make_system([Tool(tool_id="t", fn=lambda i, c: {"n": i["n"]})])
    inputs: list[Any] = [{"n": i} for i in range(40)]
    futures = system.proxy().execute_many("t", [*inputs, {"rows": _Rows(raising)}])
    assert [f.get(timeout=WAIT_S).value for f in futures[:40]] == inputs
    with pytest.raises(InvalidInputError, match=raising.__name__):
        futures[40].get(timeout=WAIT_S)
    with pytest.raises(InvalidInputError):
        system.proxy().execute("t", {"rows": _Rows(raising)}).get(timeout=WAIT_S)


def test_the_callers_own_interrupt_while_inputs_are_keyed_is_never_swallowed(make_system: Any) -> None:
    system = make_system([Tool(tool_id="t", fn=lambda i, c: i)])
    with pytest.raises(KeyboardInterrupt):
        system.proxy().execute_many("t", [{"n": 1}, {"rows": _Rows(KeyboardInterrupt)}])
