"""A batch request of a tool that keeps no raw input (``Tool.keep_input`` not True) is
recorded without its members' inputs, and a takeover rebuilds it from the inputs of the
rerun's own calls of those members (matched by the input hash on each receipt): sent once
every member's input is at hand, under the key the provider saw; a member whose input
never comes within its callers' timeout makes the request impossible, and its members
uncertain. A real SQLite file; the first run's results are never stored (as when killed).
Both runtimes.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import BatchStrategy, Policy, Tool, UncertainOutcomeError
from stores import ReceiptStatus, SqliteReceiptStore, StoreError

from ..conftest import WAIT_S, outcome

POLICY = Policy(batch_grace_s=0.2, lease_ttl_s=1.0)


class _Provider:
    """Bills each batch request once per Idempotency-Key and replays its answer."""

    def __init__(self) -> None:
        self.answers: dict[str, list[Any]] = {}
        self.payloads: dict[str, list[list[Any]]] = {}
        self.lock = threading.Lock()

    def batch_fn(self, payload: list[Any], ctx: Any) -> list[Any]:
        with self.lock:
            self.payloads.setdefault(ctx.idempotency_key, []).append(list(payload))
            if ctx.idempotency_key not in self.answers:
                self.answers[ctx.idempotency_key] = [{"n": item["n"]} for item in payload]
            return self.answers[ctx.idempotency_key]


class _StoresNothing(SqliteReceiptStore):
    """The first run's store: its results are never written (as when killed)."""

    held = threading.Event()

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        self.held.wait(WAIT_S)
        raise StoreError("killed before this was stored")


def _tool(provider: _Provider) -> Tool:
    return Tool(
        tool_id="b", fn=lambda i, c: i, keep_input=False, retry_safe=True,
        batch=BatchStrategy(batch_fn=provider.batch_fn, max_batch_size=4),
    )  # fmt: skip


def _first_run_paid_and_lost(make_system: Any, db_path: Path, provider: _Provider) -> _StoresNothing:
    store = _StoresNothing(db_path)
    # its salvage file elsewhere: the rerun finds no output to replay (as after kill -9)
    policy = attrs.evolve(POLICY, salvage_path=str(db_path.parent / "elsewhere.salvage"))
    first = make_system([_tool(provider)], policy=policy, store=store, run_id="killed")
    first.proxy().execute_many("b", [{"n": n, "secret": f"s3cret-{n}"} for n in range(4)])
    deadline = time.monotonic() + WAIT_S
    while not provider.answers and time.monotonic() < deadline:  # the provider answered: paid
        time.sleep(0.01)
    assert provider.answers
    first.stop(timeout_s=0.2)  # its results never stored; its leases lapse
    time.sleep(1.5)
    return store


def _input(n: int) -> dict[str, Any]:
    return {"n": n, "secret": f"s3cret-{n}"}


@pytest.mark.waits
def test_a_request_without_recorded_inputs_is_rebuilt_from_the_reruns_calls(
    make_system: Any, db_path: Path
) -> None:
    provider = _Provider()
    store = _first_run_paid_and_lost(make_system, db_path, provider)
    try:
        (key,) = provider.answers
        rerun = make_system([_tool(provider)], policy=POLICY, run_id="rerun")
        results = [
            f.get(timeout=WAIT_S) for f in rerun.proxy().execute_many("b", [_input(n) for n in (3, 1, 0, 2)])
        ]
        assert list(provider.answers) == [key]  # the same request: replayed, not billed again
        assert [r.value for r in results] == [{"n": 3}, {"n": 1}, {"n": 0}, {"n": 2}]
        first, again = provider.payloads[key]
        assert again == first  # exactly the request first sent, in its order
        assert rerun.stats()["requests_resent"] == 1
    finally:
        _StoresNothing.held.set()
        store.close()
    stored = b"".join(p.read_bytes() for p in db_path.parent.glob(f"{db_path.name}*"))
    assert b"s3cret" not in stored  # nowhere in the file (nor its WAL)


@pytest.mark.waits
def test_a_request_waits_for_its_members_calls_that_come_later(make_system: Any, db_path: Path) -> None:
    provider = _Provider()
    store = _first_run_paid_and_lost(make_system, db_path, provider)
    try:
        (key,) = provider.answers
        rerun = make_system([_tool(provider)], policy=POLICY, run_id="rerun")
        proxy = rerun.proxy()
        early = proxy.execute_many("b", [_input(n) for n in (3, 1)])
        time.sleep(0.5)  # claimed with the whole request; it waits for the inputs of 0 and 2
        assert len(provider.payloads[key]) == 1
        late = proxy.execute_many("b", [_input(n) for n in (0, 2)])
        values = [f.get(timeout=WAIT_S).value for f in (*early, *late)]
        assert values == [{"n": 3}, {"n": 1}, {"n": 0}, {"n": 2}]
        assert list(provider.answers) == [key]
        first, again = provider.payloads[key]
        assert again == first
    finally:
        _StoresNothing.held.set()
        store.close()


@pytest.mark.waits
def test_a_request_whose_members_inputs_never_come_leaves_them_uncertain(
    make_system: Any, db_path: Path
) -> None:
    provider = _Provider()
    store = _first_run_paid_and_lost(make_system, db_path, provider)
    try:
        (key,) = provider.answers
        rerun = make_system([_tool(provider)], policy=POLICY, run_id="rerun")
        futures = rerun.proxy().execute_many("b", [_input(n) for n in (3, 1)], timeout_s=1.0)
        errors = [outcome(f, timeout=WAIT_S) for f in futures]
        for error in errors:
            assert isinstance(error, UncertainOutcomeError), error
            assert "never came" in str(error), error
        assert len(provider.payloads[key]) == 1  # never sent as another request
        rerun.stop(timeout_s=WAIT_S)
    finally:
        _StoresNothing.held.set()
        store.close()
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT status, error FROM receipts").fetchall()
    assert [status for status, _ in rows] == [ReceiptStatus.UNCERTAIN.value] * 4, rows
    assert all("never came" in error for _, error in rows), rows


@pytest.fixture(autouse=True)
def _reset_held() -> None:
    _StoresNothing.held = threading.Event()
