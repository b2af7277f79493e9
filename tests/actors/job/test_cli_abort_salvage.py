"""``tooldispatch run`` aborted while another connection holds the SQLite file locked: the
results paid meanwhile cannot be stored and go to the salvage file. The abort's report
counts what its labels say (breaker, issue 26): ``results salvaged`` is the entries this
run wrote to the salvage file (each output once), ``receipts completed this run`` the
receipts it stored completed (not the calls answered before their output was stored),
a call whose paid result was salvaged is not "cancelled", and the last line says that a
rerun stores the salvaged results from the file. The rerun does so without calling the
tool (which is not retry-safe: a call sent again would be an uncertain outcome).

Real processes (the CLI), real signals, a real SQLite file locked by ``BEGIN EXCLUSIVE``.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess

import pytest

pytestmark = pytest.mark.scenario

STOP_TIMEOUT_S = 120.0
ROWS = 12
BILLED = "receipts completed this run (calls that ran)"
SALVAGED = "results salvaged (paid, kept in the salvage file)"
CANCELLED = "calls cancelled by the abort"
CUT = "rows cut short by the abort (not written)"

PLAY = """
import fcntl, os, threading

from actors import Tool

LOG = os.environ["PAID_LOG"]


def fn(input, ctx):
    threading.Event().wait(2.0)
    with open(LOG, "a") as f:  # paid: the provider did the work
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(input["k"] + "\\n")
    return {"k": input["k"]}


tools = [Tool(tool_id="charge", fn=fn, provider="acme", retry_safe=False)]


def play(row, ctx):
    return ctx.tool("charge", {"k": row})
"""


def _receipts(db) -> dict[str, int]:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.5)
    except sqlite3.OperationalError:
        return {}
    try:
        return dict(conn.execute("select status, count(*) from receipts group by status").fetchall())
    except sqlite3.OperationalError:  # not made yet, or locked for a moment
        return {}
    finally:
        conn.close()


def _paid(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _number(cell: str) -> int:
    found = re.match(r"\d+", cell)
    assert found, cell
    return int(found.group())


@pytest.mark.parametrize("runtime", ["threads", "gevent"])
def test_cli_abort_with_the_store_locked_counts_what_it_salvaged_and_the_rerun_replays_it(
    cli, tmp_path, runtime
):
    play, rows, db = tmp_path / "charge_play.py", tmp_path / "rows.txt", tmp_path / "r.db"
    play.write_text(PLAY, encoding="utf-8")
    rows.write_text("".join(f"row{i}\n" for i in range(ROWS)), encoding="utf-8")
    paid_log, err_path = tmp_path / "paid.log", tmp_path / "run1.stderr"
    env = cli.env(PAID_LOG=str(paid_log))
    args = ("run", play, "--input", rows, "--db", db, "--concurrency", str(ROWS), "--runtime", runtime)
    err = open(err_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        cli.command(*args, "--output", tmp_path / "o1.jsonl"),
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
    )  # fmt: skip
    locker = None
    try:
        # every call sent (its receipt running), none back yet (the tool takes 2 s)
        cli.poll_until(
            lambda: proc.poll() is not None or _receipts(db).get("running", 0) == ROWS,
            timeout_s=STOP_TIMEOUT_S, what="every call to be sent",
        )  # fmt: skip
        locker = sqlite3.connect(db, isolation_level=None, timeout=30, check_same_thread=False)
        locker.execute("BEGIN EXCLUSIVE")  # another process's long transaction
        cli.poll_until(
            lambda: proc.poll() is not None or len(_paid(paid_log)) == ROWS,
            timeout_s=STOP_TIMEOUT_S, what="every call to be paid",
        )  # fmt: skip
        proc.send_signal(signal.SIGINT)
        cli.poll_until(
            lambda: proc.poll() is not None or "interrupted" in err_path.read_text(),
            timeout_s=STOP_TIMEOUT_S, what="the first signal to be handled",
        )  # fmt: skip
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
        if locker is not None:
            locker.execute("ROLLBACK")
            locker.close()
    text = err_path.read_text()
    assert code == 130, text[-3000:]
    paid = _paid(paid_log)
    assert sorted(paid) == sorted(f"row{i}" for i in range(ROWS)), text[-3000:]
    salvage = tmp_path / "r.db.salvage.jsonl"
    entries = [json.loads(line) for line in salvage.read_text().splitlines() if line.strip()]
    keys = [e["receipt_key"] for e in entries]
    stored = _receipts(db).get("completed", 0)
    assert entries and stored + len(set(keys)) >= ROWS, text[-3000:]  # nothing paid is lost
    assert len(keys) == len(set(keys)), "an output salvaged twice"
    report = cli.report(text)
    assert _number(report[SALVAGED]) == len(entries), (report, len(entries))
    assert _number(report[BILLED]) == stored, (report, stored)
    assert CANCELLED not in report, report  # every call was paid: none was cancelled
    if CUT in report:  # a row whose paid result was salvaged: a rerun stores it, not runs it
        assert "salvage file" in report[CUT], report[CUT]
    last = text.strip().splitlines()[-1]
    assert last.startswith("aborted:"), last
    assert f"the {len(entries)} results in the salvage file are stored from it" in last, last

    rerun = cli.run(*args, "--output", tmp_path / "o2.jsonl", env=env, timeout_s=STOP_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert cli.report(rerun.stderr)["rows"] == f"{ROWS} ({ROWS} ok, 0 failed)", rerun.stderr[-3000:]
    assert len(_paid(paid_log)) == ROWS  # none paid again, none uncertain
    assert _receipts(db) == {"completed": ROWS}
    assert [r["k"] for r in (row["result"] for row in cli.read_jsonl(tmp_path / "o2.jsonl"))] == [
        f"row{i}" for i in range(ROWS)
    ]
