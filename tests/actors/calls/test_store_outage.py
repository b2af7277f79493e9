"""Calls ride out an outage of the receipt store within their own timeout
(actors/store/outage.py): claims, reads while waiting on another owner, mark-running and
failure records are tried again, as completion writes are on their ladder, and the
system's ``stats()["outages"]`` names the outage with its duration.

A real SQLite file (and the test Postgres for a claim whose connection drops after
COMMIT) behind a store whose chosen operations meet an outage: the next N calls raise
:class:`~stores.StoreUnavailableError` (before touching the file, or after committing:
the answer lost with the connection), or every call does for a while. The lease TTL is
two minutes, so a claim that waited on its own lease could not answer in time. Both
runtimes.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors import CallCancelledError, Pacing, Policy, Tool
from stores import (
    ClaimRequest,
    Completion,
    LeaseRef,
    Owner,
    ReceiptStatus,
    SqliteReceiptStore,
    StoreUnavailableError,
)
from stores.keys import key_and_input_hash

WAIT_S = 15.0
POLICY = Policy(batch_grace_s=0.01, lease_ttl_s=120.0, receipt_poll_max_s=0.05)
OPS = (
    "claim_many", "get_many", "mark_running_many", "fail_many", "mark_uncertain_many", "release",
    "complete_many", "write_together", "purge_epoch", "read_reusable", "resolve",
)  # fmt: skip
"""The store's operations an outage meets."""


