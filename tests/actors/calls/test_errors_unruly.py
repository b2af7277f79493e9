"""Errors whose own methods raise, raised by a tool: a ``RuntimeError`` whose ``__str__``
raises, an SDK-style error whose ``__getattr__`` looks names up in its body (``KeyError``
for anything else), one whose ``__setattr__`` refuses. Each fails its own call, with the
very error raised, whatever path reads it (the failure record, the uncertain check, the
nested-call marks, the in-call retry check); nothing waits forever and no slot is kept.

Also errors whose type, cause, class name, ``failure_kind``, ``__traceback__``,
``with_traceback``, truth, ``__dict__`` or ``__repr__`` misbehave (further paths:
``test_unruly_error_paths.py``). Real systems on SQLite files, both runtimes.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors import (
    BatchStrategy,
    Policy,
    ProviderError,
    Tool,
)
from stores import ReceiptStatus
from stores.types import FailureKind

from ..conftest import WAIT_S


class RuntimeUnprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("message not available")


class BodyError(Exception):
    """Attribute-style access to the error body; KeyError for anything absent."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", "api error"))
        self.body = body

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.body[name]


class ProviderBody(ProviderError):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise KeyError(name)


class TransientBody(BodyError):
    """A retry-safe tool's transient error of the same kind (the in-call retry check reads it)."""

    def __init__(self) -> None:
        super().__init__({"message": "busy"})


class Refusing(Exception):
    def __setattr__(self, name: str, value: Any) -> None:
        raise ValueError(f"{name} is read-only")


def _error(kind: str) -> BaseException:
    if kind == "runtime_unprintable":
        return RuntimeUnprintable()
    if kind == "body":
        return BodyError({"message": "quota exceeded for this key", "code": 403})
    if kind == "provider_body":
        return ProviderBody("quota", failure_kind=FailureKind.TRANSIENT)
    if kind == "timeout_body":
        return TransientBody()
    return Refusing("no")


KINDS = ["runtime_unprintable", "body", "provider_body", "timeout_body"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["single", "batch", "member"])
@pytest.mark.parametrize("retry_safe", [False, True], ids=["not-retry-safe", "retry-safe"])
def test_an_error_whose_methods_raise_fails_its_call_alone(
    make_system: Any, read_receipts: Any, key_of: Any, kind: str, shape: str, retry_safe: bool
) -> None:
    raised: list[BaseException] = []

    def fail(input: Any) -> Any:
        if input.get("bad"):
            error = _error(kind)
            raised.append(error)
            return error
        return {"v": input["n"]}

    def fn(input: Any, ctx: Any) -> Any:
        out = fail(input)
        if isinstance(out, BaseException):
            raise out
        return out

    def batch_fn(payload: Any, ctx: Any) -> Any:
        outs = [fail(i) for i in payload]
        if shape == "batch" and any(isinstance(o, BaseException) for o in outs):
            raise next(o for o in outs if isinstance(o, BaseException))
        return outs

    batch = BatchStrategy(batch_fn=batch_fn, max_batch_size=10) if shape != "single" else None
    tool = Tool(tool_id="t", fn=fn, batch=batch, retry_safe=retry_safe, timeout_s=5.0)
    policy = Policy(batch_grace_s=0.02, max_concurrency=2, retry_backoff_s=0.01)
    system = make_system([tool], policy=policy)
    bad = [{"bad": True, "n": i} for i in range(3)]
    goods = [{"n": i} for i in range(3)] if shape == "member" else []
    futures = system.proxy().execute_many("t", bad + goods)
    for future in futures[: len(bad)]:
        with pytest.raises(BaseException) as caught:
            future.get(timeout=WAIT_S)
        assert any(caught.value is e for e in raised), f"{type(caught.value).__name__}: not the tool's error"
    assert [f.get(timeout=WAIT_S).value for f in futures[len(bad) :]] == [{"v": i} for i in range(len(goods))]
    # every slot came back: calls after them run at once
    after = system.proxy().execute_many("t", [{"n": 10}, {"n": 11}, {"n": 12}])
    assert [f.get(timeout=WAIT_S).value for f in after] == [{"v": 10}, {"v": 11}, {"v": 12}]
    statuses = {r.status for r in read_receipts([key_of(tool, i) for i in bad]) if r is not None}
    assert statuses <= {ReceiptStatus.FAILED, ReceiptStatus.UNCERTAIN, ReceiptStatus.PENDING}, statuses


