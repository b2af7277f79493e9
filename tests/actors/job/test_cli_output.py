"""What ``tooldispatch`` shows: progress and report (on a pipe and on a pseudo-terminal),
and the ``receipts`` and ``salvage`` commands against a store made by a real run."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3

import pytest

from ._terminal import run_on_a_terminal

pytestmark = pytest.mark.scenario

LOCAL_PLAY = """
import time

from actors import Tool


def square(input, ctx):
    if input["n"] == 0:  # one slow row keeps the run on screen long enough to be redrawn
        time.sleep(0.6)
    return {"n": input["n"], "square": input["n"] ** 2}


tools = [Tool(tool_id="square", fn=square)]


def play(row, ctx):
    return ctx.tool("square", {"n": int(row)})
"""

ROWS = 200
PTY_TIMEOUT_S = 120.0
REPORT_LABELS = (
    "rows", "requests sent to square", "receipts completed this run (calls that ran)",
    "reused from earlier runs", "reused within this run (calls)", "joined a lookup in flight (calls)",
    "calls failed", "retries (requests sent again)", "lookups square answered (billable)",
    "calls refused, provider down (circuit open)", "results salvaged (paid, kept in the salvage file)",
    "wall time", "rows/s",
)  # fmt: skip


@pytest.fixture
def local_run(tmp_path):
    """A tiny local play and its rows (the numbers 0..ROWS-1, one per line)."""
    play = tmp_path / "square_play.py"
    play.write_text(LOCAL_PLAY, encoding="utf-8")
    rows = tmp_path / "numbers.txt"
    rows.write_text("".join(f"{n}\n" for n in range(ROWS)), encoding="utf-8")
    return play, rows


def _run_on_pty(command, *, cwd, env):
    """Run ``command`` on a new pseudo-terminal; return (exit code, everything it wrote)."""
    return run_on_a_terminal(command, cwd=cwd, env=env, timeout_s=PTY_TIMEOUT_S)


def test_cli_output_plain_progress_and_report(cli, local_run, tmp_path):
    play, rows = local_run

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db")

    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("progress: rows")]
    assert progress, done.stderr
    assert progress[-1].startswith(f"progress: rows {ROWS}/{ROWS} (100.0%)")
    assert all("ETA" in line and "rows/s" in line for line in progress)
    assert "\x1b[" not in done.stderr  # not a terminal: no escape sequences, no redraws
    assert "tooldispatch run report" in done.stderr
    report = cli.report(done.stderr)
    assert set(REPORT_LABELS) <= set(report), report
    assert report["rows"] == f"{ROWS} ({ROWS} ok, 0 failed)"
    assert float(report["rows/s"]) > 0
    assert re.fullmatch(r"\d+\.\d\d s", report["wall time"])
    per_tool = cli.tools_report(done.stderr)
    assert per_tool == {
        "square": {
            "calls": ROWS, "ran (receipt completed; local: runs)": ROWS, "joined in flight": 0,
            "reused this run": 0, "reused, earlier runs": 0, "failed": 0, "lookups answered (billable)": ROWS,
            "answers replayed (not billed)": 0, "requests sent": ROWS, "429s": 0,
            "refused, provider down": 0,
        }
    }  # fmt: skip
    assert all(not label.startswith(("receipt_", "batch_", "group ", "drain ")) for label in report)


def test_cli_output_report_off_a_terminal_keeps_long_tool_names_whole(cli, tmp_path):
    play = tmp_path / "long_play.py"
    names = [f"a_really_long_tool_identifier_number_{n}" for n in range(3)]
    play.write_text(
        "from actors import Tool\n"
        f"NAMES = {names!r}\n"
        "tools = [Tool(tool_id=n, fn=lambda input, ctx: input) for n in NAMES]\n"
        "def play(row, ctx):\n"
        "    return [ctx.tool(n, {'row': row}) for n in NAMES]\n",
        encoding="utf-8",
    )
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nb\n", encoding="utf-8")

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db")

    assert done.returncode == 0, done.stderr
    assert "…" not in done.stderr
    assert set(cli.tools_report(done.stderr)) == set(names)


def test_cli_output_terminal_live_line_and_report(cli, local_run, tmp_path):
    play, rows = local_run
    env = cli.env(TERM="xterm-256color")

    code, screen = _run_on_pty(
        cli.command("run", play, "--input", rows, "--db", tmp_path / "r.db"), cwd=tmp_path, env=env
    )

    assert code == 0, screen
    assert "progress:" not in screen  # the live line, not plain lines
    assert "\r\x1b[2K" in screen  # redrawn in place
    live = [part for part in re.split(r"[\r\n]", screen) if "rows" in part and "ETA" in part]
    assert live, screen
    assert any(f"rows {ROWS}/{ROWS} (100.0%)" in part for part in live), live
    assert "tooldispatch run report" in screen
    assert "┏" in screen and "└" in screen  # the table is drawn with box characters
    report = cli.report(screen.replace("\r", ""))
    assert report["rows"] == f"{ROWS} ({ROWS} ok, 0 failed)"
    assert "rows/s" in report


def test_cli_output_dumb_terminal_gets_plain_lines(cli, local_run, tmp_path):
    play, rows = local_run
    env = cli.env(TERM="dumb")

    code, screen = _run_on_pty(
        cli.command("run", play, "--input", rows, "--db", tmp_path / "r.db"), cwd=tmp_path, env=env
    )

    assert code == 0, screen
    # a terminal that cannot redraw gets the plain periodic lines, not a silent live display
    assert "\x1b[2K" not in screen
    assert f"progress: rows {ROWS}/{ROWS} (100.0%)" in screen
    assert "tooldispatch run report" in screen


@pytest.fixture(scope="module")
def _store_made_once(cli_at, tmp_path_factory):
    """A receipt store made by one real run of the local play (ROWS completed receipts)."""
    where = tmp_path_factory.mktemp("store")
    play = where / "square_play.py"
    play.write_text(LOCAL_PLAY, encoding="utf-8")
    rows = where / "numbers.txt"
    rows.write_text("".join(f"{n}\n" for n in range(ROWS)), encoding="utf-8")
    db = where / "receipts.db"
    done = cli_at(where).run("run", play, "--input", rows, "--db", db)
    assert done.returncode == 0, done.stderr
    return db


@pytest.fixture
def store_from_a_run(_store_made_once, tmp_path):
    """This test's copy of the store (the run closed it, so the database file is whole)."""
    db = tmp_path / "store" / "receipts.db"
    db.parent.mkdir()
    for made in _store_made_once.parent.glob("receipts.db*"):
        shutil.copyfile(made, db.parent / made.name)
    return db


