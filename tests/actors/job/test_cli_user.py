"""``tooldispatch`` as a new user meets it: input that never loses rows, counters that
answer the paying user, errors grouped by kind, help everywhere, receipts and salvage
commands that say what they do. Real files, the CLI in its own process."""

from __future__ import annotations

import re
import sqlite3

import pytest

pytestmark = pytest.mark.scenario

ECHO_PLAY = """
from actors import Tool

tools = [
    Tool(tool_id="lookup", fn=lambda input, ctx: {"got": input}, provider="acme"),
    Tool(tool_id="tidy", fn=lambda input, ctx: str(input["v"]).strip().lower(), durable=False),
]


def play(row, ctx):
    value = row["domain"] if isinstance(row, dict) else row
    if value.startswith("bad"):
        raise ValueError(f"not a domain name: {value!r} (row {value[3:]})")
    if value.startswith("long"):
        raise LookupError(f"provider said {{'error': {'x' * 300!r}, 'row': {value!r}}}")
    return ctx.tool("lookup", {"domain": ctx.tool("tidy", {"v": value})})
"""

BILLED = "receipts completed this run (calls that ran)"


@pytest.fixture
def play(tmp_path):
    path = tmp_path / "echo_play.py"
    path.write_text(ECHO_PLAY, encoding="utf-8")
    return path


def _one_line_error(done, *fragments):
    assert done.returncode == 2, (done.returncode, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("tooldispatch: error:")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def _receipts(db):
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("select status, count(*) from receipts group by status").fetchall())


# -- input that never loses rows ------------------------------------------------------


def test_cli_csv_quote_never_closed_names_its_line_and_sends_nothing_for_what_it_swallowed(
    cli, play, tmp_path
):
    rows = tmp_path / "rows.csv"
    rows.write_text(
        'domain,note\nexample.com,fine\nlemonde.fr,"unterminated note\nbbc.co.uk,after\nlast.it,end\n',
        encoding="utf-8",
    )
    out, db = tmp_path / "out.jsonl", tmp_path / "r.db"

    done = cli.run("run", play, "--input", rows, "--db", db, "--output", out)

    error = _one_line_error(done, "line 3", "never closed")
    assert "lines 3-5" in error
    assert [line["row"]["domain"] for line in cli.read_jsonl(out)] == ["example.com"]
    assert _receipts(db) == {"completed": 1}  # nothing sent for lemonde.fr or the rows after it


def test_cli_csv_quote_never_closed_in_a_large_file_names_its_line_not_the_field_limit(cli, play, tmp_path):
    rows = tmp_path / "rows.csv"
    body = "".join(f"site{n}.example,note {n}\n" for n in range(20_000))  # ~500 KB swallowed
    rows.write_text(f'domain,note\nfirst.fr,ok\nlemonde.fr,"open\n{body}', encoding="utf-8")

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db")

    _one_line_error(done, "line 3", "never closed")
    assert "field limit" not in done.stderr


