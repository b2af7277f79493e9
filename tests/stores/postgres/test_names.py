"""Postgres names and the change feed's health check (issue 11: fleets on Postgres).

Postgres keeps 63 bytes of a name and cuts the rest: ``LISTEN`` cuts a long channel
silently, ``pg_notify`` refuses it, and two long schema names sharing their first 63
bytes would be one schema. The receipt store's channel is derived from its schema, so
a legal schema name of 51 to 63 bytes must still get a channel that works, and a schema
name past 63 bytes is refused up front. The listener's probe asks the server whether
its session still listens: on a healthy connection it must say yes (an idle listener is
never torn down), and on a session that stopped listening it must say no.
Every test works in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import stores
from stores import ClaimRequest, Completion, LeaseRef, Owner
from stores.postgres.listen import Listener, channel_name

from ..conftest import drop_pg_schema, wait_for, wait_settled

ORG = "acme"
A, B = Owner("run-a"), Owner("run-b")
ANSWER_S = 10.0


@pytest.fixture(
    params=[
        "td_" + "x" * 56,  # 59 bytes: 'tooldispatch:' + it is 72, past the channel limit
        "td_" + "é" * 30,  # 63 bytes of UTF-8 in 33 characters
    ],
    ids=["ascii-59", "utf8-63"],
)
def long_schema(request: pytest.FixtureRequest, pg_url: str) -> Iterator[str]:
    schema = request.param
    drop_pg_schema(schema)
    try:
        yield schema
    finally:
        drop_pg_schema(schema)


def test_a_long_legal_schema_name_stores_results_and_wakes_waiters(pg_url: str, long_schema: str) -> None:
    channel = channel_name(long_schema)
    assert len(channel.encode()) <= 63 and channel == channel_name(long_schema)  # every worker agrees
    a = stores.PostgresReceiptStore(pg_url, schema=long_schema, max_size=2)
    b = stores.PostgresReceiptStore(pg_url, schema=long_schema, max_size=2)
    try:
        (claim,) = b.claim_many(ORG, [ClaimRequest("k1", "s", "t", "h1")], B, lease_ttl_s=300.0)
        lease = LeaseRef("k1", claim.receipt.lease_id)
        assert b.mark_running_many(ORG, [lease], B).ok
        woken: list[set[str]] = []
        waiter = threading.Thread(target=lambda: woken.append(wait_settled(a, ORG, ["k1"], 60.0)))
        waiter.start()
        assert a.change_feed().wait_connected(ANSWER_S)
        started = time.monotonic()
        report = b.complete_many(ORG, [Completion("k1", lease.lease_id, {"ok": True})], B)
        assert report.ok, report  # pg_notify on the schema's channel did not refuse the write
        waiter.join(ANSWER_S)
        assert woken == [{"k1"}] and time.monotonic() - started < ANSWER_S  # woken, not polled (60 s)
        assert a.get_many(ORG, ["k1"])[0].output == {"ok": True}
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("schema", ["td_" + "y" * 61, "td_" + "é" * 31], ids=["ascii-64", "utf8-65"])
def test_a_schema_name_past_63_bytes_is_refused_before_anything_is_made(pg_url: str, schema: str) -> None:
    import psycopg

    cut = schema.encode()[:63].decode("utf-8", "ignore")  # the name Postgres would keep
    drop_pg_schema(cut)
    try:
        with pytest.raises(ValueError, match="at most 63 bytes"):
            stores.PostgresReceiptStore(pg_url, schema=schema)
        with psycopg.connect(pg_url) as conn:
            found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (cut,)).fetchone()
        assert found is None
    finally:
        drop_pg_schema(cut)


def test_short_schema_names_keep_their_channel(pg_schema: str) -> None:
    """Workers of an earlier release listen on ``tooldispatch:SCHEMA``: unchanged."""
    assert channel_name(pg_schema) == f"tooldispatch:{pg_schema}"


@pytest.mark.waits
def test_an_idle_healthy_listener_keeps_its_connection(pg_url: str, pg_schema: str) -> None:
    import psycopg

    channel = channel_name(pg_schema)
    listener = Listener(pg_url, channel, {}, probe_after_s=0.1, probe_timeout_s=5.0)
    try:
        listener.start()
        assert listener.wait_connected(ANSWER_S)
        pid = listener.backend_pid
        threading.Event().wait(1.5)  # many probes' worth of silence
        assert (listener.reconnects, listener.backend_pid) == (0, pid)
        seen = listener.version(ORG)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, ORG))
        assert listener.wait(ORG, seen, ANSWER_S)
        assert listener.reconnects == 0
    finally:
        listener.close()


class _Unlistening(Listener):
    """A listener whose first session stops listening right after it starts."""

    dropped = False

    def _listen(self, conn: Any) -> None:
        if not self.dropped:
            type(self).dropped = True
            conn.execute("UNLISTEN *")
        super()._listen(conn)


@pytest.mark.waits
def test_the_probe_notices_a_session_that_no_longer_listens(pg_url: str, pg_schema: str) -> None:
    import psycopg

    channel = channel_name(pg_schema)
    listener = _Unlistening(pg_url, channel, {}, probe_after_s=0.1, probe_timeout_s=5.0)
    try:
        listener.start()
        wait_for(lambda: listener.reconnects == 1 and listener.live)
        seen = listener.version(ORG)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, ORG))
        assert listener.wait(ORG, seen, ANSWER_S)  # the new session listens
        threading.Event().wait(0.5)
        assert listener.reconnects == 1  # and its probes find it listening
    finally:
        listener.close()
