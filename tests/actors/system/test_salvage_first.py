"""A rerun replays the salvage file before it judges a receipt its last run salvaged
(issue 26): a run stopped while its completions could not be written (the store locked
by another connection, or away) salvages the paid outputs and leaves their receipts
``running`` under its lease; once that lease expired, the next run's claim judged them
lost (``uncertain`` for a tool that is not retry-safe) instead of completing them with
what was paid for. Real SQLite files; both runtimes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import Policy, Tool
from actors.flusher.salvage import SalvageLog, salvage_entry
from stores import (
    ClaimRequest,
    ReceiptStatus,
    SqliteReceiptStore,
    StoreUnavailableError,
)
from stores.keys import key_and_input_hash
from stores.types import Owner

WAIT_S = 15.0
ORG, SCOPE = "acme", "enrich"
LEASE_TTL_S = 1.0
POLICY = Policy(batch_grace_s=0.0, lease_ttl_s=LEASE_TTL_S, receipt_poll_max_s=0.05)


def _until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        threading.Event().wait(0.01)


class Outage:
    """Which operations of a store are away: ``writes`` (completions), or the next
    ``reads`` calls of ``get_many``."""

    def __init__(self) -> None:
        self.writes = threading.Event()
        self.reads = 0
        self.failed_reads = 0
        self.lock = threading.Lock()

    def read(self) -> None:
        with self.lock:
            if self.reads <= 0:
                return
            self.reads -= 1
            self.failed_reads += 1
        raise StoreUnavailableError("injected: the connection to the store was lost during get_many")


class AwayStore(SqliteReceiptStore):
    """A real store on the file whose completions (or reads) meet an injected outage."""

    outage: Outage

    def complete_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.outage.writes.is_set():
            raise StoreUnavailableError("injected: the store went away during complete_many")
        return super().complete_many(*args, **kwargs)

    def write_together(self, *args: Any, **kwargs: Any) -> Any:
        if self.outage.writes.is_set():
            raise StoreUnavailableError("injected: the store went away during write_together")
        return super().write_together(*args, **kwargs)

    def get_many(self, *args: Any, **kwargs: Any) -> Any:
        self.outage.read()
        return super().get_many(*args, **kwargs)


def _away(db_path: Path, opened: list[Any], **kwargs: Any) -> AwayStore:
    store = AwayStore(db_path, **kwargs)
    store.outage = Outage()
    opened.append(store)
    return store


@pytest.fixture
def stores_opened() -> Any:
    opened: list[Any] = []
    yield opened
    for store in opened:
        store.close()


class Provider:
    """A paid tool (not retry-safe) that counts its calls; while ``held``, a call waits
    for ``release`` before it answers."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.held = False
        self.release = threading.Event()
        self.called = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, input: Any, ctx: Any) -> Any:
        with self.lock:
            self.calls.append(input)
            answer = len(self.calls)
            held = self.held
        self.called.set()
        if held:
            assert self.release.wait(WAIT_S)
        return {"paid": input["n"], "answer": answer}

    def hold(self) -> None:
        with self.lock:
            self.held = True
        self.release.clear()
        self.called.clear()

    def answer(self) -> None:
        with self.lock:
            self.held = False
        self.release.set()

    def tool(self) -> Tool:
        return Tool(tool_id="charge", fn=self)


def _key(n: int) -> str:
    return key_and_input_hash(org_id=ORG, scope=SCOPE, tool_id="charge", input={"n": n}, version="1")[0]


def _receipt(db_path: Path, n: int) -> Any:
    with SqliteReceiptStore(db_path) as store:
        (receipt,) = store.get_many(ORG, [_key(n)])
    return receipt


def _lease_expired(db_path: Path, n: int) -> bool:
    receipt = _receipt(db_path, n)
    return receipt is not None and (receipt.lease_expires_at or 0.0) < time.time()


def _salvaged_keys(db_path: Path) -> set[str]:
    return {entry.receipt_key for entry in SalvageLog(f"{db_path}.salvage.jsonl").entries()}