def test_cli_csv_stray_quote_that_closes_later_fails_the_rows_it_swallowed_by_line(cli, play, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text('domain,note\na.fr,"x\nb.fr,y\nc.fr,"z\nd.fr,w\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr
    lines = cli.read_jsonl(out)
    assert len(lines) == 2
    assert "lines 2-4" in lines[0]["error"] and "RowError" in lines[0]["error"]
    assert lines[1]["row"] == {"domain": "d.fr", "note": "w"} and lines[1]["error"] is None


def test_cli_csv_field_of_200_kb_is_read_whole(cli, play, tmp_path):
    note = "é" * 100_000 + "x" * 100_000  # 300 KB of UTF-8, 200,000 characters
    rows = tmp_path / "rows.csv"
    rows.write_text(f'domain,note\nlemonde.fr,"{note}"\nbbc.co.uk,short\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 0, done.stderr[-2000:]
    lines = cli.read_jsonl(out)
    assert [line["row"]["domain"] for line in lines] == ["lemonde.fr", "bbc.co.uk"]
    assert lines[0]["row"]["note"] == note


def test_cli_input_that_is_a_directory_says_so(cli, play, tmp_path):
    folder = tmp_path / "rows.csv"
    folder.mkdir()

    done = cli.run("run", play, "--input", folder, "--db", tmp_path / "r.db")

    error = _one_line_error(done, "is a directory")
    assert "not found" not in error


@pytest.mark.parametrize(
    ("name", "text"), [("empty.txt", ""), ("blank.txt", "\n\n"), ("header.csv", "domain\n")]
)
def test_cli_input_without_rows_says_so(cli, play, tmp_path, name, text):
    rows = tmp_path / name
    rows.write_text(text, encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    _one_line_error(done, "input has no rows", name)
    assert not out.exists()


# -- counters that tell the truth -----------------------------------------------------


def test_cli_report_headline_counts_what_was_billed_and_reused_and_local_tools_apart(cli, play, tmp_path):
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"site{n % 40}.fr\n" for n in range(200)), encoding="utf-8")  # 40 unique
    db = tmp_path / "r.db"

    first = cli.run("run", play, "--input", rows, "--db", db)
    more = tmp_path / "more.txt"
    more.write_text("".join(f"site{n}.fr\n" for n in range(30, 50)), encoding="utf-8")  # 10 old, 10 new
    second = cli.run("run", play, "--input", more, "--db", db)

    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    one, two = cli.report(first.stderr), cli.report(second.stderr)
    assert one[BILLED] == "40"
    calls = {k: int(one[k]) for k in ("reused within this run (calls)", "joined a lookup in flight (calls)")}
    assert sum(calls.values()) == 160  # every other call was answered by this run's 40 lookups
    assert re.fullmatch(r"40 \(0 answered 429\)", one["requests sent to acme"])
    assert two[BILLED] == "10"
    assert two["reused from earlier runs"] == "10 receipts (10 calls)"
    assert two["requests sent to acme"] == "10 (0 answered 429)"  # the local tool's runs are not requests
    assert two["local tool tidy (free)"] == "20 calls, 20 runs"
    assert "requests sent to tidy" not in two
    assert "in-flight" not in second.stderr  # named for what it is: calls that joined a lookup
    per_tool = cli.tools_report(second.stderr)
    assert set(per_tool) == {"lookup", "tidy (local, free)"}
    assert per_tool["lookup"]["requests sent"] == 10
    assert (
        per_tool["tidy (local, free)"]["requests sent"] is None
    )  # no provider: no request rows, not 0 or runs
    assert per_tool["tidy (local, free)"]["429s"] is None
    # a third run sends nothing: the local tool's runs are timed apart, not as requests
    third = cli.report(cli.run("run", play, "--input", more, "--db", db).stderr)
    assert third["requests sent to acme"] == "0 (0 answered 429)"
    assert "provider request p50 / p95" not in third and "local tool run p50 / p95" in third


def test_cli_report_groups_row_errors_by_kind_with_one_example(cli, play, tmp_path):
    rows = tmp_path / "rows.txt"
    bad = [f"bad{n}.fr" for n in range(7)] + [f"long{n}.fr" for n in (1, 22, 333)]
    rows.write_text("".join(f"{r}\n" for r in bad) + "good.fr\n", encoding="utf-8")

    # wide enough for a label and its example on one line each (the table wraps cells)
    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", env=cli.env(COLUMNS="400"))

    assert done.returncode == 1, done.stderr
    report = cli.report(done.stderr)
    errors = {k: v for k, v in report.items() if k.startswith("error")}
    assert errors["error: ValueError: not a domain name: '…' (row N.fr) (7 rows)"] == (
        "e.g. ValueError: not a domain name: 'bad0.fr' (row 0.fr)"
    )
    # a long message is abstracted whole, then cut: one kind, however its values differ; its
    # label keeps the values every message shares (a long one cut), abstracts the others
    label = "error: LookupError: provider said {'error': '" + "x" * 37 + "…', 'row': '…'} (3 rows)"
    assert errors[label].startswith("e.g. LookupError: provider said {'error': 'xxx"), errors
    assert len(errors) == 2


# -- help, receipts, salvage ----------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [(), ("run",), ("receipts",), ("receipts", "ls"), ("receipts", "stats"), ("receipts", "show"),
     ("receipts", "purge"), ("salvage",), ("salvage", "ls"), ("salvage", "replay")],
)  # fmt: skip
def test_cli_dash_h_is_help_everywhere(cli, command):
    short, long = cli.run(*command, "-h"), cli.run(*command, "--help")

    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout
    assert short.stdout.startswith("Usage: ")
    assert "..." not in short.stdout.split("Commands:")[-1] if "Commands:" in short.stdout else True


