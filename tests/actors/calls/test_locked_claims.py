"""A claim that finds the store locked by another connection waits no longer than its
callers' ``timeout_s``: a SQLite file under another process's ``BEGIN EXCLUSIVE`` or a
Postgres table under ``LOCK TABLE``. The lock held past it answers the calls with
:class:`~stores.errors.StoreBusyError` (a StoreUnavailableError) long before SQLite's busy
timeout, nothing sent to the provider; a lock let go in time is ridden out. Real SQLite
files and a real Postgres, a schema of each test's own.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors import Policy, Tool
from actors.store.actor import LOCK_SLICE_S
from stores import (
    ClaimRequest,
    Owner,
    PostgresReceiptStore,
    SqliteReceiptStore,
    StoreBusyError,
    StoreUnavailableError,
)

from ..conftest import WAIT_S
from .test_lease_cleanup import PG_URL, pg_schema
from .test_locked_table import _table_locked

__all__ = ["pg_schema"]  # the fixture, used by name

# Every case waits out a lock and a call's timeout (1 s each, 5 s with paced turns): shared
# between the Python versions as the other waiting tests are (tests/conftest.py).
pytestmark = pytest.mark.waits

ORG = "org-a"
TIMEOUT_S = 1.0
"""The calls' own timeout, seconds (SQLite's busy timeout stays its default, 30 s)."""


@contextlib.contextmanager
def _file_locked(path: Path) -> Iterator[None]:
    """The SQLite file's write lock held by another connection until the block ends."""
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def _echo(runs: list[Any]) -> Tool:
    def echo(input: Any, ctx: Any) -> Any:
        runs.append(input)
        return {"echo": input["i"]}

    return Tool(tool_id="echo", fn=echo)


def _store(kind: str, tmp_path: Path, schema: str | None) -> Any:
    if kind == "sqlite":
        return SqliteReceiptStore(tmp_path / "receipts.db")
    return PostgresReceiptStore(PG_URL, schema=schema)


def _locked(kind: str, tmp_path: Path, schema: str | None) -> contextlib.AbstractContextManager[None]:
    return _file_locked(tmp_path / "receipts.db") if kind == "sqlite" else _table_locked(str(schema))