def _first_run_salvages(
    make_system: Any, db_path: Path, provider: Provider, how: str, opened: list[Any], n: int = 7
) -> Any:
    """Run ``charge({"n": n})``; while its answer comes back the store cannot take the
    completion (``how``: ``locked`` by another connection, or ``away``), and the run is
    stopped: the paid output is salvaged, the receipt left running under its lease."""
    store = _away(db_path, opened, busy_timeout_s=0.2)
    system = make_system([provider.tool()], run_id="first", policy=POLICY, store=store)
    provider.hold()
    system.proxy().execute("charge", {"n": n})
    assert provider.called.wait(WAIT_S)
    blocker = None
    if how == "locked":
        blocker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")  # another worker's long write holds the lock
    else:
        store.outage.writes.set()
    try:
        provider.answer()
        system.stop(timeout_s=3.0)  # the ladder is given up: read back, then salvaged
        assert _key(n) in _salvaged_keys(db_path), "the paid output was not salvaged"
    finally:
        if blocker is not None:
            blocker.execute("ROLLBACK")
            blocker.close()
    receipt = _receipt(db_path, n)
    assert receipt.status is ReceiptStatus.RUNNING  # what the rerun meets
    return system


@pytest.mark.parametrize("how", ["locked", "away"])
@pytest.mark.waits
def test_a_rerun_completes_a_salvaged_receipt_whose_lease_expired_instead_of_uncertain(
    make_system: Any, db_path: Path, stores_opened: list[Any], how: str
) -> None:
    provider = Provider()
    _first_run_salvages(make_system, db_path, provider, how, stores_opened)
    _until(lambda: _lease_expired(db_path, 7), "the first run's lease to expire")
    rerun = make_system([provider.tool()], run_id="rerun", policy=POLICY)
    result = rerun.proxy().execute("charge", {"n": 7}).get(timeout=WAIT_S)
    assert result.value == {"paid": 7, "answer": 1}  # what the first run paid for
    assert len(provider.calls) == 1  # never bought again
    receipt = _receipt(db_path, 7)
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"paid": 7, "answer": 1}
    assert _key(7) not in _salvaged_keys(db_path)


@pytest.mark.waits
def test_a_running_system_sees_what_another_system_salvaged_after_it_started(
    make_system: Any, db_path: Path, stores_opened: list[Any]
) -> None:
    provider = Provider()
    # the file already holds an entry of another org: the sibling's first claim reads it
    SalvageLog(f"{db_path}.salvage.jsonl").append([
        salvage_entry(
            key="k", org_id="globex", scope=SCOPE, tool_id="charge", input_hash="h", output=0, attempts=1,
            first_error_at=None, error="StoreUnavailableError",
        )
    ])  # fmt: skip
    sibling = make_system([provider.tool()], run_id="sibling", policy=POLICY)
    assert sibling.proxy().execute("charge", {"n": 1}).get(timeout=WAIT_S).value["paid"] == 1
    _first_run_salvages(make_system, db_path, provider, "away", stores_opened)
    _until(lambda: _lease_expired(db_path, 7), "the first run's lease to expire")
    result = sibling.proxy().execute("charge", {"n": 7}).get(timeout=WAIT_S)
    assert result.value == {"paid": 7, "answer": 2}  # the other system's paid answer
    assert len(provider.calls) == 2
    assert _receipt(db_path, 7).status is ReceiptStatus.COMPLETED


@pytest.mark.waits
def test_a_replay_that_meets_an_outage_is_tried_again_with_the_claim(
    make_system: Any, db_path: Path, stores_opened: list[Any]
) -> None:
    provider = Provider()
    _first_run_salvages(make_system, db_path, provider, "away", stores_opened)
    _until(lambda: _lease_expired(db_path, 7), "the first run's lease to expire")
    store = _away(db_path, stores_opened)
    store.outage.reads = 3  # the replay's first reads meet the outage
    rerun = make_system([provider.tool()], run_id="rerun", policy=POLICY, store=store)
    result = rerun.proxy().execute("charge", {"n": 7}).get(timeout=WAIT_S)
    assert result.value == {"paid": 7, "answer": 1}
    assert store.outage.failed_reads == 3
    assert len(provider.calls) == 1
    assert sum(o["failures"] for o in rerun.stats()["outages"]) >= 3


