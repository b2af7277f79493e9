"""A batch request is held to a byte budget as a call's input is to the input cap
(``BatchStrategy.max_batch_bytes``: members past it go in the next batch), and a store
error that is no outage (a value over the store's size limit: Postgres "program limit
exceeded", SQLite "string or blob too big") fails the calls at once, saying so, instead
of being tried again as an outage until their timeout. Real dispatch systems on a SQLite
file or the test Postgres; both runtimes.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from actors import BatchStrategy, Policy, Tool
from stores import StoreError, StoreUnavailableError

from ..conftest import WAIT_S, outcome

PG_URL = "postgresql://root@127.0.0.1:5432/postgres"


def _batch_tool(sent: list[list[Any]], budget: int, size: int = 50) -> Tool:
    lock = threading.Lock()

    def one(input: Any, ctx: Any) -> Any:  # a request of one member
        with lock:
            sent.append([input])
        return {"n": len(input["pad"])}

    def many(payload: list[Any], ctx: Any) -> list[Any]:
        with lock:
            sent.append(list(payload))
        return [{"n": len(item["pad"])} for item in payload]

    batch = BatchStrategy(batch_fn=many, max_batch_size=size, max_batch_bytes=budget)
    return Tool(tool_id="enrich", fn=one, provider="p", batch=batch)


def _size(input: Any) -> int:
    return len(orjson.dumps(input, option=orjson.OPT_SORT_KEYS))


def test_a_batch_is_cut_at_its_byte_budget_and_every_member_is_sent_once(make_system: Any) -> None:
    sent: list[list[Any]] = []
    budget = 1000
    system = make_system([_batch_tool(sent, budget)], policy=Policy(batch_grace_s=0.2))
    # 12 inputs of ~310 bytes: 3 fit in 1000 bytes, so 4 requests (one by the count alone)
    inputs = [{"i": i, "pad": "x" * 300} for i in range(12)]
    futures = system.proxy().execute_many("enrich", inputs)
    assert [f.get(timeout=WAIT_S).value for f in futures] == [{"n": 300}] * 12
    assert sorted(item["i"] for request in sent for item in request) == list(range(12))
    assert all(sum(_size(item) for item in request) <= budget for request in sent), [
        sum(_size(item) for item in request) for request in sent
    ]
    assert len(sent) == 4


def test_a_member_over_the_byte_budget_goes_alone(make_system: Any) -> None:
    sent: list[list[Any]] = []
    system = make_system([_batch_tool(sent, 100)], policy=Policy(batch_grace_s=0.2))
    inputs = [{"i": 0, "pad": "y" * 500}, {"i": 1, "pad": ""}, {"i": 2, "pad": ""}]
    futures = system.proxy().execute_many("enrich", inputs)
    assert [f.get(timeout=WAIT_S).value["n"] for f in futures] == [500, 0, 0]
    alone = [request for request in sent if any(item["i"] == 0 for item in request)]
    assert [len(request) for request in alone] == [1]
    assert sorted(item["i"] for request in sent for item in request) == [0, 1, 2]


def test_the_byte_budget_must_be_a_positive_count() -> None:
    with pytest.raises(ValueError, match="max_batch_bytes"):
        BatchStrategy(batch_fn=lambda payload, ctx: payload, max_batch_size=10, max_batch_bytes=0)


def _refused(error: Any) -> None:
    assert isinstance(error, StoreError), error
    assert not isinstance(error, StoreUnavailableError), error
    assert "size limit" in str(error) and "not an outage" in str(error), error


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "setlimit"), reason="Connection.setlimit is Python 3.11+")
def test_sqlite_refusing_a_value_over_its_size_limit_fails_the_calls_at_once(
    make_system: Any, open_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 4000  # SQLite's length limit on the store's connections (default 1 GB)
    connect = sqlite3.connect

    def limited(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
        return conn

    monkeypatch.setattr(sqlite3, "connect", limited)
    store = open_store()
    sent: list[list[Any]] = []
    system = make_system([_batch_tool(sent, 10 * limit)], policy=Policy(batch_grace_s=0.05), store=store)
    futures = system.proxy().execute_many(
        "enrich", [{"i": i, "pad": "z" * 3000} for i in range(2)], timeout_s=60
    )
    for future in futures:
        _refused(outcome(future, timeout=WAIT_S))
    assert sent == []
    assert system.stats()["outages"] == []


@pytest.fixture
def pg_schema() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.OperationalError:
        pytest.skip("no Postgres server on 127.0.0.1:5432")
    schema = f"td_test_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_postgres_refusing_a_value_over_its_size_limit_fails_the_calls_at_once(
    make_system: Any, pg_schema: str
) -> None:
    from stores import PostgresReceiptStore

    store = PostgresReceiptStore(PG_URL, schema=pg_schema)
    try:
        sent: list[list[Any]] = []
        # an org id longer than a btree index row may be: the claim's insert is refused
        # (SQLSTATE 54000, program limit exceeded), every time it is sent
        org = os.urandom(6000).hex()
        system = make_system(
            [_batch_tool(sent, 1 << 20)], policy=Policy(batch_grace_s=0.05), store=store, org_id=org
        )
        futures = system.proxy().execute_many("enrich", [{"i": i, "pad": ""} for i in range(2)], timeout_s=60)
        for future in futures:
            _refused(outcome(future, timeout=WAIT_S))
        assert sent == []
        assert system.stats()["outages"] == []
    finally:
        store.close()
