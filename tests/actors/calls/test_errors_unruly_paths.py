"""Errors whose reads misbehave, met on the paths past a plain call: in-call retries, a
batch answer split by id, an output's check, the reconcile hook, the credentials
function, a nested call's error passed on, the salvage of a paid answer and the
recording of a failure. Each fails its own call alone, with the very error raised.
Real systems on SQLite files, both runtimes.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from actors import (
    AuthScopeChangedError,
    BatchStrategy,
    DispatchError,
    InvalidOutputError,
    Policy,
    ReceiptPersistenceError,
    Tool,
    UncertainOutcomeError,
)
from actors.errors import type_name
from stores import ReceiptStatus, SqliteReceiptStore

from ..conftest import WAIT_S
from .test_errors_unruly import (
    BodyError,
    Nameless,
    NamelessMeta,
    TracebackUnreadable,
    _odd,
    _outcome,
)


class BusyTruthUnreadable(TimeoutError):
    """A transient error (retried in-call by a retry-safe tool) whose truth raises."""

    def __bool__(self) -> bool:
        raise RuntimeError("no truth here")


def test_a_retried_error_whose_truth_raises_ends_its_call_at_its_deadline(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    """A retry-safe tool's transient error, kept as the unit's last error while the retry
    backs off, is its outcome when the deadline passes first; ``last_error or error``
    asked its truth on the actor, so the call hung and kept its slot."""
    raised: list[BaseException] = []

    def fn(input: Any, ctx: Any) -> Any:
        if input.get("bad"):
            raised.append(BusyTruthUnreadable("busy"))
            raise raised[-1]
        return {"v": input["n"]}

    tool = Tool(tool_id="t", fn=fn, retry_safe=True, timeout_s=0.3)
    system = make_system([tool], policy=Policy(batch_grace_s=0.0, max_concurrency=1, retry_backoff_s=30.0))
    with pytest.raises(BusyTruthUnreadable) as caught:
        system.proxy().execute("t", {"bad": True, "n": 0}).get(timeout=WAIT_S)
    assert caught.value is raised[0] and len(raised) == 1  # its deadline came before the retry
    after = system.proxy().execute_many("t", [{"n": 1}, {"n": 2}])  # its one slot came back
    assert [f.get(timeout=WAIT_S).value for f in after] == [{"v": 1}, {"v": 2}]
    (receipt,) = read_receipts([key_of(tool, {"bad": True, "n": 0})])
    assert receipt is not None and receipt.status is ReceiptStatus.FAILED


class LookupExits(TimeoutError):
    """A transient error whose ``__getattr__`` (asked for what it lacks) raises SystemExit."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise SystemExit(f"no {name} here")


