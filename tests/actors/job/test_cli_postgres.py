"""The CLI on a Postgres receipt store: ``run --db postgresql://...`` (or TOOLDISPATCH_DB),
then ``receipts`` and ``salvage`` on the same URL (issue 11 section 1).

Each test uses a schema of its own (the URL's ``schema=`` parameter), dropped after.
Without Postgres the tests skip (fail when CI is set).
"""

from __future__ import annotations

import json
import os
import re

import pytest

pytestmark = pytest.mark.scenario

PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
"""The server the ``pg_db`` fixture (conftest.py) makes its schemas in."""

PLAY = """
from actors import Tool


def square(input, ctx):
    return {"n": input["n"], "square": input["n"] ** 2}


tools = [Tool(tool_id="square", fn=square)]


def play(row, ctx):
    return ctx.tool("square", {"n": int(row)})
"""
ROWS = 40


def test_cli_postgres_run_then_receipts_ls_stats_show_and_salvage(cli, tmp_path, pg_db):
    play = tmp_path / "square_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "numbers.txt"
    rows.write_text("".join(f"{n}\n" for n in range(ROWS)), encoding="utf-8")

    first = cli.run("run", play, "--input", rows, "--db", pg_db)
    assert first.returncode == 0, first.stderr
    assert cli.report(first.stderr)["receipts completed this run (calls that ran)"] == str(ROWS)

    listed = cli.run("receipts", "ls", "--db", pg_db, "--limit", "5")
    assert listed.returncode == 0, listed.stderr
    found = re.findall(
        r'│ ([0-9a-f]{16}) │ default\s+│ square\s+│ \{"n":(\d+)\}\s+│ completed\s+│ 1\s+│', listed.stdout
    )
    assert len(found) == 5, listed.stdout  # each with what it was for: its input
    keys = [key for key, _ in found]

    by_env = cli.env(TOOLDISPATCH_DB=pg_db)  # no --db: the URL comes from the environment
    stats = cli.run("receipts", "stats", env=by_env)
    assert stats.returncode == 0, stats.stderr
    assert re.search(rf"│ square\s+│ completed\s+│ {ROWS}\s+│", stats.stdout), stats.stdout

    shown = cli.run("receipts", "show", keys[0][:12], "--db", pg_db)
    assert shown.returncode == 0, shown.stderr
    receipt = json.loads(shown.stdout)
    assert receipt["key"].startswith(keys[0])
    assert receipt["input_text"] == f'{{"n":{found[0][1]}}}'
    assert receipt["output"]["square"] == receipt["output"]["n"] ** 2

    salvaged = cli.run("salvage", "ls", "--db", pg_db)
    assert salvaged.returncode == 0, salvaged.stderr
    assert salvaged.stdout.splitlines()[-1] == "0 salvaged"

    rerun = cli.run("run", play, "--input", rows, env=by_env)
    assert rerun.returncode == 0, rerun.stderr
    report = cli.report(rerun.stderr)
    assert report["receipts completed this run (calls that ran)"] == "0"
    assert report["reused from earlier runs"] == f"{ROWS} receipts ({ROWS} calls)"


def test_cli_postgres_unreachable_server_is_one_line_error(cli, tmp_path):
    play = tmp_path / "square_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "numbers.txt"
    rows.write_text("1\n", encoding="utf-8")
    done = cli.run("receipts", "ls", "--db", "postgresql://postgres@127.0.0.1:1/test")
    assert done.returncode == 2
    assert done.stderr.startswith("tooldispatch: error: postgresql://postgres@127.0.0.1:1/test: cannot")
    assert "Traceback" not in done.stderr


SKEWED_CLOCK = """
import time

_real = time.time
time.time = lambda: _real() + {shift_s!r}  # this process's clock is off by shift_s
"""


@pytest.mark.parametrize("shift_s", [-7200.0, 7200.0], ids=["client-behind", "client-ahead"])
def test_cli_postgres_purge_counts_and_deletes_by_the_database_clock(cli, tmp_path, pg_db, shift_s):
    """``receipts purge`` on Postgres judges ages and leases by the database's clock, as the
    store's purge does: a host whose clock is off neither misses old receipts nor counts
    ones under a live lease."""
    play = tmp_path / "square_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "numbers.txt"
    rows.write_text("".join(f"{n}\n" for n in range(ROWS)), encoding="utf-8")
    assert cli.run("run", play, "--input", rows, "--db", pg_db).returncode == 0

    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(SKEWED_CLOCK.format(shift_s=shift_s), encoding="utf-8")
    env = cli.env()
    env["PYTHONPATH"] = os.pathsep.join([str(skew), env["PYTHONPATH"]])
    # one receipt held under a live lease by another worker (10 minutes, database clock)
    import psycopg

    schema = pg_db.rsplit("schema=", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".receipts SET status = 'failed', "
            "lease_expires_at = extract(epoch from now()) + 600 "
            f'WHERE key = (SELECT min(key) FROM "{schema}".receipts)'
        )
    done = cli.run("receipts", "purge", "--db", pg_db, "--status", "completed", "--status", "failed",
                   env=env, input="y\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"delete {ROWS - 1} receipts (completed or failed)"), (
        done.stdout
    )  # the count asked
    assert done.stdout.strip().endswith(f"purged {ROWS - 1} receipts")


@pytest.mark.parametrize("schema", ["td_" + "z" * 61, "td_" + "\u00e9" * 31], ids=["ascii-64", "utf8-65"])
def test_cli_postgres_schema_name_past_63_bytes_is_a_one_line_error(cli, tmp_path, schema):
    from urllib.parse import quote

    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={quote(schema)}"
    play = tmp_path / "square_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "numbers.txt"
    rows.write_text("1\n", encoding="utf-8")
    for args in (("receipts", "stats", "--db", url), ("run", play, "--input", rows, "--db", url)):
        done = cli.run(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("tooldispatch: error: Postgres names hold at most 63 bytes")
        assert "Traceback" not in done.stderr
