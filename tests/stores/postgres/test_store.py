"""Postgres receipt store: what the contract suite cannot show (issue 11 section 1).

The database clock decides expiry (a skewed worker clock changes nothing), one NOTIFY
per bulk write wakes waiters on other workers' receipts, a LISTEN connection that dies
is re-established, a connection killed mid-write raises cleanly and the store works on,
and ``open_store`` picks the backend from the URL. Every test works in its own schema
(``pg_schema``), dropped afterwards; without Postgres they skip (fail in CI).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest

import stores
from stores import (
    BatchRecord,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    LeaseRef,
    Money,
    Owner,
    ReceiptStatus,
    SchemaVersionError,
    SqliteReceiptStore,
    StoreUnavailableError,
    open_store,
)
from stores.sqlite.offload import gevent_active

from ..conftest import held_keys, wait_for, wait_settled

ORG = "org-a"
A, B = Owner("run-a"), Owner("run-b")


def requests(keys: list[str]) -> list[ClaimRequest]:
    return [ClaimRequest(k, "play", "tool", "h") for k in keys]


@pytest.fixture
def open_pg(pg_url: str, pg_schema: str) -> Iterator[Callable[..., Any]]:
    """``open_pg(**kw)``: a production store (database clock) in this test's schema."""
    opened: list[Any] = []

    def make(**kw: Any) -> Any:
        store = stores.PostgresReceiptStore(pg_url, schema=pg_schema, max_size=kw.pop("max_size", 3), **kw)
        opened.append(store)
        return store

    try:
        yield make
    finally:
        for store in opened:
            store.close()


def raw(pg_url: str) -> Any:
    import psycopg

    return psycopg.connect(pg_url, autocommit=True)


def leases_of(claims: list[Any]) -> list[LeaseRef]:
    return [LeaseRef(c.receipt.key, c.receipt.lease_id) for c in claims]


# -- the database clock ------------------------------------------------------------------


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0], ids=["client-behind", "client-ahead"])
def test_pg_expiry_judged_by_database_clock_not_client(
    open_pg: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    store = open_pg()
    live, expired = "live-key", "expired-key"
    assert store.claim_many(ORG, requests([live]), A, lease_ttl_s=300.0)[0].disposition.value == "claimed"
    # A lease whose expiry is already past on the server's clock.
    assert store.claim_many(ORG, requests([expired]), A, lease_ttl_s=-1.0)[0].disposition.value == "claimed"
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)  # this worker's clock is an hour off

    got = {
        c.receipt.key: c.disposition
        for c in store.claim_many(ORG, requests([live, expired]), B, lease_ttl_s=60)
    }

    assert got == {live: ClaimDisposition.RUNNING, expired: ClaimDisposition.CLAIMED}
    assert held_keys(store, ORG, [live]) == {live}  # still live by the server's clock


def test_pg_lease_times_are_server_times(open_pg: Callable[..., Any], pg_url: str) -> None:
    store = open_pg()
    with raw(pg_url) as conn:
        before = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()[0]
        (claim,) = store.claim_many(ORG, requests(["k"]), A, lease_ttl_s=60.0)
        after = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()[0]
    assert before <= claim.receipt.updated_at <= after
    assert claim.receipt.lease_expires_at == claim.receipt.updated_at + 60.0


# -- LISTEN/NOTIFY -------------------------------------------------------------------------


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # reported by the test
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_pg_waiter_woken_by_completion_on_another_store(open_pg: Callable[..., Any]) -> None:
    worker, waiter = open_pg(), open_pg()  # the waiter never polls: only a notification wakes it
    leases = leases_of(worker.claim_many(ORG, requests(["k1", "k2"]), A, lease_ttl_s=300.0))
    assert wait_settled(waiter, ORG, ["k1"], 0.0) == set()
    assert waiter.change_feed().wait_connected(10.0)
    thread, result = _in_thread(lambda: wait_settled(waiter, ORG, ["k1"], 20.0))
    wait_for(lambda: waiter.change_feed().waiting)  # the waiter has read "k1" (running) and now blocks

    assert worker.complete_many(ORG, [Completion(leases[0].key, leases[0].lease_id, "out")], A).ok

    thread.join(timeout=60.0)
    assert result == [{"k1"}]


