"""What ``tooldispatch run`` says matches what it counts: a JSONL integer no JSON number
keeps is a row error said plainly (not a failed call), sizes leave the line ending out
in every format, progress counts rows (CSV records) and says what its figures count, and
the report says when a run paid nothing and when it was a forced refresh.

The plays are tiny files in ``tmp_path`` with function tools (no HTTP); the CLI runs in
its own process, the reader in this one on real files.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.job import rows as rows_module
from actors.job.report import output_line, resume_hint
from actors.job.rows import InputError, RowError, count_rows, read_rows
from actors.job.runner import RunSummary
from stores import MAX_INPUT_BYTES
from stores.errors import InvalidInputError
from stores.inputs import check_input_size

pytestmark = pytest.mark.scenario

ECHO_PLAY = """
from actors import Tool


def echo(input, ctx):
    return input


tools = [Tool(tool_id="echo", fn=echo)]


def play(row, ctx):
    if row == "unsafe":  # the play builds an input no JSON number keeps: refused, not sent
        return ctx.tool("echo", {"n": 2**60})
    return ctx.tool("echo", {"row": row})
"""

PROGRESS = re.compile(
    r"^progress: rows (\d+)/(\d+) \((\d+\.\d)%\) \| calls: (\d+) ran, (\d+) reused, (\d+) joined, "
    r"(\d+) failed(?:, (\d+) input refused)? \| "
    r"requests sent (\d+) \((\d+) sent again, (\d+) answered 429\) \|",
    re.MULTILINE,
)


@pytest.fixture
def echo_play(tmp_path: Path) -> Path:
    path = tmp_path / "echo_play.py"
    path.write_text(ECHO_PLAY, encoding="utf-8")
    return path


def _read(path: Path) -> list[Any]:
    return [("RowError", str(r)) if isinstance(r, RowError) else r for r in read_rows(str(path))]


def _last_progress(stderr: str) -> re.Match[str]:
    found = list(PROGRESS.finditer(stderr))
    assert found, stderr[-3000:]
    return found[-1]


# -- 1. a JSONL integer no JSON number keeps ----------------------------------------------


def test_read_rows_jsonl_integer_no_double_keeps_fails_its_row_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"id": 12345678901234567}',  # within 64 bits: read as an int, refused by the key rule
                '{"id": 12345678901234567890123}',  # past 64 bits: orjson would read another number
                "[-99999999999999999999999999999999999]",
                '{"id": 100000000000000000000}',  # past 64 bits, but a double holds it exactly: 1e20
                '{"id": 9007199254740991, "s": "12345678901234567890123"}',  # the largest safe one; a string
            ]
        )
        + "\n",
        encoding="utf-8",
    )

    got = _read(path)

    outside = "is outside the range JSON numbers keep exactly (±(2^53-1)); quote it as a string"
    assert got[0] == ("RowError", f"line 1: integer 12345678901234567 {outside}")
    assert got[1] == ("RowError", f"line 2: integer 12345678901234567890123 {outside}")
    assert got[2] == ("RowError", f"line 3: integer -99999999999999999999… (35 digits) {outside}")
    assert got[3] == {"id": 1e20}
    assert got[4] == {"id": 9007199254740991, "s": "12345678901234567890123"}


def test_check_input_size_names_an_integer_no_double_keeps_plainly() -> None:
    outside = "is outside the range JSON numbers keep exactly (±(2^53-1)); pass it as a string"
    cases = {
        "integer 12345678901234567": {"a": [1, {"b": 12345678901234567}]},
        "integer -9007199254740992": -(2**53),
        "integer 10000000000000000000… (41 digits)": [10**40],
        "an integer of about 5000 digits": {"huge": 10**5000},  # its str() would raise
    }
    for named, value in cases.items():
        with pytest.raises(InvalidInputError) as raised:
            check_input_size(value)
        assert str(raised.value) == f"input is not canonical JSON: {named} {outside}"


def test_cli_input_errors_are_row_errors_and_a_refused_input_is_no_failed_call(
    cli: Any, echo_play: Path, tmp_path: Path
) -> None:
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('"a"\n{"id": 12345678901234567}\n{"not json\n"unsafe"\n"b"\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", echo_play, "--input", jsonl, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr
    report = cli.report(done.stderr)
    assert report["rows"] == "5 (2 ok, 3 failed)"
    # the row errors are no calls; the play's refused input is a call, but its tool never ran
    assert report["calls failed"] == "0", report
    assert report["calls refused for their input (nothing sent)"] == "1", report
    assert report["receipts completed this run (calls that ran)"] == "2"
    assert cli.tools_report(done.stderr)["echo"]["input refused (nothing sent)"] == 1
    errors = [line["error"] for line in cli.read_jsonl(out)]
    assert errors[1] == (
        "RowError: line 2: integer 12345678901234567 is outside the range JSON numbers keep exactly "
        "(±(2^53-1)); quote it as a string"
    )
    # where the line stops being JSON: a column of that line (orjson's own "line 2" was its ending)
    assert errors[2] == "RowError: line 3: not JSON (unexpected control character in string: column 11)"
    assert errors[3].startswith(
        "InvalidInputError: input is not canonical JSON: integer 1152921504606846976 "
    )
    last = _last_progress(done.stderr)
    assert (last[7], last[8]) == ("0", "1"), last[0]  # 0 failed, 1 input refused

    csv_rows = tmp_path / "rows.csv"
    csv_rows.write_text('name,n\na,1\nb\n"c\nd",2\n', encoding="utf-8")

    done = cli.run("run", echo_play, "--input", csv_rows, "--db", tmp_path / "r.db")

    report = cli.report(done.stderr)
    assert report["rows"] == "3 (2 ok, 1 failed)" and report["calls failed"] == "0", report
    assert "calls refused for their input (nothing sent)" not in report


# -- 2. sizes leave the line ending out, in every format ------------------------------------


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
@pytest.mark.parametrize("name", ["rows.txt", "rows.jsonl", "rows.csv"])
def test_read_rows_size_of_a_line_over_the_cap_leaves_its_ending_out_in_every_format(
    tmp_path: Path, name: str, ending: str
) -> None:
    path = tmp_path / name
    quote = '"' if name.endswith(".jsonl") else ""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write("domain" + ending if name.endswith(".csv") else "")
        fh.write(quote + "x" * (MAX_INPUT_BYTES + 1 - 2 * len(quote)) + quote + ending)
        fh.write(quote + "b.fr" + quote + ending)
    number = 2 if name.endswith(".csv") else 1

    got = _read(path)

    assert got[0] == (
        "RowError",
        f"line {number}: input too large: the line is {MAX_INPUT_BYTES + 1} bytes; "
        f"the cap is {MAX_INPUT_BYTES} bytes (32 MiB)",
    )
    assert got[1] in ("b.fr", {"domain": "b.fr"})


def test_read_rows_csv_line_at_the_cap_is_measured_without_its_ending_and_a_record_with_the_ones_inside(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rows.csv"
    half = MAX_INPUT_BYTES // 2
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write("d\r\n" + "x" * MAX_INPUT_BYTES + "\r\n")  # at the cap as a line: its JSON text is over
        fh.write(
            '"' + "y" * half + "\r\n" + "y" * (half - 4) + '"\r\n'
        )  # 2 quotes, the ending inside: at the cap
        fh.write('"' + "z" * half + "\r\n" + "z" * (half - 3) + '"\r\n')  # one byte over
        fh.write("b.fr\r\n")

    json_text = MAX_INPUT_BYTES + len('{"d":""}')

    got = _read(path)

    assert got[0] == (
        "RowError",
        f"line 2: input too large: its JSON text is {json_text} bytes; "
        f"the cap is {MAX_INPUT_BYTES} bytes (32 MiB)",
    )
    assert got[1][0] == "RowError" and got[1][1].startswith("lines 3-4: input too large: its JSON text is ")
    assert got[2] == (
        "RowError",
        f"lines 5-6: input too large: the record is {MAX_INPUT_BYTES + 1} bytes; "
        f"the cap is {MAX_INPUT_BYTES} bytes (32 MiB)",
    )
    assert got[3] == {"d": "b.fr"}


# -- 3. progress counts rows: CSV records, every format ----------------------------------


def test_cli_progress_counts_csv_records_not_lines(cli: Any, echo_play: Path, tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text('name,note\na,1\n"b\nstill b",2\n\nc,3\nd,"4\r\n4"\n', encoding="utf-8")

    done = cli.run("run", echo_play, "--input", rows, "--db", tmp_path / "r.db")

    assert done.returncode == 0, done.stderr
    last = _last_progress(done.stderr)
    assert last.group(1, 2, 3) == ("4", "4", "100.0"), last[0]


def _temp_file(text: str, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    return Path(name)


_TEXT = st.lists(
    st.sampled_from(["a", "é", ",", '"', '""', "\n", "\r", "\r\n", " ", "\u00a0", "\x1c", "b,"]), max_size=40
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    body=_TEXT, suffix=st.sampled_from([".csv", ".txt", ".jsonl"]), chunk=st.sampled_from([1, 2, 3, 7, 4096])
)
def test_count_rows_counts_the_rows_read_rows_yields_whatever_the_chunks(
    body: str, suffix: str, chunk: int
) -> None:
    path = _temp_file(("h1,h2\n" if suffix == ".csv" else "") + body, suffix)
    try:
        try:
            expected = sum(1 for _ in read_rows(str(path)))
        except InputError:  # a quote never closed: the run stops there, whatever the total
            return
        with mock.patch.object(rows_module, "COUNT_CHUNK_CHARS", chunk):
            assert count_rows(str(path)) == expected, io.StringIO(body).getvalue()
    finally:
        path.unlink()


# -- 4. the progress line's words -------------------------------------------------------------


def test_cli_progress_line_says_what_its_figures_count(cli: Any, echo_play: Path, tmp_path: Path) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nb\na\n", encoding="utf-8")

    done = cli.run("run", echo_play, "--input", rows, "--db", tmp_path / "r.db", "--concurrency", "1")

    assert done.returncode == 0, done.stderr
    last = _last_progress(done.stderr)
    report = cli.report(done.stderr)
    ran, reused, requests = int(last[4]), int(last[5]), int(last[9])
    assert ran == int(report["receipts completed this run (calls that ran)"]) == 2
    assert reused == int(report["reused within this run (calls)"]) == 1
    assert f"{requests} (0 answered 429)" == report["requests sent to echo"] == "2 (0 answered 429)"
    assert int(last[10]) == int(report["retries (requests sent again)"]) == 0


# -- 5. a run that paid nothing; a forced refresh ------------------------------------------


def test_cli_report_says_a_rerun_paid_nothing_and_names_a_forced_refresh(
    cli: Any, echo_play: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nb\nc\n", encoding="utf-8")
    run = ("run", echo_play, "--input", rows, "--db", tmp_path / "r.db")

    first = cli.report(cli.run(*run).stderr)
    again = cli.report(cli.run(*run).stderr)
    forced = cli.report(cli.run(*run, "--force-refresh").stderr)

    assert "paid this run" not in first and "--force-refresh" not in first, first
    assert again["requests sent to echo"] == "0 (0 answered 429)"
    assert again["paid this run"] == "nothing: no request sent, every call answered from receipts"
    assert "--force-refresh" not in again
    assert forced["requests sent to echo"] == "3 (0 answered 429)" and "paid this run" not in forced
    assert forced["--force-refresh"] == "calls ran again even where a receipt was completed (paid again)"


def test_report_resume_hint_under_force_refresh_does_not_say_finished_calls_are_free() -> None:
    summary = RunSummary(rows=2, written=2, interrupted=True)

    plain = output_line(summary, "out.jsonl")
    forced = output_line(summary, "out.jsonl", force_refresh=True)

    assert "not paid again" in plain and "not paid again" in resume_hint()
    for text in (forced, resume_hint(force_refresh=True)):
        assert "not paid again" not in text and "with --force-refresh every call runs again" in text
        assert "(paid again)" in text


def test_cli_stop_on_a_configuration_error_counts_only_paid_requests(cli: Any, tmp_path: Path) -> None:
    play = tmp_path / "typo_play.py"
    play.write_text(
        "from actors import Tool\n"
        "tools = [Tool(tool_id='free', fn=lambda input, ctx: input, durable=False),\n"
        "         Tool(tool_id='paid', fn=lambda input, ctx: input)]\n"
        "def play(row, ctx):\n"
        "    ctx.tool('free', {'row': row})\n"
        "    if row == 'paid':\n"
        "        ctx.tool('paid', {'row': row})\n"
        "    if row == 'typo':\n"
        "        ctx.tool('no_such_tool', 1)\n",
        encoding="utf-8",
    )
    free_only = tmp_path / "free.txt"
    free_only.write_text("a\nb\ntypo\n", encoding="utf-8")
    paid = tmp_path / "paid.txt"
    paid.write_text("paid\ntypo\n", encoding="utf-8")
    args = ("--db", tmp_path / "r.db", "--concurrency", "1")

    done = cli.run("run", play, "--input", free_only, *args)
    forced = cli.run("run", play, "--input", paid, *args, "--force-refresh")

    assert done.returncode == 2, done.stderr
    assert "; no provider request had been sent)" in done.stderr, done.stderr
    assert forced.returncode == 2, forced.stderr
    assert "1 provider request had been sent" in forced.stderr
    assert "with --force-refresh pays for them again" in forced.stderr, forced.stderr
    assert "does not pay for them" not in forced.stderr


def test_count_rows_reads_a_file_as_read_rows_does(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps("a") + "\r\u00a0\r" + json.dumps("b") + "\r", encoding="utf-8")

    assert count_rows(str(path)) == sum(1 for _ in read_rows(str(path))) == 2


def test_cli_report_shows_what_was_spent_and_saved_by_the_tools_prices(cli: Any, tmp_path: Path) -> None:
    play = tmp_path / "priced_play.py"
    play.write_text(
        "from stores import Money\n"
        "from actors import Tool\n"
        "tools = [Tool(tool_id='verify', provider='acme', fn=lambda input, ctx: input,\n"
        "              price=Money('0.002', 'USD'))]\n"
        "def play(row, ctx):\n"
        "    return ctx.tool('verify', {'row': row})\n",
        encoding="utf-8",
    )
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nb\nc\nd\n", encoding="utf-8")
    run = ("run", play, "--input", rows, "--db", tmp_path / "r.db")

    first = cli.report(cli.run(*run, "--report-json", tmp_path / "first.json").stderr)
    again = cli.report(cli.run(*run, "--report-json", tmp_path / "again.json").stderr)

    saved = "saved at acme (answered from receipts, at what they cost when paid)"
    assert first["spent at acme (by the tools' prices)"] == "0.008 USD", first
    assert saved not in first, first
    assert "spent at acme (by the tools' prices)" not in again, again  # a rerun spends nothing
    assert again[saved] == "0.008 USD", again
    first_json = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    again_json = json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))
    assert first_json["status"] == "finished" and first_json["rows"]["total"] == 4
    assert first_json["ledger"]["spent"]["providers"] == {"acme": {"USD": "0.008"}}
    assert first_json["ledger"]["saved"]["total"] == {}
    assert again_json["ledger"]["spent"]["total"] == {}
    assert again_json["ledger"]["saved"]["tools"] == {"verify": {"USD": "0.008"}}
    assert again_json["calls"]["reused"] == 4 and again_json["providers"]["acme"]["requests"] == 0
