"""``tooldispatch run --dry-run``: from the input and the receipts, without sending
anything or writing the store, which rows receipts answer, which calls the run would pay
for and what they would cost; a row stops at its first call no receipt answers (the calls
after it are not counted). Real SQLite files; click's runner."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from actors import DispatchSystem
from actors.job.cli import main
from actors.tool import RunInfo
from stores import open_store, stored_schema_version

PLAY = """
import json
import pathlib

from stores import Money
from actors import BatchStrategy, Tool

SENT = pathlib.Path(__file__).with_suffix(".sent")


def sent(input):
    with SENT.open("a") as out:
        out.write(json.dumps(input) + "\\n")


def verify(input, ctx):
    sent(input)
    return {"ok": input["email"].endswith(".com"), "domain": input["email"].split("@")[1]}


def geo(input, ctx):
    sent(input)
    return {"country": "FR"}


def lower(input, ctx):
    return input.lower()


tools = [
    Tool(tool_id="verify", provider="acme", fn=verify, price=Money("0.002", "USD")),
    Tool(tool_id="geo", provider="maps", fn=geo, price=Money("0.01", "EUR"),
         batch=BatchStrategy(batch_fn=lambda p, c: [geo(i, c) for i in p], max_batch_size=2,
                             request_price=Money("0.5", "EUR"))),
    Tool(tool_id="lower", fn=lower, durable=False),
]


def play(row, ctx):
    email = ctx.tool("lower", row)
    checked = ctx.tool("verify", {"email": email})
    if checked["ok"]:
        return ctx.tool("geo", {"domain": checked["domain"]})
    return checked