def test_pg_one_notify_per_bulk_write(open_pg: Callable[..., Any], pg_url: str, pg_schema: str) -> None:
    store = open_pg()
    keys = [f"k{i}" for i in range(80)]
    leases = leases_of(store.claim_many(ORG, requests(keys), A, lease_ttl_s=300.0))
    channel = f"tooldispatch:{pg_schema}"

    def failed(some: list[LeaseRef]) -> list[Failure]:
        return [Failure(le.key, le.lease_id, "boom", FailureKind.TRANSIENT) for le in some]

    with raw(pg_url) as listener, raw(pg_url) as marker:
        listener.execute(f'LISTEN "{channel}"')
        assert store.mark_running_many(ORG, leases, A).ok  # ends no lease: no notification
        assert store.renew_leases(ORG, leases, A, lease_ttl_s=300.0).ok  # nor does this
        assert store.complete_many(ORG, [Completion(le.key, le.lease_id, 1) for le in leases[:20]], A).ok
        assert store.fail_many(ORG, failed(leases[20:40]), A).ok
        assert store.mark_uncertain_many(ORG, failed(leases[40:60]), A).ok
        assert store.release(ORG, leases[60:], A).ok
        assert not store.complete_many(ORG, [Completion(leases[0].key, "bogus", 1)], A).ok  # no change
        marker.execute("SELECT pg_notify(%s, 'end-marker')", (channel,))
        payloads = []
        for note in listener.notifies(timeout=60.0):
            if note.payload == "end-marker":
                break
            payloads.append(note.payload)
    assert payloads == [ORG] * 4  # one per bulk write that ended leases, not one per row


def test_pg_listener_reconnects_after_its_connection_dies(open_pg: Callable[..., Any], pg_url: str) -> None:
    worker, waiter = open_pg(), open_pg()  # the waiter never polls: only a notification wakes it
    first, second = leases_of(worker.claim_many(ORG, requests(["k1", "k2"]), A, lease_ttl_s=300.0))
    assert wait_settled(waiter, ORG, ["k1"], 0.0) == set()
    listener = waiter.change_feed()
    assert listener.wait_connected(10.0)
    thread, result = _in_thread(lambda: wait_settled(waiter, ORG, ["k1"], 20.0))
    wait_for(lambda: listener.waiting)  # the waiter has read "k1" (running) and now blocks
    with raw(pg_url) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (listener.backend_pid,)).fetchone()[0]
        # Completed while the listener may be down: the waiter still wakes (the listener
        # makes every waiter re-read when it loses or regains its connection).
        assert worker.complete_many(ORG, [Completion(first.key, first.lease_id, "out")], A).ok
    thread.join(timeout=60.0)
    assert result == [{"k1"}]
    wait_for(lambda: listener.reconnects)  # LISTEN re-established on a new connection...
    thread, result = _in_thread(lambda: wait_settled(waiter, ORG, ["k2"], 20.0))
    wait_for(lambda: listener.waiting)
    assert worker.complete_many(ORG, [Completion(second.key, second.lease_id, "out")], A).ok
    thread.join(timeout=60.0)
    assert result == [{"k2"}]  # ...which hears the next NOTIFY
    assert listener.reconnects == 1


# -- dropped connections ---------------------------------------------------------------------


def test_pg_connection_killed_mid_write_raises_and_store_recovers(
    open_pg: Callable[..., Any], pg_url: str, pg_schema: str
) -> None:
    store = open_pg(max_size=1)
    leases = leases_of(store.claim_many(ORG, requests(["k1", "k2"]), A, lease_ttl_s=300.0))
    completions = [Completion(le.key, le.lease_id, {"paid": True}) for le in leases]
    with raw(pg_url) as blocker, raw(pg_url) as admin:
        blocker.execute("BEGIN")
        blocker.execute(f'SELECT 1 FROM "{pg_schema}".receipts WHERE key = %s FOR UPDATE', ("k2",))
        thread, result = _in_thread(lambda: store.complete_many(ORG, completions, A))
        (pid,) = wait_for(
            lambda: admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (blocker.info.backend_pid,),
            ).fetchone()
        )  # the store's write is in flight, waiting on the row lock
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(timeout=60.0)
        blocker.execute("ROLLBACK")
    assert len(result) == 1 and isinstance(result[0], StoreUnavailableError), result
    assert [r.status for r in store.get_many(ORG, ["k1", "k2"])] == [
        ReceiptStatus.QUEUED
    ] * 2  # nothing half-done
    assert store.complete_many(ORG, completions, A).applied == ("k1", "k2")  # the pool made a new connection


def test_pg_pool_reconnects_after_every_connection_dropped(
    open_pg: Callable[..., Any], pg_url: str, pg_schema: str
) -> None:
    store = open_pg(max_size=3, min_size=3)
    store.claim_many(ORG, requests(["k"]), A, lease_ttl_s=300.0)
    with raw(pg_url) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            (f"tooldispatch:{pg_schema}",),
        ).fetchone()[0]
        assert killed >= 1
        wait_for(  # pg_terminate_backend only signals: wait until they are gone
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = %s",
                    (f"tooldispatch:{pg_schema}",),
                ).fetchone()
            )
        )
    for _ in range(3):  # every pooled connection is checked before use: no call fails
        assert store.get_many(ORG, ["k"])[0] is not None
        assert (
            store.claim_many(ORG, requests(["k"]), B, lease_ttl_s=60)[0].disposition
            is ClaimDisposition.RUNNING
        )