def test_a_transient_error_whose_lookups_exit_is_retried_then_fails_its_call_alone(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    """Whether a retry-safe tool's transient error is retried in-call is read from its
    ``retry_in_call``; the lookup's SystemExit went through (reads caught Exception only)
    and ended the tool queue actor: the call failed as if the dispatcher had stopped, and
    the tool took no other call."""
    raised: list[BaseException] = []

    def fn(input: Any, ctx: Any) -> Any:
        if input.get("bad"):
            raised.append(LookupExits("read timed out"))
            raise raised[-1]
        return {"v": input["n"]}

    tool = Tool(tool_id="t", fn=fn, retry_safe=True, timeout_s=5.0)
    system = make_system([tool], policy=Policy(batch_grace_s=0.0, retry_backoff_s=0.01))
    got = _outcome(system.proxy().execute("t", {"bad": True, "n": 0}))
    assert got is raised[-1] and len(raised) == 3, type_name(got)  # retried (3 attempts), then told
    after = system.proxy().execute_many("t", [{"n": 1}, {"n": 2}])
    assert [f.get(timeout=WAIT_S).value for f in after] == [{"v": 1}, {"v": 2}]
    (receipt,) = read_receipts([key_of(tool, {"bad": True, "n": 0})])
    assert receipt is not None and receipt.status is ReceiptStatus.FAILED


def test_a_member_error_matched_by_id_whose_lookup_raises_fails_its_member_alone(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    """Split by id (``input_id``/``result_id``), a member's error is matched by its own
    ``input_id``; an SDK error that looks names up in its body raised KeyError there
    (``getattr`` catches only AttributeError), and the whole batch failed with it."""
    raised: list[BaseException] = []

    def batch_fn(payload: Any, ctx: Any) -> Any:
        out: list[Any] = []
        for i in reversed(payload):  # answered in another order: matched by id
            if i.get("bad"):
                raised.append(BodyError({"message": "no such record", "code": 404}))
                out.append(raised[-1])
            else:
                out.append({"id": i["n"], "v": i["n"]})
        return out

    batch = BatchStrategy(
        batch_fn=batch_fn, max_batch_size=10, input_id=lambda i: i["n"], result_id=lambda r: r["id"]
    )
    tool = Tool(tool_id="t", fn=lambda i, c: {"id": i["n"], "v": i["n"]}, batch=batch)
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    inputs = [{"n": 0}, {"n": 1, "bad": True}, {"n": 2}]
    futures = system.proxy().execute_many("t", inputs)
    with pytest.raises(BodyError) as caught:
        futures[1].get(timeout=WAIT_S)
    assert caught.value is raised[0]
    assert [futures[i].get(timeout=WAIT_S).value for i in (0, 2)] == [{"id": 0, "v": 0}, {"id": 2, "v": 2}]
    statuses = [r.status if r else None for r in read_receipts([key_of(tool, i) for i in inputs])]
    assert statuses == [ReceiptStatus.COMPLETED, ReceiptStatus.FAILED, ReceiptStatus.COMPLETED]


class UnnamedKey:
    """A dict key that is not a string (refused as output) whose ``repr`` raises an error
    whose class's name cannot be read."""

    def __repr__(self) -> str:
        raise Nameless()

    def __hash__(self) -> int:
        return 1


def test_an_output_whose_check_raises_an_unnamed_error_fails_its_member_alone(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    """A member's output is checked on the worker; an error it raised there was described
    by ``type(exc).__name__``, which raised (its metaclass's), so every member of the
    batch failed with that and their paid outputs were never stored."""

    def one(i: Any) -> Any:
        return {UnnamedKey(): 1} if i.get("bad") else {"v": i["n"]}

    batch = BatchStrategy(batch_fn=lambda payload, ctx: [one(i) for i in payload], max_batch_size=10)
    tool = Tool(tool_id="t", fn=lambda i, c: one(i), batch=batch)
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    inputs = [{"n": 0}, {"n": 1, "bad": True}, {"n": 2}]
    outcomes = [_outcome(f) for f in system.proxy().execute_many("t", inputs)]
    assert type(outcomes[1]) is InvalidOutputError, type_name(outcomes[1])
    assert "cannot be serialised: Nameless" in str(outcomes[1])
    assert [outcomes[i] for i in (0, 2)] == [{"v": 0}, {"v": 2}]
    statuses = [r.status if r else None for r in read_receipts([key_of(tool, i) for i in inputs])]
    assert statuses == [ReceiptStatus.COMPLETED, ReceiptStatus.FAILED, ReceiptStatus.COMPLETED]


@pytest.mark.parametrize("where", ["hook", "value"])
def test_a_reconcile_hooks_unreadable_error_answers_its_call(
    make_system: Any, read_receipts: Any, key_of: Any, where: str
) -> None:
    """The reconcile hook is the tool's code too: its error was handed over with
    ``exc.__traceback__`` (a property that raises: the reconcile was never answered),
    and an error its value raised when checked was named by ``type(exc).__name__``
    (which raised on the actor). Either way the call hung; now it fails as uncertain
    (the hook failed) or as an output that cannot be stored (the value)."""
    sent = {"n": 0}

    def fn(i: Any, ctx: Any) -> Any:
        sent["n"] += 1
        if i.get("unsure") and sent["n"] == 1:
            raise TimeoutError("read timed out after sending")  # not retry-safe: uncertain
        return {"v": i}

    def reconcile(i: Any, ctx: Any) -> Any:
        if where == "hook":
            raise TracebackUnreadable("the provider's status page is down")
        return {UnnamedKey(): 1}

    tool = Tool(tool_id="t", fn=fn, retry_safe=False, reconcile=reconcile, timeout_s=5.0)
    system = make_system([tool])
    with pytest.raises(TimeoutError):
        system.proxy().execute("t", {"unsure": 1}).get(timeout=WAIT_S)
    expected = UncertainOutcomeError if where == "hook" else InvalidOutputError
    with pytest.raises(expected):
        system.proxy().execute("t", {"unsure": 1}).get(timeout=WAIT_S)
    assert system.proxy().execute("t", {"b": 1}).get(timeout=WAIT_S).value == {"v": {"b": 1}}
    (receipt,) = read_receipts([key_of(tool, {"unsure": 1})])
    assert receipt is not None and receipt.status is ReceiptStatus.UNCERTAIN  # never re-run silently


class NamelessExit(SystemExit, metaclass=NamelessMeta):
    """A SystemExit (told as a DispatchError naming it) whose class's name raises."""


@pytest.mark.parametrize("kind", ["traceback", "nameless_exit"])
@pytest.mark.parametrize("when", ["first", "requeue"])
def test_credentials_raising_an_unreadable_error_fail_that_call_alone(
    make_system: Any, read_receipts: Any, key_of: Any, kind: str, when: str
) -> None:
    """The credentials function is the tool's code too, asked at the call's first
    ``execute`` and again on the tool queue's thread when the tool says they changed. Its
    error's ``__traceback__`` (a property that raises) made ``execute`` itself raise, or
    the requeued call never be answered; a SystemExit was named by ``type(exc).__name__``
    (its metaclass's, which raised), so the call failed with that RuntimeError."""
    state = {"rotated": False}
    raised: list[BaseException] = []

    def credentials() -> str:
        if state["rotated"] or when == "first":
            raised.append(TracebackUnreadable("vault sealed") if kind == "traceback" else NamelessExit(3))
            raise raised[-1]
        return "creds-v1"

    def fn(i: Any, ctx: Any) -> Any:
        if i.get("rotate"):
            state["rotated"] = True
            raise AuthScopeChangedError("token scope changed")
        return {"v": i["n"]}

    tool = Tool(tool_id="crm", fn=fn, credentials=credentials)
    other = Tool(tool_id="other", fn=lambda i, c: {"v": i["n"]})
    system = make_system([tool, other])
    try:
        got = _outcome(system.proxy().execute("crm", {"rotate": True, "n": 0}))
    except BaseException as exc:  # (before: execute itself raised, where the call's future fails)
        got = exc
    if kind == "traceback":
        assert got is raised[0], type_name(got)
    else:
        assert type(got) is DispatchError and "(NamelessExit)" in str(got), f"{type_name(got)}: {got}"
    assert system.proxy().execute("other", {"n": 1}).get(timeout=WAIT_S).value == {"v": 1}
    (receipt,) = read_receipts([key_of(tool, {"rotate": True, "n": 0}, digest="creds-v1")])
    if when == "first":
        assert receipt is None  # refused before anything was claimed
    else:
        assert receipt is not None and receipt.status is ReceiptStatus.PENDING  # given back: not its fault


def _same(input: Any, ctx: Any) -> Any:
    return input


@pytest.mark.parametrize("kind", ["with_traceback", "truth", "falsy", "dict_exits"])
def test_a_nested_calls_odd_error_passed_on_fails_the_parent_with_it(make_system: Any, kind: str) -> None:
    """A nested call's error reaches the parent's function through ``future.get`` (its
    truth, its ``with_traceback``, its ``__dict__`` for the relayed mark): the parent
    got another error (a ``type(e)()`` TypeError, the method's RuntimeError, SystemExit)
    in place of the child's."""
    raised: list[BaseException] = []
    box: dict[str, Any] = {}

    def child(input: Any, ctx: Any) -> Any:
        raised.append(_odd(kind))
        raise raised[-1]

    def parent(input: Any, ctx: Any) -> Any:
        return box["proxy"].execute("child", input).get(timeout=WAIT_S)

    tools = [Tool(tool_id="child", fn=child), Tool(tool_id="parent", fn=parent), Tool(tool_id="ok", fn=_same)]
    system = make_system(tools, policy=Policy(batch_grace_s=0.0, max_concurrency=2))
    box["proxy"] = system.proxy()
    for i in range(3):
        try:
            system.proxy().execute("parent", {"i": i}).get(timeout=WAIT_S)
        except BaseException as caught:  # SystemExit too: it must be the child's error
            assert caught is raised[-1], f"{type(caught).__name__}: not the child's error"
        else:
            pytest.fail("the parent succeeded")
    assert system.proxy().execute("ok", {"i": 1}).get(timeout=WAIT_S).value == {"i": 1}  # no slot kept


class AnswersAnything(Exception):
    """An SDK error whose attributes read its response body (None for what is absent)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.body: dict[str, Any] = {"message": message}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "body":
            raise AttributeError(name)
        return self.body.get(name)


def test_a_tool_error_that_answers_any_name_is_not_salvaged_as_a_paid_output(
    make_system: Any, read_receipts: Any, key_of: Any, db_path: Any
) -> None:
    """Only our own unstorable-output errors carry a paid output (``raw_output``, set on
    the worker); a tool's error was asked too, and one answering any name (None) had
    that None written to the salvage file as the call's paid answer."""
    from actors.flusher.salvage import SalvageLog

    raised: list[BaseException] = []

    def fn(i: Any, ctx: Any) -> Any:
        if i.get("bad"):
            raised.append(AnswersAnything("quota exceeded for this key"))
            raise raised[-1]
        return {"v": i["n"]}

    tool = Tool(tool_id="t", fn=fn)
    system = make_system([tool])
    futures = system.proxy().execute_many("t", [{"bad": True, "n": 0}, {"n": 1}])
    with pytest.raises(AnswersAnything) as caught:
        futures[0].get(timeout=WAIT_S)
    assert caught.value is raised[0]
    assert futures[1].get(timeout=WAIT_S).value == {"v": 1}
    assert system.stats().get("salvaged", 0) == 0
    assert SalvageLog(str(db_path) + ".salvage.jsonl").entries() == []
    (receipt,) = read_receipts([key_of(tool, {"bad": True, "n": 0})])
    assert receipt is not None and receipt.status is ReceiptStatus.FAILED


class Unrepresentable(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("no repr here")


def test_a_failure_whose_repr_raises_is_answered_when_recording_it_fails(
    make_system: Any, db_path: Any, read_receipts: Any, key_of: Any
) -> None:
    """When the failure cannot be written, the caller hears a ReceiptPersistenceError
    holding the tool's error, described by ``{cause!r}``: a ``__repr__`` that raises
    raised on the actor, and the call was never answered (its slot kept)."""
    raised: list[BaseException] = []

    class FailuresUnwritable(SqliteReceiptStore):
        def fail_many(self, org_id: str, failures: Any, owner: Any) -> Any:
            raise sqlite3.OperationalError("disk I/O error")

    def fn(i: Any, ctx: Any) -> Any:
        if i.get("bad"):
            raised.append(Unrepresentable("quota exceeded for this key"))
            raise raised[-1]
        return {"v": i["n"]}

    tool = Tool(tool_id="t", fn=fn, timeout_s=5.0)
    store = FailuresUnwritable(db_path)
    try:
        system = make_system([tool], store=store)
        good = system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S)
        got = _outcome(system.proxy().execute("t", {"bad": True, "n": 0}))
        assert type(got) is ReceiptPersistenceError, type_name(got)
        assert "quota exceeded for this key" in str(got) and got.cause is raised[0]
        assert good.value == {"v": 1}
        system.stop(timeout_s=WAIT_S)
    finally:
        store.close()
    bad, done = read_receipts([key_of(tool, {"bad": True, "n": 0}), key_of(tool, {"n": 1})])
    assert done is not None and done.status is ReceiptStatus.COMPLETED
    assert bad is not None and bad.status is not ReceiptStatus.COMPLETED  # its failure was not written
