"""A Postgres receipts table that another session holds locked (``LOCK TABLE ... IN
ACCESS EXCLUSIVE MODE``: what ``ALTER TABLE``, ``VACUUM FULL`` or a migration takes) never
holds a caller inside ``execute()``: the plain reads made on the caller's thread give up
within ``stores.base.PLAIN_READ_WAIT_S`` and the calls wait in their claims, where their
futures, timeouts and a stop reach them. Real Postgres, a schema of each test's own.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stores import PostgresReceiptStore, StoreUnavailableError

from ..conftest import WAIT_S
from .test_lease_cleanup import PG_URL, pg_schema

__all__ = ["pg_schema"]  # the fixture, used by name

ORG = "org-a"


@contextlib.contextmanager
def _table_locked(schema: str) -> Iterator[None]:
    """The schema's receipts table held ``ACCESS EXCLUSIVE`` by another session until the
    block ends."""
    import psycopg

    conn = psycopg.connect(PG_URL)
    try:
        conn.execute(f'LOCK TABLE "{schema}".receipts IN ACCESS EXCLUSIVE MODE')
        yield
    finally:
        conn.rollback()
        conn.close()


def _echo(runs: list[Any]) -> Any:
    from actors import Tool

    def echo(input: Any, ctx: Any) -> Any:
        runs.append(input)
        return {"echo": input["i"]}

    return Tool(tool_id="echo", fn=echo)


def test_the_plain_reads_give_up_on_a_locked_table_at_once(pg_schema: str) -> None:
    store = PostgresReceiptStore(PG_URL, schema=pg_schema)
    try:
        with _table_locked(pg_schema):
            for read in (
                lambda: store.read_reusable(ORG, ["k1", "k2"]),
                lambda: store.read_completed_since(
                    ORG, "echo", after=None, keys=["k1"], limit=10, max_bytes=1000
                ),
                lambda: store.read_completed_since(ORG, "echo", after=(0.0, ""), limit=10, max_bytes=1000),
            ):
                started = time.monotonic()
                with pytest.raises(StoreUnavailableError, match="lock"):
                    read()
                assert time.monotonic() - started < 2.0
        assert store.read_reusable(ORG, ["k1"]) == {}  # the lock gone: read as ever
    finally:
        store.close()


@pytest.mark.parametrize("many", [False, True], ids=["execute", "execute_many"])
def test_execute_returns_at_once_while_the_table_is_locked(
    make_system: Any, pg_schema: str, many: bool
) -> None:
    runs: list[Any] = []
    store = PostgresReceiptStore(PG_URL, schema=pg_schema)
    system = make_system([_echo(runs)], store=store)
    try:
        proxy = system.proxy()
        assert proxy.execute("echo", {"i": -1}).get(timeout=WAIT_S).value == {"echo": -1}
        inputs = [{"i": i} for i in range(40 if many else 1)]
        released = threading.Event()
        with _table_locked(pg_schema):
            started = time.monotonic()
            futures = proxy.execute_many("echo", inputs) if many else [proxy.execute("echo", inputs[0])]
            returned_in = time.monotonic() - started
            time.sleep(0.5)
            assert not any(f.done for f in futures)  # waiting in their claim, not in execute()
            released.set()
        assert returned_in < 1.5, returned_in
        results = [f.get(timeout=WAIT_S) for f in futures]
        assert [r.value for r in results] == [{"echo": i["i"]} for i in inputs]
        assert len(runs) == 1 + len(inputs)  # each once
    finally:
        system.stop(timeout_s=WAIT_S)
        store.close()