def test_pg_unreachable_server_raises_store_unavailable() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(StoreUnavailableError, match="cannot"):
        stores.PostgresReceiptStore("postgresql://postgres@127.0.0.1:1/test", connect_timeout_s=1.0)


# -- schema and open_store -----------------------------------------------------------------


def test_pg_newer_schema_refused(open_pg: Callable[..., Any], pg_url: str, pg_schema: str) -> None:
    open_pg().close()
    with raw(pg_url) as conn:
        conn.execute(f"UPDATE \"{pg_schema}\".meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(SchemaVersionError, match="99"):
        open_pg()


def test_pg_opens_a_version_2_schema_and_receipts_then_keep_their_input(
    open_pg: Callable[..., Any], pg_url: str, pg_schema: str
) -> None:
    """A schema made before receipts kept their inputs (version 2) migrates to 5: its
    receipts are kept and read with no input recorded; a claim writing one records it."""
    from stores.postgres.schema import _MIGRATIONS, quote_ident

    schema = quote_ident(pg_schema)
    with raw(pg_url) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.meta (name text PRIMARY KEY, value text NOT NULL)")
        for version in (1, 2):
            for statement in _MIGRATIONS[version](schema):
                conn.execute(statement)
        conn.execute(f"INSERT INTO {schema}.meta VALUES ('schema_version', '2')")
        conn.execute(
            f"INSERT INTO {schema}.receipts (key, org_id, scope, tool_id, status, input_hash, error, "
            "failure_kind, attempts, created_at, updated_at) "
            "VALUES ('k', %s, 'play', 'tool', 'failed', 'h', 'boom', 'transient', 1, 1.0, 1.0)",
            (ORG,),
        )
    store = open_pg()
    (old,) = store.get_many(ORG, ["k"])
    assert old is not None and old.status.value == "failed" and old.input_text is None
    (claim,) = store.claim_many(
        ORG,
        [ClaimRequest("k", "play", "tool", "h", input_text='{"domain":"lemonde.fr"}')],
        A,
        lease_ttl_s=60,
        mode=ClaimMode.RETRY_FAILED,
    )
    assert claim.disposition is ClaimDisposition.CLAIMED
    assert claim.receipt.input_text == '{"domain":"lemonde.fr"}'
    assert store.get_many(ORG, ["k"])[0].input_text == '{"domain":"lemonde.fr"}'
    with raw(pg_url) as conn:
        version = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'schema_version'").fetchone()
    assert version == ("5",)


@pytest.mark.parametrize("from_version", [2, 3])
def test_pg_opens_an_older_schema_with_batch_records_keeping_its_receipts(
    open_pg: Callable[..., Any], pg_url: str, pg_schema: str, from_version: int
) -> None:
    """A schema written before issue 26 (version 2, or 3 with receipts' inputs) gains
    ``receipts.batch_key`` and table ``batches``: its receipts are kept (a running one is
    taken over as before, alone, its input kept) and batch requests are recorded from
    then on."""
    from stores.postgres.schema import _MIGRATIONS, quote_ident

    schema = quote_ident(pg_schema)
    with raw(pg_url) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.meta (name text PRIMARY KEY, value text NOT NULL)")
        for version in range(1, from_version + 1):
            for statement in _MIGRATIONS[version](schema):
                conn.execute(statement)
        conn.execute(f"INSERT INTO {schema}.meta VALUES ('schema_version', %s)", (str(from_version),))
        conn.execute(
            f"INSERT INTO {schema}.receipts (key, org_id, scope, tool_id, status, input_hash, lease_id, "
            "lease_owner_run_id, lease_owner_attempt, lease_expires_at, attempts, created_at, updated_at) "
            "VALUES ('k1', %s, 'play', 'tool', 'running', 'h', 'l1', 'dead', 1, 1.0, 1, 1.0, 1.0)",
            (ORG,),
        )
        if from_version == 3:
            conn.execute(f"UPDATE {schema}.receipts SET input_text = '\"a.fr\"'")
    store = open_pg()
    with raw(pg_url) as conn:
        (version,) = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'schema_version'").fetchone()
    assert version == "5"
    (claim,) = store.claim_many(ORG, requests(["k1"]), A, lease_ttl_s=30.0)
    assert claim.disposition is ClaimDisposition.CLAIMED and claim.batch is None
    assert (claim.receipt.generation, claim.receipt.batch_key) == (1, None)
    assert claim.receipt.input_text == ('"a.fr"' if from_version == 3 else None)
    more = store.claim_many(ORG, requests(["k2"]), A, lease_ttl_s=30.0)
    record = BatchRecord(key="b1", tool_id="tool", members=("k1", "k2"), inputs=("1", "2"))
    assert store.mark_running_many(ORG, leases_of([claim, *more]), A, batches=[record]).ok
    assert [r.batch_key for r in store.get_many(ORG, ["k1", "k2"])] == ["b1", "b1"]


def test_pg_opens_a_version_4_schema_adding_cost_keeping_its_receipts(
    open_pg: Callable[..., Any], pg_url: str, pg_schema: str
) -> None:
    """A schema made before receipts kept what their calls cost (version 4) gains
    ``receipts.cost``, NULL in every receipt already there (read as None), the receipts
    otherwise as they were; a completion from then on records its cost."""
    from stores.postgres.schema import _MIGRATIONS, quote_ident

    schema = quote_ident(pg_schema)
    with raw(pg_url) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.meta (name text PRIMARY KEY, value text NOT NULL)")
        for version in range(1, 5):
            for statement in _MIGRATIONS[version](schema):
                conn.execute(statement)
        conn.execute(f"INSERT INTO {schema}.meta VALUES ('schema_version', '4')")
        conn.execute(
            f"INSERT INTO {schema}.receipts (key, org_id, scope, tool_id, status, input_hash, output, "
            "attempts, created_at, updated_at, completed_at, generation, input_text, batch_key) VALUES "
            "('k1', %s, 'play', 'tool', 'completed', 'h', '{\"v\":1}', 1, 1.0, 2.0, 2.0, 3, '\"a\"', 'b1')",
            (ORG,),
        )
    store = open_pg()
    with raw(pg_url) as conn:
        (version,) = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'schema_version'").fetchone()
    assert version == "5"
    (old,) = store.get_many(ORG, ["k1"])
    assert old is not None and old.cost is None
    assert (old.status, old.output, old.completed_at) == (ReceiptStatus.COMPLETED, {"v": 1}, 2.0)
    assert old.generation == 3
    assert (old.input_text, old.batch_key) == ('"a"', "b1")
    (claim,) = store.claim_many(ORG, requests(["k2"]), A, lease_ttl_s=30.0)
    paid = Money(Decimal("0.0025"), "USD")
    lease = claim.receipt.lease_id or ""
    assert store.complete_many(ORG, [Completion("k2", lease, {"v": 2}, cost=paid)], A).ok
    assert [r.cost for r in store.get_many(ORG, ["k1", "k2"])] == [None, paid]  # type: ignore[union-attr]
    with raw(pg_url) as conn:
        rows = conn.execute(f"SELECT key, cost FROM {schema}.receipts ORDER BY key").fetchall()
    assert rows == [("k1", None), ("k2", "0.0025 USD")]


def test_open_store_picks_backend(pg_url: str, pg_schema: str, tmp_path: Any) -> None:
    with open_store(pg_url, schema=pg_schema) as pg:
        assert type(pg).__name__ == "PostgresReceiptStore"
    with open_store(str(tmp_path / "r.db")) as lite:
        assert isinstance(lite, SqliteReceiptStore)
    with open_store(tmp_path / "p.db") as lite:
        assert isinstance(lite, SqliteReceiptStore)


def test_importing_stores_does_not_import_psycopg(tmp_path: Any) -> None:
    import subprocess
    import sys

    code = "import sys, stores; print('psycopg' in sys.modules, 'psycopg_pool' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.skipif(not gevent_active(), reason="needs a gevent monkey-patched run")
def test_pg_store_waits_cooperatively_under_gevent(
    open_pg: Callable[..., Any], pg_url: str, pg_schema: str
) -> None:
    # The store's claim waits on a row lock that only a greenlet on this hub releases:
    # if psycopg blocked the hub while waiting, that greenlet could never run.
    import gevent

    store = open_pg()
    store.claim_many(ORG, requests(["k"]), A, lease_ttl_s=-1.0)  # expired: the next claim locks the row
    with raw(pg_url) as blocker, raw(pg_url) as admin:
        blocker.execute("BEGIN")
        blocker.execute(f'SELECT 1 FROM "{pg_schema}".receipts WHERE key = %s FOR UPDATE', ("k",))
        claimer = gevent.spawn(store.claim_many, ORG, requests(["k"]), B, lease_ttl_s=60.0)
        wait_for(  # the claim is in flight, waiting on the lock; this greenlet still runs
            lambda: admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                (blocker.info.backend_pid,),
            ).fetchone()
        )
        releaser = gevent.spawn(blocker.execute, "ROLLBACK")
        assert gevent.joinall([claimer, releaser], timeout=30) and claimer.successful(), claimer.exception
    assert claimer.value[0].disposition is ClaimDisposition.CLAIMED
