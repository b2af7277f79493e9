"""Fixtures of the dispatch system tests: real SQLite files, systems stopped at teardown.

* ``db_path``: the receipt file of the test (``tmp_path / "receipts.db"``).
* ``open_store``: opens a :class:`~stores.SqliteReceiptStore` on that file (a new
  instance each call, as a second host process would); every one is closed at teardown.
* ``make_system``: starts a :class:`~actors.DispatchSystem` on a store of that file;
  every system it made is stopped at teardown (before the stores are closed), so a
  failing test never leaves actors or worker threads running.
* ``recorder``: a thread-safe log of provider calls (tool functions run on worker
  threads, or greenlets under gevent) with waits that take a timeout, never a sleep.
* ``read_receipts``: reads receipts straight from the file with a fresh store.
* ``key_of``: the receipt key a system of this suite computes for a call.

Everything here works unchanged on plain threads and under gevent monkey-patching.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import DispatchSystem, Policy, RunInfo, Tool
from stores import Receipt, SqliteReceiptStore, receipt_key

WAIT_S = 10.0
"""Longest a test waits for anything (a future, an event); far above any expected time."""

ORG = "acme"
SCOPE = "enrich"


def until(condition: Callable[[], Any], what: str = "the condition", timeout: float = WAIT_S) -> None:
    """Poll ``condition()`` (bounded, yielding) until it holds; fails naming ``what``.
    For counts kept on other threads: under gevent the store's threads are native, and
    cannot set a greenlet's event."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        threading.Event().wait(0.005)


def outcome(future: Any, timeout: float = WAIT_S) -> Any:
    """A future's value, or the exception it raised."""
    try:
        return future.get(timeout=timeout)
    except Exception as exc:
        return exc


@attrs.frozen
class ProviderCall:
    """One recorded provider call."""

    name: str
    """Which tool function (or batch function) was called."""
    input: Any
    """The input (or batch payload) it received."""
    ctx: Any
    """The ToolContext it received."""
    at: float
    """``time.monotonic()`` when it started."""


class Recorder:
    """Thread-safe log of provider calls, with a running-at-once gauge.

    Use :meth:`record` at the top of a tool function, or :meth:`running` around its
    body to also measure how many ran at once (``max_running``).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.calls: list[ProviderCall] = []
        self.now_running = 0
        self.max_running = 0

    def record(self, name: str, input: Any, ctx: Any) -> ProviderCall:
        """Log a call (returns it)."""
        call = ProviderCall(name, input, ctx, time.monotonic())
        with self._cond:
            self.calls.append(call)
            self._cond.notify_all()
        return call

    def running(self, name: str, input: Any, ctx: Any) -> _Running:
        """Context manager: log the call and count it as running until the block ends."""
        return _Running(self, name, input, ctx)

    def count(self, name: str | None = None) -> int:
        """Calls logged (of ``name`` only, when given)."""
        with self._cond:
            return sum(1 for c in self.calls if name is None or c.name == name)

    def of(self, name: str) -> list[ProviderCall]:
        """The calls of ``name``, in call order."""
        with self._cond:
            return [c for c in self.calls if c.name == name]

    def wait_for(self, n: int, name: str | None = None, timeout: float = WAIT_S) -> None:
        """Block until at least ``n`` calls (of ``name``) are logged.

        Raises:
            AssertionError: not reached within ``timeout`` seconds.
        """
        with self._cond:
            ok = self._cond.wait_for(
                lambda: sum(1 for c in self.calls if name is None or c.name == name) >= n, timeout
            )
        assert ok, f"expected {n} provider calls of {name or 'any tool'}, saw {self.count(name)}"


class _Running:
    def __init__(self, recorder: Recorder, name: str, input: Any, ctx: Any) -> None:
        self.recorder, self.name, self.input, self.ctx = recorder, name, input, ctx

    def __enter__(self) -> ProviderCall:
        rec = self.recorder
        call = rec.record(self.name, self.input, self.ctx)
        with rec._cond:
            rec.now_running += 1
            rec.max_running = max(rec.max_running, rec.now_running)
        return call

    def __exit__(self, *exc: object) -> None:
        rec = self.recorder
        with rec._cond:
            rec.now_running -= 1


@pytest.fixture
def recorder() -> Recorder:
    """A fresh provider-call recorder."""
    return Recorder()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """The test's receipt file."""
    return tmp_path / "receipts.db"


@pytest.fixture
def open_store(db_path: Path) -> Iterator[Callable[..., SqliteReceiptStore]]:
    """``open_store(**kwargs)`` opens a new store instance on ``db_path``; all closed at teardown."""
    opened: list[SqliteReceiptStore] = []

    def open_(**kwargs: Any) -> SqliteReceiptStore:
        store = SqliteReceiptStore(db_path, **kwargs)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


class MakeSystem:
    """Starts dispatch systems on the test's receipt file and remembers them."""

    def __init__(self, open_store: Callable[..., SqliteReceiptStore]) -> None:
        self._open_store = open_store
        self.systems: list[DispatchSystem] = []

    def __call__(
        self,
        tools: Sequence[Tool],
        *,
        run_id: str = "r1",
        policy: Policy | None = None,
        store: SqliteReceiptStore | None = None,
        org_id: str = ORG,
        scope: str = SCOPE,
    ) -> DispatchSystem:
        """Start a system (default policy: batch grace 0.05 s).

        Each system gets its own store instance on the file unless ``store`` is given.
        """
        if policy is None:
            policy = Policy(batch_grace_s=0.05)
        system = DispatchSystem.start(
            tools=tools,
            store=store if store is not None else self._open_store(),
            run=RunInfo(run_id=run_id, org_id=org_id, scope=scope),
            policy=policy,
        )
        self.systems.append(system)
        return system

    def stop_all(self) -> None:
        errors = []
        for system in reversed(self.systems):
            try:
                system.stop(timeout_s=WAIT_S)
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def make_system(open_store: Callable[..., SqliteReceiptStore]) -> Iterator[MakeSystem]:
    """``make_system(tools, run_id=..., policy=..., store=...)``; every system is stopped at teardown."""
    factory = MakeSystem(open_store)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def read_receipts(
    open_store: Callable[..., SqliteReceiptStore],
) -> Callable[[Sequence[str]], list[Receipt | None]]:
    """``read_receipts(keys)``: the receipts of ``keys`` in the file (None if missing)."""

    def read(keys: Sequence[str], org_id: str = ORG) -> list[Receipt | None]:
        store = open_store()
        try:
            return store.get_many(org_id, list(keys))
        finally:
            store.close()

    return read


def _key_of(tool: Tool, input: Any, *, digest: str = "", org_id: str = ORG, scope: str = SCOPE) -> str:
    return receipt_key(
        org_id=org_id,
        scope=scope,
        tool_id=tool.tool_id,
        input=input,
        credential_scope_digest=digest,
        version=tool.version,
        stale_after_s=None,
        ignore_fields=tool.non_semantic_fields,
    )


@pytest.fixture
def key_of() -> Callable[..., str]:
    """``key_of(tool, input, digest="")``: the receipt key a system of this suite computes
    for that call (org ``acme``, scope ``enrich``, the tool's version, no staleness)."""
    return _key_of


class RecordedReply:
    """A reply slot for requests told to an actor (``set`` / ``set_exception``), recording
    what it got; ``done`` is set once answered."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def set(self, value: Any = None) -> None:
        self.value = value
        self.done.set()

    def set_exception(self, exc_info: Any = None) -> None:
        self.error = exc_info[1]
        self.done.set()