"""


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    play = tmp_path / "mail_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("A@x.com\nb@y.org\nC@z.com\na@x.com\n", encoding="utf-8")  # a@x.com twice
    return play, rows, tmp_path / "r.db"


def _dry(play: Path, rows: Path, db: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "dry.json"
    done = CliRunner().invoke(
        main,
        [
            "run",
            str(play),
            "--input",
            str(rows),
            "--db",
            str(db),
            "--dry-run",
            "--report-json",
            str(out),
            *extra,
        ],
    )
    assert done.exit_code == 0, done.output
    assert "tooldispatch dry run (nothing sent)" in done.output
    return json.loads(out.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_a_dry_run_on_an_empty_store_counts_every_first_call_and_writes_nothing(tmp_path: Path) -> None:
    play, rows, db = _files(tmp_path)
    report = _dry(play, rows, db, tmp_path)
    assert report["rows"] == {"total": 4, "answered": 0, "would_pay": 4, "would_fail_or_wait": 0}
    # the first paid call of each row, once per distinct input; geo is never reached
    assert report["tools"]["verify"]["would_pay"] == 3
    assert report["tools"]["verify"]["would_cost"] == {"USD": "0.006"}
    assert report["tools"]["geo"]["would_pay"] == 0
    assert report["would_cost"] == {"USD": "0.006"}
    assert "depend on its answer" in report["not_counted"]
    assert not db.exists()  # no store made
    assert not (tmp_path / "mail_play.sent").exists()  # nothing sent


def test_a_dry_run_after_a_run_goes_on_with_the_receipts_answers(tmp_path: Path) -> None:
    play, rows, db = _files(tmp_path)
    from actors.job.play import load_play

    loaded = load_play(str(play))
    verify = next(t for t in loaded.tools if t.tool_id == "verify")
    store = open_store(str(db))
    run = RunInfo(run_id="paid", org_id="default", scope=loaded.name)
    with DispatchSystem.start(tools=[verify], store=store, run=run) as system:  # verify paid for two
        for email in ("a@x.com", "b@y.org"):
            system.proxy().execute("verify", {"email": email}).get(timeout=30)
    store.close()
    sent_before = (tmp_path / "mail_play.sent").read_text(encoding="utf-8")
    assert sent_before.count("\n") == 2
    with sqlite3.connect(db) as conn:
        receipts_before = conn.execute("select count(*) from receipts").fetchone()[0]

    report = _dry(play, rows, db, tmp_path)
    # a@x.com (twice): verify answered, geo would pay; b@y.org: answered all the way (not .com);
    # c@z.com: verify would pay
    assert report["rows"] == {"total": 4, "answered": 1, "would_pay": 3, "would_fail_or_wait": 0}
    assert report["tools"]["verify"]["answered"] == 3 and report["tools"]["verify"]["would_pay"] == 1
    assert report["tools"]["geo"]["would_pay"] == 1
    # one geo call: its price, and one batch request's price
    assert report["tools"]["geo"]["would_cost"] == {"EUR": "0.51"}
    assert report["would_cost"] == {"EUR": "0.51", "USD": "0.002"}
    assert (tmp_path / "mail_play.sent").read_text(encoding="utf-8") == sent_before  # nothing sent
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from receipts").fetchone()[0] == receipts_before


def test_a_dry_run_with_force_refresh_would_pay_for_every_call(tmp_path: Path) -> None:
    play, rows, db = _files(tmp_path)
    _dry(play, rows, db, tmp_path)  # (empty: nothing to refresh yet)
    report = _dry(play, rows, db, tmp_path, "--force-refresh")
    assert report["tools"]["verify"]["would_pay"] == 3


def test_a_dry_run_refuses_an_output_file(tmp_path: Path) -> None:
    play, rows, _ = _files(tmp_path)
    done = CliRunner().invoke(
        main, ["run", str(play), "--input", str(rows), "--dry-run", "--output", str(tmp_path / "o.jsonl")]
    )
    assert done.exit_code == 2 and "--dry-run writes no --output" in done.output


def _quoted(schema: str | None) -> str:
    return f'"{schema}"'


def _older_schema(db: str) -> None:
    """``db`` (a store made now) as version 4 left it: no cost column."""
    open_store(db).close()
    if db.startswith("postgresql://"):
        import psycopg

        from stores.postgres.conn import split_schema

        url, schema = split_schema(db)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {_quoted(schema)}.receipts DROP COLUMN cost")
            conn.execute(f"UPDATE {_quoted(schema)}.meta SET value = '4' WHERE name = 'schema_version'")
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("ALTER TABLE receipts DROP COLUMN cost")
            conn.execute("PRAGMA user_version = 4")


def _snapshot(db: str) -> Any:
    if db.startswith("postgresql://"):
        import psycopg

        from stores.postgres.conn import split_schema

        url, schema = split_schema(db)
        with psycopg.connect(url, autocommit=True) as conn:
            sql = "SELECT column_name FROM information_schema.columns WHERE table_schema = %s ORDER BY 1"
            columns = conn.execute(sql, (schema,)).fetchall()
            sql = f"SELECT value FROM {_quoted(schema)}.meta WHERE name = 'schema_version'"
            version = conn.execute(sql).fetchone()
            return columns, version
    return Path(db).read_bytes()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_dry_run_upgrades_no_older_store(request: Any, tmp_path: Path, backend: str) -> None:
    play, rows, path = _files(tmp_path)
    db = request.getfixturevalue("pg_db") if backend == "postgres" else str(path)
    _older_schema(db)
    before = _snapshot(db)
    assert stored_schema_version(db) == 4
    done = CliRunner().invoke(main, ["run", str(play), "--input", str(rows), "--db", db, "--dry-run"])
    assert done.exit_code == 2 and "schema version 4" in done.output and "writes nothing" in done.output
    assert _snapshot(db) == before  # not upgraded, nothing written


def test_a_row_that_catches_the_dry_runs_stop_counts_no_later_call(tmp_path: Path) -> None:
    play, rows, db = _files(tmp_path)
    play.write_text(
        PLAY.replace(
            'def play(row, ctx):\n    email = ctx.tool("lower", row)',
            "def play(row, ctx):\n"
            "    try:\n"
            '        ctx.tool("verify", {"email": "first@" + row})\n'
            "    except Exception:\n"
            "        pass  # a play that goes on with a substitute\n"
            '    email = ctx.tool("lower", row)',
        ),
        encoding="utf-8",
    )
    report = _dry(play, rows, db, tmp_path)
    # each row's first call would pay (once per distinct input); nothing after it is counted
    assert report["tools"]["verify"]["would_pay"] == 4
    assert report["tools"]["geo"]["would_pay"] == 0
    assert report["rows"]["would_pay"] == 4