@pytest.mark.parametrize("kind", ["body", "refusing", "runtime_unprintable"])
def test_a_nested_calls_unruly_error_passed_on_fails_the_parent_alone(make_system: Any, kind: str) -> None:
    raised: list[BaseException] = []
    box: dict[str, Any] = {}

    def child(input: Any, ctx: Any) -> Any:
        error = _error(kind)
        raised.append(error)
        raise error

    def parent(input: Any, ctx: Any) -> Any:
        return box["proxy"].execute("child", input).get(timeout=WAIT_S)

    def ok(input: Any, ctx: Any) -> Any:
        return input

    tools = [Tool(tool_id="child", fn=child), Tool(tool_id="parent", fn=parent), Tool(tool_id="ok", fn=ok)]
    system = make_system(tools, policy=Policy(batch_grace_s=0.0, max_concurrency=2))
    box["proxy"] = system.proxy()
    for i in range(3):
        with pytest.raises(BaseException) as caught:
            system.proxy().execute("parent", {"i": i}).get(timeout=WAIT_S)
        assert caught.value is raised[-1]
    assert system.proxy().execute("ok", {"i": 1}).get(timeout=WAIT_S).value == {"i": 1}  # no slot kept


class KindUnreadable(ProviderError):
    """A provider SDK's error whose ``failure_kind`` looks itself up in a body that is gone."""

    @property  # type: ignore[override]
    def failure_kind(self) -> Any:
        raise KeyError("failure_kind")


class ClassUnreadable(Exception):
    """``isinstance`` asks ``__class__`` of an object whose type does not match: it raises."""

    @property  # type: ignore[override]
    def __class__(self) -> Any:
        raise RuntimeError("__class__ is not available")


class CauseUnreadable(Exception):
    @property  # type: ignore[override]
    def __cause__(self) -> Any:
        raise RuntimeError("no cause here")