def test_cli_output_receipts_stats(cli, store_from_a_run):
    done = cli.run("receipts", "stats", "--db", store_from_a_run)

    assert done.returncode == 0, done.stderr
    assert re.search(rf"│ square\s+│ completed\s+│ {ROWS}\s+│", done.stdout), done.stdout


def test_cli_output_receipts_ls_and_show(cli, store_from_a_run):
    listed = cli.run("receipts", "ls", "--db", store_from_a_run, "--limit", "5")

    assert listed.returncode == 0, listed.stderr
    found = re.findall(
        r'│ ([0-9a-f]{16}) │ default\s+│ square\s+│ \{"n":(\d+)\}\s+│ completed\s+│ 1\s+│', listed.stdout
    )
    assert len(found) == 5, listed.stdout  # each with what it was for: its input
    keys = [key for key, _ in found]

    shown = cli.run("receipts", "show", keys[0][:12], "--db", store_from_a_run)

    assert shown.returncode == 0, shown.stderr
    receipt = json.loads(shown.stdout)
    assert receipt["key"].startswith(keys[0])
    assert receipt["tool_id"] == "square"
    assert receipt["input_text"] == f'{{"n":{found[0][1]}}}'
    assert receipt["status"] == "completed"
    assert receipt["output"]["square"] == receipt["output"]["n"] ** 2 == int(found[0][1]) ** 2


def test_cli_output_receipts_show_an_output_that_cannot_be_read(cli, store_from_a_run):
    with sqlite3.connect(store_from_a_run) as conn:
        (key,) = conn.execute("SELECT key FROM receipts LIMIT 1").fetchone()
        conn.execute("UPDATE receipts SET output = '{edited by hand' WHERE key = ?", (key,))

    shown = cli.run("receipts", "show", key[:16], "--db", store_from_a_run)

    assert shown.returncode == 0, shown.stderr
    receipt = json.loads(shown.stdout)
    assert receipt["output"] == "{edited by hand"  # as stored
    assert "JSONDecodeError" in receipt["output_unreadable"]

    with sqlite3.connect(store_from_a_run) as conn:  # a column set to a BLOB
        conn.execute("UPDATE receipts SET error = x'ff00' WHERE key = ?", (key,))
    shown = cli.run("receipts", "show", key[:16], "--db", store_from_a_run)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["error"] == "\\xff\x00"