@pytest.mark.parametrize("elsewhere", ["restored", "uncertain"])
@pytest.mark.waits
def test_a_salvaged_refresh_judged_by_a_worker_without_the_file_is_completed_with_it(
    make_system: Any, db_path: Path, stores_opened: list[Any], elsewhere: str
) -> None:
    """A worker that could not see the salvage file claimed the receipt of a refresh
    whose output was salvaged: it put the old output back (a retry-safe claim: the next
    run's plain read finds it completed) or recorded it uncertain for that refresh's
    lease. The next run answers with the refresh it paid for, never the output it
    replaced."""
    provider = Provider()
    first = make_system([provider.tool()], run_id="first", policy=POLICY)
    assert first.proxy().execute("charge", {"n": 7}).get(timeout=WAIT_S).value["answer"] == 1
    first.stop(timeout_s=WAIT_S)
    store = _away(db_path, stores_opened, busy_timeout_s=0.2)
    refresh = make_system([provider.tool()], run_id="refresh", policy=POLICY, store=store)
    provider.hold()
    refresh.proxy().execute("charge", {"n": 7}, force_refresh=True)
    assert provider.called.wait(WAIT_S)
    store.outage.writes.set()
    provider.answer()
    refresh.stop(timeout_s=3.0)
    assert _key(7) in _salvaged_keys(db_path)
    _until(lambda: _lease_expired(db_path, 7), "the refresh's lease to expire")
    with SqliteReceiptStore(db_path) as other:  # a worker elsewhere: the lost refresh is restored
        _, input_hash = key_and_input_hash(
            org_id=ORG, scope=SCOPE, tool_id="charge", input={"n": 7}, version="1"
        )
        retry_safe = elsewhere == "restored"
        (claim,) = other.claim_many(
            ORG, [ClaimRequest(_key(7), SCOPE, "charge", input_hash, retry_safe=retry_safe)],
            Owner("elsewhere", 1), lease_ttl_s=60.0,
        )  # fmt: skip
        status = ReceiptStatus.COMPLETED if retry_safe else ReceiptStatus.UNCERTAIN
        assert claim.receipt.status is status and claim.receipt.output["answer"] == 1
    rerun = make_system([provider.tool()], run_id="rerun", policy=POLICY)
    result = rerun.proxy().execute("charge", {"n": 7}).get(timeout=WAIT_S)
    assert result.value == {"paid": 7, "answer": 2}  # the refresh, paid for
    assert len(provider.calls) == 2
    receipt = _receipt(db_path, 7)
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"paid": 7, "answer": 2}


# -- Postgres: workers on one host share a salvage file (Policy.salvage_path) ------------

PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema of this test's own on the test Postgres, dropped after (skip without a
    server; fail in CI)."""
    try:
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=3).close()
    except Exception as exc:  # ImportError or psycopg.Error
        if os.environ.get("CI"):
            pytest.fail(f"Postgres unavailable in CI: {exc}", pytrace=False)
        pytest.skip(f"needs PostgreSQL at {PG_URL} (TOOLDISPATCH_TEST_PG): {exc}")
    schema = f"td_test_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.waits
def test_a_postgres_rerun_completes_what_a_worker_on_its_host_salvaged(
    make_system: Any, tmp_path: Path, pg_schema: str
) -> None:
    from stores import PostgresReceiptStore

    class AwayPostgres(PostgresReceiptStore):
        away = threading.Event()

        def complete_many(self, *args: Any, **kwargs: Any) -> Any:
            if self.away.is_set():
                raise StoreUnavailableError("injected: the connection was lost during complete_many")
            return super().complete_many(*args, **kwargs)

    policy = attrs.evolve(POLICY, salvage_path=str(tmp_path / "salvage.jsonl"))
    provider = Provider()
    first_store = AwayPostgres(PG_URL, schema=pg_schema)
    rerun_store = PostgresReceiptStore(PG_URL, schema=pg_schema)
    try:
        first = make_system([provider.tool()], run_id="first", policy=policy, store=first_store)
        provider.hold()
        first.proxy().execute("charge", {"n": 7})
        assert provider.called.wait(WAIT_S)
        first_store.away.set()
        provider.answer()
        first.stop(timeout_s=3.0)
        assert [e.receipt_key for e in SalvageLog(policy.salvage_path).entries()] == [_key(7)]

        def expired() -> bool:
            (receipt,) = rerun_store.get_many(ORG, [_key(7)])
            return receipt is not None and (receipt.lease_expires_at or 0.0) < time.time()

        _until(expired, "the first worker's lease to expire")
        rerun = make_system([provider.tool()], run_id="rerun", policy=policy, store=rerun_store)
        result = rerun.proxy().execute("charge", {"n": 7}).get(timeout=WAIT_S)
        assert result.value == {"paid": 7, "answer": 1}
        assert len(provider.calls) == 1
        (receipt,) = rerun_store.get_many(ORG, [_key(7)])
        assert receipt.status is ReceiptStatus.COMPLETED
    finally:
        for system in make_system.systems:
            system.stop(timeout_s=WAIT_S)
        first_store.close()
        rerun_store.close()