def test_cli_run_help_lists_exit_codes(cli):
    done = cli.run("run", "-h")

    assert done.returncode == 0
    text = done.stdout
    assert "Exit codes:" in text
    for code in ("0 ", "1 ", "2 ", "130 "):
        assert re.search(rf"^\s+{code}", text, re.M), (code, text)
    assert "SIGTERM" in text


def test_cli_receipts_ls_refuses_an_unknown_status_like_purge(cli, play, tmp_path):
    rows = tmp_path / "rows.txt"
    rows.write_text("a.fr\n", encoding="utf-8")
    db = tmp_path / "r.db"
    assert cli.run("run", play, "--input", rows, "--db", db).returncode == 0

    listed = cli.run("receipts", "ls", "--db", db, "--status", "bogus")
    purged = cli.run("receipts", "purge", "--db", db, "--status", "bogus", "--yes")

    _one_line_error(listed, "'bogus'", "completed")
    _one_line_error(purged, "'bogus'", "completed")
    assert listed.stderr == purged.stderr


def test_cli_receipts_purge_counts_first_in_the_singular_and_declining_is_not_an_error(cli, play, tmp_path):
    rows = tmp_path / "rows.txt"
    rows.write_text("a.fr\n", encoding="utf-8")
    db = tmp_path / "r.db"
    assert cli.run("run", play, "--input", rows, "--db", db).returncode == 0

    declined = cli.run("receipts", "purge", "--db", db, input="n\n")
    accepted = cli.run("receipts", "purge", "--db", db, input="y\n")

    assert declined.returncode == 0, declined.stderr
    assert "delete 1 receipt (" in declined.stdout
    assert declined.stdout.strip().endswith("nothing deleted")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip().endswith("purged 1 receipt")


def test_cli_salvage_replay_on_a_healthy_store_creates_nothing(cli, play, tmp_path):
    rows = tmp_path / "rows.txt"
    rows.write_text("a.fr\n", encoding="utf-8")
    db = tmp_path / "r.db"
    assert cli.run("run", play, "--input", rows, "--db", db).returncode == 0
    before = sorted(p.name for p in tmp_path.iterdir())

    done = cli.run("salvage", "replay", "--db", db)

    assert done.returncode == 0, done.stderr
    assert "nothing to replay" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_demo_says_where_its_files_are_on_a_fresh_run_and_a_rerun(cli, tmp_path):
    """The README's first command: the demo, run twice, as a new user would (from an empty
    directory): stdout says where the city list, the provider and the receipts are, both
    times, and the rerun sends no request."""
    import subprocess
    import sys

    work = tmp_path / ".tooldispatch-demo"
    runs = [
        subprocess.run(
            [sys.executable, str(cli.examples / "demo.py")],
            cwd=tmp_path,
            env=cli.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
        )
        for _ in range(2)
    ]

    counts = []
    for done, how in zip(runs, ("written now", "from an earlier run"), strict=True):
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.splitlines()
        city_list = re.fullmatch(
            rf"city list: {re.escape(str(work / 'cities.csv'))} \((\d+) cities, {how}\)", lines[0]
        )
        assert city_list is not None, lines
        counts.append(int(city_list.group(1)))
        assert re.fullmatch(r"provider listening on http://127\.0\.0\.1:\d+", lines[1]), lines
        assert lines[2] == f"receipts in {work / 'receipts.db'}", lines
        assert lines[3].startswith("provider served "), lines
    assert counts[0] == counts[1] > 30_000
    assert runs[1].stdout.splitlines()[3].startswith("provider served 0 requests"), runs[1].stdout