def test_cli_output_receipts_purge_completed(cli, store_from_a_run):
    done = cli.run("receipts", "purge", "--db", store_from_a_run, "--status", "completed", "--yes")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"purged {ROWS} receipts"
    assert cli.run("receipts", "purge", "--db", store_from_a_run, "--yes").stdout.startswith("no completed")
    after = cli.run("receipts", "stats", "--db", store_from_a_run)
    assert after.returncode == 0
    assert "completed" not in after.stdout


def test_cli_output_salvage_ls_empty(cli, store_from_a_run):
    salvage = store_from_a_run.parent / "receipts.db.salvage.jsonl"
    salvage.write_text("", encoding="utf-8")

    done = cli.run("salvage", "ls", "--db", store_from_a_run)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 salvaged"


ODD_CELLS = {
    "status-blob": "status = x'ff00'",
    "tool-blob": "tool_id = x'00ff'",
    "tool-number": "tool_id = 7",
    "tool-markup": "tool_id = 'sq[/x] :smile:'",
    "key-number": "key = 12345",
    "attempts-text": "attempts = 'many'",
    "org-blob": "org_id = x'01'",
}


@pytest.mark.parametrize("odd", list(ODD_CELLS))
def test_cli_output_receipts_stats_and_ls_show_columns_set_by_hand(cli, store_from_a_run, odd):
    """A column set by hand to a BLOB, a number, NULL or text that looks like rich's markup:
    ``receipts stats`` and ``ls`` crashed (NotRenderableError, MarkupError) on it (breaker
    round 3); every cell is shown as text, as stored."""
    with sqlite3.connect(store_from_a_run) as conn:
        (key,) = conn.execute("SELECT key FROM receipts ORDER BY updated_at DESC LIMIT 1").fetchone()
        conn.execute(f"UPDATE receipts SET {ODD_CELLS[odd]}, updated_at = 1e12 WHERE key = ?", (key,))
    for command in (("stats",), ("ls", "--limit", "3")):
        done = cli.run("receipts", *command, "--db", store_from_a_run)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
    if odd == "tool-markup":
        assert "sq[/x] :smile:" in done.stdout  # as stored, not read as markup or an emoji code


def test_cli_salvage_ls_shows_error_text_that_looks_like_markup(cli, store_from_a_run):
    from actors.flusher.salvage import SalvageLog, salvage_entry

    log = SalvageLog(store_from_a_run.parent / "receipts.db.salvage.jsonl")
    log.append([salvage_entry(
        key="k" * 64, org_id="default", scope="s", tool_id="t[/b]", input_hash="h", output={"v": 1},
        attempts=3, first_error_at=None, error="ValueError: [/x] not [bold]", lease_id=None,
    )])  # fmt: skip
    done = cli.run("salvage", "ls", "--db", store_from_a_run)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "t[/b]" in done.stdout and "[/x]" in done.stdout


UNKNOWN_STATUS_PLAY = """
from actors import Tool

tools = [Tool(tool_id="t", fn=lambda input, ctx: {"v": input["n"]})]

def play(row, ctx):
    return ctx.tool("t", {"n": int(row)})
"""


def test_cli_resolve_decides_an_unknown_status_as_the_error_says(cli, tmp_path):
    play = tmp_path / "p.py"
    play.write_text(UNKNOWN_STATUS_PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("1\n2\n3\n", encoding="utf-8")
    db = tmp_path / "receipts.db"
    out = tmp_path / "out.jsonl"
    args = ("run", play, "--input", rows, "--db", db, "--output", out)
    assert cli.run(*args).returncode == 0
    with sqlite3.connect(db) as conn:
        key = conn.execute("SELECT key FROM receipts ORDER BY rowid LIMIT 1").fetchone()[0]
        conn.execute("UPDATE receipts SET status = 'done' WHERE key = ?", (key,))
    again = cli.run(*args)
    said = again.stderr + out.read_text()
    told = re.search(r"receipts resolve ([0-9a-f]{16}) --rerun", said)
    assert told is not None, said[-2000:]
    resolved = cli.run("receipts", "resolve", told.group(1), "--rerun", "--db", db)
    assert resolved.returncode == 0, (
        f"the run said `tooldispatch receipts resolve {told.group(1)} --rerun`; it answered "
        f"rc={resolved.returncode}: {resolved.stderr.strip()}"
    )
