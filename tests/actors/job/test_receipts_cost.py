"""``tooldispatch receipts cost``: what the receipts in a store cost when their calls were
paid, summed exactly per tool, org or UTC day and currency, since a time; receipts that
kept no cost are counted apart. SQLite files and Postgres (click's runner, real stores)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from actors.job.cli import main
from actors.job.ledger import parse_since
from stores import ClaimRequest, Completion, LeaseRef, Money, Owner, open_store

from ...stores.conftest import OTHER

DAY_S = 86400.0


def _paid(
    db: str, org: str, tool: str, key: str, cost: Money | None, days_ago: float = 0.0, owner: Owner = OTHER
) -> None:
    store = open_store(db)
    try:
        (claim,) = store.claim_many(
            org, [ClaimRequest(key, "play", tool, f"hash-{key}")], owner, lease_ttl_s=60
        )
        lease = LeaseRef(key, claim.receipt.lease_id)
        assert store.mark_running_many(org, [lease], owner).ok
        assert store.complete_many(
            org, [Completion(lease.key, lease.lease_id, {"v": key}, cost=cost)], owner
        ).ok
    finally:
        store.close()
    if days_ago:
        sql = "update receipts set completed_at = completed_at - ? where key = ?"
        if db.startswith("postgresql://"):
            import psycopg

            from stores.postgres.conn import split_schema

            url, schema = split_schema(db)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'set search_path to "{schema}"')
                conn.execute(sql.replace("?", "%s"), (days_ago * DAY_S, key))
        else:
            import sqlite3

            with sqlite3.connect(db) as conn:
                conn.execute(sql, (days_ago * DAY_S, key))


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Any) -> Iterator[str]:
    if request.param == "postgres":
        yield request.getfixturevalue("pg_db")
    else:
        yield str(tmp_path / "r.db")


def _cost(db: str, *args: str) -> Any:
    done = CliRunner().invoke(main, ["receipts", "cost", "--db", db, "--json", *args])
    assert done.exit_code == 0, done.output
    return json.loads(done.output)


def test_receipts_cost_sums_each_tool_exactly_per_currency(db: str) -> None:
    for i in range(3):
        _paid(db, "acme", "verify", f"v{i}", Money("0.1", "USD"))  # 0.1 three times: exactly 0.3
    _paid(db, "acme", "enrich", "e0", Money("0.25", "EUR"))
    _paid(db, "acme", "enrich", "e1", Money("1", "USD"))
    _paid(db, "acme", "enrich", "e2", None)  # paid while its tool had no price
    assert _cost(db) == [
        {"tool": "enrich", "spent": "0.25", "currency": "EUR", "paid": 1, "unpriced": 1},
        {"tool": "enrich", "spent": "1", "currency": "USD", "paid": 1, "unpriced": 0},
        {"tool": "verify", "spent": "0.3", "currency": "USD", "paid": 3, "unpriced": 0},
    ]


def test_receipts_cost_by_org_and_by_day_since_a_time(db: str) -> None:
    _paid(db, "acme", "verify", "a0", Money("2", "USD"))
    _paid(db, "acme", "verify", "a1", Money("3", "USD"), days_ago=10)
    _paid(db, "globex", "verify", "g0", Money("5", "USD"), days_ago=3)
    by_org = _cost(db, "--by", "org")
    assert [(line["org"], line["spent"]) for line in by_org] == [("acme", "5"), ("globex", "5")]
    recent = _cost(db, "--by", "org", "--since", "7d")
    assert [(line["org"], line["spent"]) for line in recent] == [("acme", "2"), ("globex", "5")]
    by_day = _cost(db, "--by", "day")
    assert len(by_day) == 3 and sorted(line["spent"] for line in by_day) == ["2", "3", "5"]
    assert all(len(line["day"]) == 10 for line in by_day)  # YYYY-MM-DD


def test_receipts_cost_prints_a_table_and_says_when_nothing_was_paid(db: str) -> None:
    _paid(db, "acme", "verify", "v0", None)
    done = CliRunner().invoke(main, ["receipts", "cost", "--db", db, "--since", "2999-01-01"])
    assert done.exit_code == 0 and "no paid receipts" in done.output
    _paid(db, "acme", "verify", "v1", Money("0.0025", "USD"))
    done = CliRunner().invoke(main, ["receipts", "cost", "--db", db])
    assert done.exit_code == 0, done.output
    assert "0.0025 USD" in done.output and "verify" in done.output


def test_receipts_cost_by_the_run_that_paid_and_by_provider(db: str, tmp_path: Any) -> None:
    _paid(db, "acme", "verify", "v0", Money("1", "USD"), owner=Owner("monday-run", 1))
    _paid(db, "acme", "verify", "v1", Money("1", "USD"), owner=Owner("tuesday-run", 1))
    _paid(db, "acme", "enrich", "e0", Money("2", "USD"), owner=Owner("tuesday-run", 1))
    _paid(db, "acme", "geo", "g0", Money("4", "USD"), owner=Owner("tuesday-run", 1))
    by_run = _cost(db, "--by", "run")
    assert [(line["run"], line["spent"]) for line in by_run] == [("monday-run", "1"), ("tuesday-run", "7")]
    play = tmp_path / "providers_play.py"
    play.write_text(
        "from actors import Tool\n"
        "tools = [Tool(tool_id='verify', fn=print, provider='acme-api'),\n"
        "         Tool(tool_id='enrich', fn=print, provider='acme-api')]\n"
        "def play(row, ctx):\n    return row\n",
        encoding="utf-8",
    )
    by_provider = _cost(db, "--by", "provider", "--play", str(play))
    # geo is not in the play: it is its own provider
    assert [(line["provider"], line["spent"]) for line in by_provider] == [("acme-api", "4"), ("geo", "4")]
    done = CliRunner().invoke(main, ["receipts", "cost", "--db", db, "--by", "provider"])
    assert done.exit_code == 2 and "--by provider needs --play" in done.output


@pytest.mark.parametrize("since", ["yesterday", "7 parsecs", ""])
def test_receipts_cost_refuses_a_since_it_cannot_read_in_one_line(tmp_path: Any, since: str) -> None:
    db = str(tmp_path / "r.db")
    _paid(db, "acme", "verify", "v0", Money("1", "USD"))
    done = CliRunner().invoke(main, ["receipts", "cost", "--db", db, "--since", since])
    assert done.exit_code == 2 and "--since" in done.output and "Traceback" not in done.output


def test_since_reads_durations_and_dates() -> None:
    now = 1_000_000.0
    assert parse_since("36h", now) == now - 36 * 3600
    assert parse_since("2w", now) == now - 14 * DAY_S
    assert parse_since("90s", now) == now - 90
    assert parse_since("1970-01-02", now) == DAY_S  # UTC when no offset is named
    assert parse_since("1970-01-02T00:00:00+01:00", now) == DAY_S - 3600


def test_receipts_cost_of_a_table_changed_by_hand_is_a_one_line_error(tmp_path: Any) -> None:
    import sqlite3

    db = str(tmp_path / "r.db")
    _paid(db, "acme", "verify", "v0", Money("1", "USD"))
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE receipts DROP COLUMN cost")  # (its version still says it has one)
    done = CliRunner().invoke(main, ["receipts", "cost", "--db", db])
    assert done.exit_code == 2 and "cannot be read" in done.output and "Traceback" not in done.output


def test_receipts_cost_prints_tiny_amounts_in_plain_notation(tmp_path: Any) -> None:
    db = str(tmp_path / "r.db")
    _paid(db, "acme", "verify", "v0", Money("0.0000003", "USD"))
    (line,) = _cost(db)
    assert line["spent"] == "0.0000003"