@pytest.fixture(params=["sqlite", "postgres"])
def kind_and_schema(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "sqlite":
        return "sqlite", None
    return "postgres", request.getfixturevalue("pg_schema")


@pytest.mark.parametrize("many", [False, True], ids=["execute", "execute_many"])
def test_a_lock_held_past_the_calls_timeout_answers_them_busy_within_it(
    make_system: Any, tmp_path: Path, kind_and_schema: tuple[str, str | None], many: bool
) -> None:
    kind, schema = kind_and_schema
    runs: list[Any] = []
    store = _store(kind, tmp_path, schema)
    system = make_system([_echo(runs)], store=store, policy=Policy(batch_grace_s=0.0))
    try:
        proxy = system.proxy()
        assert proxy.execute("echo", {"i": -1}).get(timeout=WAIT_S).value == {"echo": -1}
        inputs = [{"i": i} for i in range(20 if many else 1)]
        with _locked(kind, tmp_path, schema):
            started = time.monotonic()
            if many:
                futures = proxy.execute_many("echo", inputs, timeout_s=TIMEOUT_S)
            else:
                futures = [proxy.execute("echo", inputs[0], timeout_s=TIMEOUT_S)]
            errors = []
            for future in futures:
                with pytest.raises(StoreUnavailableError) as caught:
                    future.get(timeout=WAIT_S)
                errors.append(caught.value)
            answered_in = time.monotonic() - started
        assert answered_in < TIMEOUT_S + 1.5, answered_in  # not SQLite's 30 s busy timeout
        assert all(isinstance(error, StoreBusyError) for error in errors), errors
        assert "lock" in str(errors[0])
        assert len(runs) == 1  # nothing sent while the store was locked
        # the lock gone: the same calls claim and run, each once
        again = [proxy.execute("echo", i).get(timeout=WAIT_S).value for i in inputs]
        assert again == [{"echo": i["i"]} for i in inputs]
        assert len(runs) == 1 + len(inputs)
    finally:
        system.stop(timeout_s=WAIT_S)
        store.close()


def test_a_lock_let_go_within_the_calls_timeout_is_ridden_out(
    make_system: Any, tmp_path: Path, kind_and_schema: tuple[str, str | None]
) -> None:
    kind, schema = kind_and_schema
    runs: list[Any] = []
    store = _store(kind, tmp_path, schema)
    system = make_system([_echo(runs)], store=store)
    try:
        proxy = system.proxy()
        assert proxy.execute("echo", {"i": -1}).get(timeout=WAIT_S).value == {"echo": -1}
        with _locked(kind, tmp_path, schema):
            future = proxy.execute("echo", {"i": 1}, timeout_s=10.0)
            time.sleep(0.6)
            assert not future.done  # waiting in its claim
        assert future.get(timeout=WAIT_S).value == {"echo": 1}
        assert len(runs) == 2
    finally:
        system.stop(timeout_s=WAIT_S)
        store.close()


def test_the_stores_claim_waits_for_a_lock_no_longer_than_it_is_told(
    tmp_path: Path, kind_and_schema: tuple[str, str | None]
) -> None:
    kind, schema = kind_and_schema
    store = _store(kind, tmp_path, schema)
    request = ClaimRequest(key="k1", scope="s", tool_id="echo", input_hash="h")
    owner = Owner(run_id="r1")
    try:
        with _locked(kind, tmp_path, schema):
            started = time.monotonic()
            with pytest.raises(StoreBusyError, match="lock"):
                store.claim_many(ORG, [request], owner, lease_ttl_s=30.0, wait_s=0.3)
            assert time.monotonic() - started < 1.5
            released: list[Any] = []

            def claim() -> None:
                released.append(store.claim_many(ORG, [request], owner, lease_ttl_s=30.0, wait_s=5.0))

            waiting = threading.Thread(target=claim)
            waiting.start()
            time.sleep(0.3)
            assert waiting.is_alive()  # still waiting for the lock
        waiting.join(WAIT_S)
        assert released and released[0][0].receipt.key == "k1"  # taken once it was let go
    finally:
        store.close()


def _answered_within(future: Any, bound_s: float) -> BaseException | Any:
    """The future's value or error, which must come within ``bound_s`` seconds."""
    try:
        return future.get(timeout=bound_s)
    except Exception as exc:
        if type(exc).__name__ == "Timeout":
            pytest.fail(f"no answer within {bound_s} s")
        return exc


def test_a_lock_taken_while_calls_wait_for_their_turn_is_bounded_by_their_timeout(
    make_system: Any, tmp_path: Path, kind_and_schema: tuple[str, str | None]
) -> None:
    """Claimed, then waiting for a paced turn when the lock comes: each running mark (and
    the release after it) rides the lock out for no longer than the calls' timeout from
    its request (a call's timeout runs from its send: its turn comes first, one a second
    here), never the store's 30 s; the first call is stored before the lock."""
    from actors import Pacing

    kind, schema = kind_and_schema
    runs: list[Any] = []
    store = _store(kind, tmp_path, schema)
    paced = Tool(tool_id="echo", fn=_echo(runs).fn, pacing=Pacing(rps=1.0, burst=1))
    system = make_system([paced], store=store, policy=Policy(batch_grace_s=0.0))
    try:
        proxy = system.proxy()
        inputs = [{"i": i} for i in range(3)]
        started = time.monotonic()
        futures = proxy.execute_many("echo", inputs, timeout_s=TIMEOUT_S)
        assert futures[0].get(timeout=WAIT_S).execution == "live"  # stored; the rest wait
        with _locked(kind, tmp_path, schema):
            bound_s = len(inputs) * (1.0 + TIMEOUT_S + 2 * LOCK_SLICE_S) + 1.0  # turns, marks, releases
            answers = [_answered_within(f, bound_s) for f in futures[1:]]
            answered_in = time.monotonic() - started
        assert answered_in < bound_s, answered_in  # not the store's 30 s bound
        assert len(runs) == len(set(map(str, runs))), runs  # nothing paid twice
        assert any(isinstance(a, StoreUnavailableError) for a in answers), answers
        # the lock gone: every call that was not answered live runs once
        again = [proxy.execute("echo", i).get(timeout=WAIT_S).value for i in inputs]
        assert again == [{"echo": i["i"]} for i in inputs]
        assert sorted(r["i"] for r in runs) == [0, 1, 2]
    finally:
        system.stop(timeout_s=WAIT_S)
        store.close()


@pytest.mark.parametrize("same_tool", [True, False], ids=["same-tool", "other-tool"])
def test_an_impatient_call_is_answered_at_its_own_timeout_behind_a_patient_claim(
    make_system: Any, tmp_path: Path, kind_and_schema: tuple[str, str | None], same_tool: bool
) -> None:
    kind, schema = kind_and_schema
    runs: list[Any] = []
    store = _store(kind, tmp_path, schema)
    tools = [_echo(runs), Tool(tool_id="other", fn=_echo(runs).fn)]
    system = make_system(tools, store=store, policy=Policy(batch_grace_s=0.0))
    try:
        proxy = system.proxy()
        assert proxy.execute("echo", {"i": -1}).get(timeout=WAIT_S).value == {"echo": -1}
        with _locked(kind, tmp_path, schema):
            patient = proxy.execute("echo", {"i": 1}, timeout_s=60.0)
            time.sleep(0.1)
            started = time.monotonic()
            impatient = proxy.execute("echo" if same_tool else "other", {"i": 2}, timeout_s=TIMEOUT_S)
            with pytest.raises(StoreUnavailableError):
                impatient.get(timeout=WAIT_S)
            answered_in = time.monotonic() - started
            assert not patient.done  # still riding the lock out
        assert answered_in < TIMEOUT_S + 1.5, answered_in
        assert patient.get(timeout=WAIT_S).value == {"echo": 1}
    finally:
        system.stop(timeout_s=WAIT_S)
        store.close()
