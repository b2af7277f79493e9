"""``tooldispatch receipts resolve``: an operator decides a receipt whose outcome is
uncertain (issue 9 section 5). Real files, real subprocesses."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.scenario

PLAY = """
import os
from actors import Tool, ToolTimeoutError

MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timed-out-once")

def charge(input, ctx):
    with open(MARK + ".log", "a") as log:
        log.write(ctx.idempotency_key + "\\n")
    if not os.path.exists(MARK):
        open(MARK, "w").close()
        raise ToolTimeoutError("read timed out after the request was sent")
    return {"charged": input["n"]}

tools = [Tool(tool_id="charge", fn=charge)]  # not retry-safe

def play(row, ctx):
    return ctx.tool("charge", {"n": int(row)})
"""


def test_cli_resolve_uncertain_receipt_rerun_then_paid_once(cli, tmp_path):
    play = tmp_path / "charge_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("7\n", encoding="utf-8")
    db = tmp_path / "receipts.db"
    args = ("run", play, "--input", rows, "--db", db, "--output", tmp_path / "out.jsonl")

    first = cli.run(*args)
    assert first.returncode == 1, first.stderr  # the row failed (timed out after sending)
    listed = cli.run("receipts", "ls", "--db", db, "--status", "uncertain")
    assert listed.returncode == 0, listed.stderr
    (key,) = re.findall(r"│ ([0-9a-f]{16}) │", listed.stdout)

    again = cli.run(*args)  # never re-run silently: refused with how to resolve it
    assert again.returncode == 1
    assert "receipts resolve" in again.stderr + (tmp_path / "out.jsonl").read_text()
    assert len((tmp_path / "timed-out-once.log").read_text().split()) == 1

    refused = cli.run("receipts", "resolve", key, "--db", db)
    assert refused.returncode == 2 and "--rerun or --fail" in refused.stderr
    resolved = cli.run("receipts", "resolve", key, "--db", db, "--rerun")
    assert resolved.returncode == 0, resolved.stderr

    third = cli.run(*args)
    assert third.returncode == 0, third.stderr
    sent = (tmp_path / "timed-out-once.log").read_text().split()
    assert len(sent) == 2 and sent[0] == sent[1]  # the rerun sent the same Idempotency-Key
    done = cli.run("receipts", "resolve", key, "--db", db, "--fail")
    assert done.returncode == 2 and "not uncertain" in done.stderr


def test_cli_receipts_arguments_out_of_range_are_usage_errors(cli, tmp_path):
    db = tmp_path / "receipts.db"
    from stores import SqliteReceiptStore

    SqliteReceiptStore(db).close()
    for args in (
        ("receipts", "ls", "--db", db, "--limit", "-1"),
        ("receipts", "purge", "--db", db, "--older-than-days", "-5", "--yes"),
        ("receipts", "resolve", "abc", "--db", db, "--rerun", "--fail"),
    ):
        done = cli.run(*args)
        assert done.returncode == 2, (args, done.stderr)


def test_cli_purge_with_no_answer_deletes_nothing_and_is_not_an_error(cli, tmp_path):
    play = tmp_path / "charge_play.py"
    play.write_text(PLAY.replace("if not os.path.exists(MARK):", "if False:"), encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("1\n", encoding="utf-8")
    db = tmp_path / "receipts.db"
    assert cli.run("run", play, "--input", rows, "--db", db).returncode == 0
    declined = cli.run("receipts", "purge", "--db", db)  # stdin is closed: no answer
    assert declined.returncode == 0, declined.stderr
    assert "nothing deleted" in declined.stdout