class Away:
    """The outage a store meets: the next ``down[op]`` calls of ``op`` raise, or every call
    does until ``until`` (monotonic); ``after_commit``: the operation commits first."""

    def __init__(self) -> None:
        self.down: collections.Counter[str] = collections.Counter()
        self.until = 0.0
        self.after_commit = False
        self.failed: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def away_for(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def call(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            fails = self.down[op] > 0 or time.monotonic() < self.until
            if self.down[op] > 0:
                self.down[op] -= 1
            if fails:
                self.failed[op] += 1
        if not fails:
            return fn(*args, **kwargs)
        if self.after_commit:
            fn(*args, **kwargs)
        raise StoreUnavailableError(f"injected: the connection to the store was lost during {op}")


def _meets(base: type) -> type:
    """``base`` (a store class) whose operations of :data:`OPS` go through ``self.away``."""

    def wrap(op: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self.away.call(op, getattr(super(cls, self), op), *args, **kwargs)

        method.__name__ = op
        return method

    cls = type(f"AwayAt{base.__name__}", (base,), {op: wrap(op) for op in OPS})
    return cls


AwaySqlite = _meets(SqliteReceiptStore)


@pytest.fixture
def away_store(db_path: Path) -> Iterator[Any]:
    store = AwaySqlite(db_path)
    store.away = Away()
    try:
        yield store
    finally:
        store.close()


def _counting(runs: list[Any], **tool: Any) -> Tool:
    def fn(input: Any, ctx: Any) -> Any:
        runs.append(input)
        return {"ok": input["x"]}

    return Tool(tool_id="api", fn=fn, **tool)


def _outage(system: Any) -> dict[str, Any]:
    """The store's outages of this test as one: the first's cause, every failure counted.

    An outage ends at the store's next answer to any operation, so an injected failure of
    one operation may count as several outages when another operation (a heartbeat's
    renewal, a read) is answered between its tries."""
    outages = system.stats()["outages"]
    assert outages
    for outage in outages:
        assert outage["service"] == "receipt store"
        assert not outage["ongoing"]
        assert outage["duration_s"] >= 0.0
    return {**outages[0], "failures": sum(o["failures"] for o in outages)}


@pytest.mark.parametrize("after_commit", [False, True], ids=["before", "after COMMIT"])
def test_a_claim_that_meets_an_outage_is_tried_again_and_runs_once(
    make_system: Any, away_store: Any, read_receipts: Any, key_of: Any, after_commit: bool
) -> None:
    runs: list[Any] = []
    tool = _counting(runs)
    system = make_system([tool], policy=POLICY, store=away_store)
    away_store.away.after_commit = after_commit
    away_store.away.down["claim_many"] = 3
    result = system.proxy().execute("api", {"x": 1}).get(timeout=WAIT_S)
    assert (result.value, result.execution) == ({"ok": 1}, "live")
    assert runs == [{"x": 1}]
    assert away_store.away.failed["claim_many"] == 3
    (receipt,) = read_receipts([key_of(tool, {"x": 1})])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.attempts == 1
    assert _outage(system)["failures"] == 3


def test_mark_running_that_meets_an_outage_is_tried_again_before_anything_is_sent(
    make_system: Any, away_store: Any
) -> None:
    runs: list[Any] = []
    # a stated rate: claimed queued, then marked running once admitted (not claimed into running)
    system = make_system([_counting(runs, pacing=Pacing(rps=1000.0))], policy=POLICY, store=away_store)
    away_store.away.down["mark_running_many"] = 3
    result = system.proxy().execute("api", {"x": 2}).get(timeout=WAIT_S)
    assert (result.value, result.execution) == ({"ok": 2}, "live")
    assert runs == [{"x": 2}]
    assert away_store.away.failed["mark_running_many"] == 3
    assert _outage(system)["failures"] == 3


@pytest.mark.waits
def test_a_failure_record_that_meets_an_outage_is_tried_again_and_trips_no_latch(
    make_system: Any, away_store: Any, read_receipts: Any, key_of: Any
) -> None:
    def broken(input: Any, ctx: Any) -> Any:
        away_store.away.away_for(0.5)  # the store goes away while the provider answers
        raise ValueError("the provider refused this input")

    tool = Tool(tool_id="api", fn=broken)
    system = make_system([tool], policy=POLICY, store=away_store)
    with pytest.raises(ValueError, match="refused this input"):
        system.proxy().execute("api", {"x": 3}).get(timeout=WAIT_S)
    assert away_store.away.failed["fail_many"] >= 1
    stats = system.stats()
    assert not stats["latch_tripped"]
    (receipt,) = read_receipts([key_of(tool, {"x": 3})])
    assert receipt.status is ReceiptStatus.FAILED
    assert "refused this input" in (receipt.error or "")
    assert _outage(system)["failures"] >= 1


@pytest.mark.waits
def test_a_wait_on_another_owner_rides_out_an_outage_and_takes_its_output(
    make_system: Any, away_store: Any, open_store: Any
) -> None:
    """A poll of a call waiting on another worker's receipt meets the outage: it is held
    until the store answers (before, every failed poll counted, and the re-claim made every
    8 polls failed the call at once); the call takes the output that worker stored meanwhile."""
    runs: list[Any] = []
    tool = _counting(runs)
    key, input_hash = key_and_input_hash(
        org_id="acme", scope="enrich", tool_id=tool.tool_id, input={"x": 4}, version=tool.version
    )
    other = open_store()
    other_owner = Owner("other-run", 1)
    (claim,) = other.claim_many(
        "acme", [ClaimRequest(key, "enrich", "api", input_hash)], other_owner, lease_ttl_s=120
    )
    system = make_system([tool], policy=POLICY, store=away_store)
    future = system.proxy().execute("api", {"x": 4})
    _until(lambda: system.stats()["waiting_on_owner"] == 1, "the call waiting on the other owner")
    away_store.away.away_for(1.5)  # long enough for 8 polls: a re-claim would meet it
    _until(lambda: away_store.away.failed["get_many"] >= 1, "a poll meeting the outage")
    lease = LeaseRef(key, claim.receipt.lease_id or "")
    assert other.mark_running_many("acme", [lease], other_owner).ok
    done = Completion(key, claim.receipt.lease_id or "", {"ok": "theirs"})
    assert other.complete_many("acme", [done], other_owner).ok
    result = future.get(timeout=WAIT_S)
    assert result.value == {"ok": "theirs"} and result.execution in ("in_flight", "cached")
    assert runs == []
    assert _outage(system)["failures"] >= 1


def test_an_outage_longer_than_the_call_timeout_fails_it_naming_the_outage_and_sends_nothing(
    make_system: Any, away_store: Any
) -> None:
    runs: list[Any] = []
    system = make_system([_counting(runs)], policy=POLICY, store=away_store)
    away_store.away.away_for(600.0)
    with pytest.raises(
        StoreUnavailableError, match=r"unavailable for \d+\.\d s .*attempts within this call's"
    ):
        system.proxy().execute("api", {"x": 5}, timeout_s=0.5).get(timeout=WAIT_S)
    assert runs == []
    assert away_store.away.failed["claim_many"] > 1  # tried again within the call's own timeout
    (outage,) = system.stats()["outages"]
    assert outage["ongoing"] and outage["failures"] >= away_store.away.failed["claim_many"]
    away_store.away.until = 0.0
    assert system.proxy().execute("api", {"x": 5}).get(timeout=WAIT_S).execution == "live"
    assert not system.stats()["outages"][0]["ongoing"]


def test_a_stop_during_an_outage_answers_calls_held_for_the_store(make_system: Any, away_store: Any) -> None:
    """A claim held for the store within a long timeout does not hold the stop: the call is
    answered when the system stops (cancelled, or the store's error), nothing sent."""
    runs: list[Any] = []
    system = make_system([_counting(runs)], policy=POLICY, store=away_store)
    away_store.away.down["claim_many"] = 10**6
    future = system.proxy().execute("api", {"x": 6}, timeout_s=600.0)
    _until(lambda: away_store.away.failed["claim_many"] >= 2, "the claim tried again")
    system.stop(timeout_s=WAIT_S)
    with pytest.raises((CallCancelledError, StoreUnavailableError)):
        future.get(timeout=WAIT_S)
    assert runs == []


# -- Postgres: a claim into running whose connection drops after it committed ------------

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


def test_a_postgres_claim_into_running_lost_after_commit_is_taken_as_its_own(
    make_system: Any, pg_schema: str
) -> None:
    """Claimed straight into running, committed, answer lost: the claim tried again is that
    claim (same lease ids), not another owner's running receipt to wait on (or, once its
    lease lapsed, an uncertain one)."""
    from stores import PostgresReceiptStore

    store = _meets(PostgresReceiptStore)(PG_URL, schema=pg_schema)
    store.away = Away()
    try:
        runs: list[Any] = []
        system = make_system([_counting(runs)], policy=POLICY, store=store)
        store.away.after_commit = True
        store.away.down["claim_many"] = 2
        result = system.proxy().execute("api", {"x": 7}).get(timeout=WAIT_S)
        assert (result.value, result.execution) == ({"ok": 7}, "live")
        assert runs == [{"x": 7}]
        rows = store.query("SELECT status, attempts FROM receipts")
        assert [(r["status"], r["attempts"]) for r in rows] == [("completed", 1)]
        assert _outage(system)["failures"] == 2
    finally:
        store.close()


def _until(condition: Any, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        threading.Event().wait(0.01)


def test_a_front_door_read_that_meets_an_outage_counts_it_and_the_calls_go_on(
    make_system: Any, away_store: Any
) -> None:
    """Many calls at once are first read on the caller's thread (a cold rerun answered
    without the actors); that read meeting the outage counts in it, and the calls go on to
    their claims, which ride it out."""
    runs: list[Any] = []
    no_memo = attrs.evolve(POLICY, memo_max_bytes=0)  # nothing else reads the store meanwhile
    system = make_system([_counting(runs)], policy=no_memo, store=away_store)
    away_store.away.away_for(0.3)
    futures = system.proxy().execute_many("api", [{"x": i} for i in range(40)])
    assert [f.get(timeout=WAIT_S).value for f in futures] == [{"ok": i} for i in range(40)]
    assert away_store.away.failed["read_reusable"] == 1
    assert sorted(r["x"] for r in runs) == list(range(40))
    outage = _outage(system)
    assert "during read_reusable" in outage["cause"]  # the front door met it first
    assert outage["failures"] >= 2  # the read and the claims


@pytest.mark.waits
@pytest.mark.parametrize("b_after", ["the first failure", "nothing"])
def test_a_call_drained_while_a_longer_claim_rides_out_an_outage_fails_at_its_own_timeout(
    make_system: Any, away_store: Any, b_after: str
) -> None:
    runs: list[Any] = []
    system = make_system([_counting(runs)], policy=POLICY, store=away_store)
    away_store.away.away_for(600.0)
    proxy = system.proxy()
    a = proxy.execute("api", {"x": 1}, timeout_s=6.0)  # a's claim rides the outage out for 6 s
    if b_after == "the first failure":
        _until(lambda: away_store.away.failed["claim_many"] >= 1, "a's claim meeting the outage")
    start = time.monotonic()
    b = proxy.execute("api", {"x": 2}, timeout_s=0.5)  # drained while a's claim is out
    with pytest.raises(StoreUnavailableError):
        b.get(timeout=WAIT_S)
    took = time.monotonic() - start
    assert took < 3.0, f"b (timeout_s=0.5) was answered after {took:.1f} s, a's patience"
    with pytest.raises(StoreUnavailableError):
        a.get(timeout=WAIT_S)
    assert runs == []