class NamelessMeta(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name")


class Nameless(Exception, metaclass=NamelessMeta):
    def __str__(self) -> str:
        raise ValueError("no message either")


def _foreign(kind: str) -> BaseException:
    kinds = {"kind": KindUnreadable, "class": ClassUnreadable, "cause": CauseUnreadable, "name": Nameless}
    return kinds[kind]()


def _outcome(future: Any) -> Any:
    """The call's value, or whatever it raised, returned (an error raised while a foreign
    one was handled is not even printable: its chain names a class whose name raises)."""
    try:
        return future.get(timeout=WAIT_S).value
    except BaseException as exc:
        return exc


def _is_it(caught: BaseException, raised: list[BaseException]) -> bool:
    """The very error, or the stand-in that says it could not be read (``original``)."""
    try:
        stand_in = vars(caught).get("original")
    except BaseException:  # no __dict__, or one that raises (SystemExit too)
        stand_in = None
    return any(caught is e or stand_in is e for e in raised)


def _bad_calls_fail_alone(
    make_system: Any, read_receipts: Any, key_of: Any, make_error: Any, shape: str
) -> list[Any]:
    """Three calls whose tool raises ``make_error()`` (``shape``: alone, as a whole batch,
    or as members beside three good ones): each fails with that very error (or the
    stand-in naming it), the good ones are answered, every slot comes back. Returns the
    bad calls' receipt statuses (None: no receipt)."""
    raised: list[BaseException] = []

    def fail(input: Any) -> Any:
        if input.get("bad"):
            error = make_error()
            raised.append(error)
            return error
        return {"v": input["n"]}

    def fn(input: Any, ctx: Any) -> Any:
        out = fail(input)
        if type(out) is not dict:
            raise out
        return out

    def batch_fn(payload: Any, ctx: Any) -> Any:
        outs = [fail(i) for i in payload]
        if shape == "batch" and any(type(o) is not dict for o in outs):
            raise next(o for o in outs if type(o) is not dict)
        return outs

    batch = BatchStrategy(batch_fn=batch_fn, max_batch_size=10) if shape != "single" else None
    tool = Tool(tool_id="t", fn=fn, batch=batch, timeout_s=5.0)
    system = make_system([tool], policy=Policy(batch_grace_s=0.02, max_concurrency=2))
    bad = [{"bad": True, "n": i} for i in range(3)]
    goods = [{"n": i} for i in range(3)] if shape == "member" else []
    futures = system.proxy().execute_many("t", bad + goods)
    for future in futures[: len(bad)]:
        try:
            future.get(timeout=WAIT_S)
        except BaseException as caught:  # SystemExit too: whatever it is, it must be the call's
            assert _is_it(caught, raised), "not the tool's error"
        else:
            pytest.fail("the bad call succeeded")
    assert [f.get(timeout=WAIT_S).value for f in futures[len(bad) :]] == [{"v": i} for i in range(len(goods))]
    after = system.proxy().execute_many("t", [{"n": 10}, {"n": 11}, {"n": 12}])
    assert [f.get(timeout=WAIT_S).value for f in after] == [{"v": 10}, {"v": 11}, {"v": 12}]
    return [r.status if r is not None else None for r in read_receipts([key_of(tool, i) for i in bad])]


@pytest.mark.parametrize("kind", ["kind", "class", "cause", "name"])
@pytest.mark.parametrize("shape", ["single", "batch", "member"])
def test_an_error_whose_type_checks_raise_fails_its_call_alone(
    make_system: Any, read_receipts: Any, key_of: Any, kind: str, shape: str
) -> None:
    """Reads of a foreign error that raise (breaker round 3): a ProviderError whose
    ``failure_kind`` raises, one whose ``__class__`` (asked by ``isinstance``) or
    ``__cause__`` raises, a class whose metaclass's ``__name__`` raises. Each fails its
    own call (with the error, or a stand-in naming it), the others are answered, no slot
    is kept."""
    statuses = _bad_calls_fail_alone(make_system, read_receipts, key_of, lambda: _foreign(kind), shape)
    assert set(statuses) <= {ReceiptStatus.FAILED, ReceiptStatus.UNCERTAIN, ReceiptStatus.PENDING}, statuses


class TracebackUnreadable(Exception):
    """Its ``__traceback__`` is a property that raises (``raise`` still fills the slot)."""

    @property  # type: ignore[override]
    def __traceback__(self) -> Any:
        raise RuntimeError("no traceback here")

    @__traceback__.setter
    def __traceback__(self, value: Any) -> None:
        pass


class OwnWithTraceback(Exception):
    def with_traceback(self, tb: Any) -> Any:  # type: ignore[override]
        raise RuntimeError("with_traceback is not available")


class TruthUnreadable(Exception):
    def __bool__(self) -> bool:
        raise RuntimeError("no truth here")


class NoProblems(Exception):
    """An SDK error that is the sequence of its problems (none parsed: falsy), made with two
    arguments (``type(e)()`` raises TypeError)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.problems: list[str] = []

    def __len__(self) -> int:
        return len(self.problems)


class Impostor(Exception):
    """A proxy-style error whose ``__class__`` says it is a call's result."""

    @property  # type: ignore[override]
    def __class__(self) -> Any:
        from actors import ToolResult

        return ToolResult


class ThreadBound(Exception):
    """An SDK error bound to the thread (or greenlet) that made it: asked its ``__class__``
    on any other, it raises (where it was raised, every read of it is fine)."""

    def __init__(self) -> None:
        super().__init__("bound to its thread")
        self.born = threading.get_ident()

    @property  # type: ignore[override]
    def __class__(self) -> Any:
        if threading.get_ident() != vars(self)["born"]:
            raise RuntimeError("used off its thread")
        return type(self)


class DictExits(Exception):
    @property  # type: ignore[override]
    def __dict__(self) -> Any:
        raise SystemExit("no __dict__ here")


class Shifty(str):
    """Text whose own ``in`` raises."""

    def __contains__(self, part: object) -> bool:
        raise RuntimeError("no search here")


class ShiftyText(RuntimeError):
    def __str__(self) -> str:
        return Shifty("a shifty message")


def _odd(kind: str) -> BaseException:
    kinds: dict[str, Any] = {
        "traceback": TracebackUnreadable, "with_traceback": OwnWithTraceback, "truth": TruthUnreadable,
        "falsy": lambda: NoProblems(422, "unprocessable"), "impostor": Impostor, "thread": ThreadBound,
        "dict_exits": DictExits, "text": ShiftyText,
    }  # fmt: skip
    return kinds[kind]()  # type: ignore[no-any-return]


ODD = ["traceback", "with_traceback", "truth", "falsy", "impostor", "thread", "dict_exits", "text"]


@pytest.mark.parametrize("kind", ODD)
@pytest.mark.parametrize("shape", ["single", "batch", "member"])
def test_an_error_read_past_its_message_fails_its_call_alone(
    make_system: Any, read_receipts: Any, key_of: Any, kind: str, shape: str
) -> None:
    """Reads of a tool's error beyond its message and type (breaker round 4): its
    ``__traceback__`` (every future is failed with it), ``with_traceback`` and its truth
    (``future.get`` asked both: a falsy error was raised as a new ``type(e)()``), its
    ``__class__`` asked off the worker (an impostor that says it is a ToolResult was
    answered as the call's value; one bound to its thread raised on the actor), its
    ``__dict__`` raising SystemExit (the worker's nested-call check let it out, so the
    call was never told back), a message whose ``in`` raises (the interpreter-exit
    check). Each failed with another error, or hung its call and kept its slot (later
    calls too). Now each fails its call with the very error, recorded ``failed``."""
    statuses = _bad_calls_fail_alone(make_system, read_receipts, key_of, lambda: _odd(kind), shape)
    assert statuses == [ReceiptStatus.FAILED] * 3, statuses
