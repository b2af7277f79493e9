"""The input cap in ``tooldispatch run``: every input format holds a row to
``MAX_INPUT_BYTES`` as the host API does. A line (a CSV record) over it is passed over
unread, a chunk at a time, and its row fails alone; nothing of it is sent or billed; the
output and the report quote rows and errors shortened.

The reader is tested in-process on real files (the cap is not configurable: the files
are a little over 32 MiB); the command line in its own process, against the example
provider, with its peak memory measured.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import tracemalloc
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.job import rows as rows_module
from actors.job.play import Play
from actors.job.rows import InputError, RowError, count_rows, read_rows
from actors.job.runner import run_rows
from stores import MAX_ERROR_CHARS, MAX_INPUT_BYTES

MiB = 1024 * 1024
OVER = MAX_INPUT_BYTES + MiB
"""Characters of a value over the cap (by 1 MiB)."""


def write_big(path: Path, head: str, size: int, tail: str, fill: str = "x", per_line: int = 0) -> None:
    """``head``, ``fill`` repeated ``size`` times (a line break after every ``per_line``
    repeats when given), ``tail``; written a MiB at a time."""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(head)
        left = size
        while left > 0:
            n = min(left, per_line or MiB)
            fh.write(fill * n + ("\n" if per_line else ""))
            left -= n
        fh.write(tail)


def read_all(path: Path) -> list[Any]:
    return [("RowError", str(r)) if isinstance(r, RowError) else r for r in read_rows(str(path))]


# -- the reader -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "head", "tail", "small"),
    [
        ("rows.txt", "lemonde.fr\n", "\nbbc.co.uk\n", ["lemonde.fr", "bbc.co.uk"]),
        ("rows.jsonl", '"lemonde.fr"\n"', '"\n"bbc.co.uk"\n', ["lemonde.fr", "bbc.co.uk"]),
        (
            "rows.csv",
            'domain\nlemonde.fr\n"',
            '"\nbbc.co.uk\n',
            [{"domain": "lemonde.fr"}, {"domain": "bbc.co.uk"}],
        ),
    ],
)
def test_read_rows_line_over_the_cap_fails_alone_in_every_format(
    tmp_path: Path, name: str, head: str, tail: str, small: list[Any]
) -> None:
    path = tmp_path / name
    write_big(path, head, OVER, tail)
    number = head.count("\n") + 1

    got = read_all(path)

    assert [got[0], got[2]] == small
    kind, message = got[1]
    assert kind == "RowError"
    assert message.startswith(f"line {number}: input too large: the line is ")
    assert f"the cap is {MAX_INPUT_BYTES} bytes" in message and len(message) < 200


def test_read_rows_never_holds_a_line_over_the_cap_whole(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    write_big(path, "a.fr\n", 2 * MAX_INPUT_BYTES, "\nb.fr\n")

    tracemalloc.start()
    try:
        got = read_all(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert got[0] == "a.fr" and got[2] == "b.fr" and got[1][0] == "RowError"
    assert peak < 1.25 * MAX_INPUT_BYTES, (
        f"peak {peak / MiB:.0f} MiB reading a {2 * MAX_INPUT_BYTES // MiB} MiB line"
    )


def test_read_rows_csv_closed_field_over_the_cap_fails_alone_without_the_unclosed_quote_hint(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rows.csv"
    write_big(path, 'domain,note\na.fr,ok\nb.fr,"', OVER, '"\nc.fr,end\n')

    got = read_all(path)

    assert got[0] == {"domain": "a.fr", "note": "ok"} and got[2] == {"domain": "c.fr", "note": "end"}
    kind, message = got[1]
    assert kind == "RowError" and message.startswith("line 3: input too large: the line is ")
    assert "never closed" not in message and "quote" not in message


def test_read_rows_csv_quoted_field_over_the_cap_across_lines_fails_as_one_record(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    # a quoted field of 1 KB lines holding commas and doubled quotes, 33 MiB in all
    reps = OVER // 5 + 1
    write_big(
        path, 'domain,note\na.fr,ok\nb.fr,"start', reps, 'end"\nc.fr,"x,""y"""\n', fill='a,""b', per_line=200
    )
    last = 3 + -(-reps // 200)  # the line holding end"

    got = read_all(path)

    assert got[0] == {"domain": "a.fr", "note": "ok"}
    assert got[1] == ("RowError", got[1][1]) and got[1][1].startswith(
        f"lines 3-{last}: input too large: the record is "
    )
    assert got[2] == {"domain": "c.fr", "note": 'x,"y"'}
    assert len(got) == 3


def test_read_rows_csv_quote_never_closed_past_the_cap_names_the_line_it_opened_on(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_big(
        path, 'domain,note\na.fr,ok\nb.fr,fine\nc.fr,"open', OVER // 8, "", fill="d.fr,row", per_line=100
    )

    rows = read_rows(str(path))
    assert next(rows) == {"domain": "a.fr", "note": "ok"}
    assert next(rows) == {"domain": "b.fr", "note": "fine"}
    with pytest.raises(InputError, match=r"^line 4: a quote opened on this line is never closed; lines 4-"):
        next(rows)


def test_read_rows_csv_header_over_the_cap_stops_the_read(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_big(path, "", OVER, "\na.fr\n")

    with pytest.raises(InputError, match=r"^line 1 \(the CSV header\): input too large"):
        read_all(path)


def test_read_rows_row_whose_json_text_is_over_the_cap_fails_alone(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    control = MAX_INPUT_BYTES // 6 + 1  # each is 1 byte in the file, 6 in JSON ("\\u0001")
    write_big(path, "a.fr\nx", control, "\nb.fr\n", fill="\x01")

    got = read_all(path)

    assert got[0] == "a.fr" and got[2] == "b.fr"
    assert got[1][0] == "RowError" and got[1][1].startswith("line 2: input too large: its JSON text is ")


BIG_NUMBER = "100000000000000000000"
"""1e20 in canonical form: orjson reads it as a float and writes ``1e+20``, 16 bytes less."""


def boundary_rows(name: str, size: int) -> tuple[str, int, str]:
    """(head, repeats of "x", tail) of one row of format ``name`` whose canonical JSON text
    is ``size`` bytes, written as a line of the file in canonical form."""
    if name.endswith(".txt"):
        return "", size - 2, ""  # the line is the string: its text and two quotes
    if name.endswith(".csv"):
        return "", size - len('{"domain":""}'), ""
    head = '{"n":[' + ",".join([BIG_NUMBER] * 1000) + '],"pad":"'
    return head, size - len(head) - 2, '"}'


@pytest.mark.parametrize("name", ["rows.txt", "rows.csv", "rows.jsonl"])
def test_read_rows_holds_a_row_to_the_cap_by_its_canonical_text_in_every_format(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    first, last = ('"a.fr"\n', '"b.fr"\n') if name.endswith(".jsonl") else ("a.fr\n", "b.fr\n")
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(("domain\n" if name.endswith(".csv") else "") + first)
        for size in (MAX_INPUT_BYTES, MAX_INPUT_BYTES + 1):  # at the cap, one byte over
            head, repeats, tail = boundary_rows(name, size)
            fh.write(head + "x" * repeats + tail + "\n")
        fh.write(last)
    number = 3 if name.endswith(".csv") else 2

    got = read_all(path)

    assert len(got) == 4 and got[3] in ("b.fr", {"domain": "b.fr"})
    assert not isinstance(got[1], tuple), got[1][1][:300]  # at the cap: read, as execute takes it
    assert len(rfc8785.dumps(got[1])) == MAX_INPUT_BYTES
    kind, message = got[2]
    assert kind == "RowError"
    # a JSONL line in canonical form is as long as its canonical text: the line rule says so first
    what = "the line" if name.endswith(".jsonl") else "its JSON text"
    assert message.startswith(f"line {number + 1}: input too large: {what} is {MAX_INPUT_BYTES + 1} bytes;")


@pytest.mark.waits
def test_read_rows_jsonl_value_is_measured_by_its_canonical_text_not_as_written(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    short = '{"n":[' + ",".join(["1e20"] * 1000) + '],"pad":"'  # 1e20: 4 bytes here, 21 in canonical form
    grows = len(BIG_NUMBER) - len("1e20")
    with open(path, "w", encoding="utf-8", newline="") as fh:
        for size in (MAX_INPUT_BYTES, MAX_INPUT_BYTES + 1):
            fh.write(short + "x" * (size - len(short) - 2 - 1000 * grows) + '"}\n')

    got = read_all(path)

    assert len(rfc8785.dumps(got[0])) == MAX_INPUT_BYTES
    assert got[1][0] == "RowError"
    assert got[1][1].startswith(f"line 2: input too large: its JSON text is {MAX_INPUT_BYTES + 1} bytes;")


def _temp_file(text: str, suffix: str) -> Path:
    """A file holding ``text`` (hypothesis tests cannot take ``tmp_path``); the caller deletes it."""
    fd, name = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    return Path(name)


_CSV_TEXT = st.lists(st.sampled_from(["a", "é", ",", '"', '""', "\n", "\r", "\r\n", " "]), max_size=40).map(
    "".join
)


@settings(max_examples=300, deadline=None)
@given(body=_CSV_TEXT, chunk=st.sampled_from([1, 2, 3, 7, 4096]))
def test_read_rows_reads_csv_as_the_csv_module_does_whatever_the_chunks(body: str, chunk: int) -> None:
    text = "h1,h2\n" + body
    expected: list[Any] = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = None
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            expected.append("never closed" if "unexpected end" in str(exc) else "error")
            if "unexpected end" in str(exc):
                break
            continue
        if not fields:
            continue
        if header is None:
            header = fields
        elif len(fields) != len(header):
            expected.append("error")
        else:
            expected.append(dict(zip(header, fields, strict=True)))
    got: list[Any] = []
    path = _temp_file(text, ".csv")
    try:
        with mock.patch.object(rows_module, "CHUNK_CHARS", chunk):
            try:
                got.extend("error" if isinstance(r, RowError) else r for r in read_rows(str(path)))
            except InputError as exc:
                got.append("never closed" if "never closed" in str(exc) else str(exc))
    finally:
        path.unlink()
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(body=st.lists(st.sampled_from(["a", "é", " ", "\t", "\n", "\r", "\r\n"]), max_size=40).map("".join))
def test_read_rows_splits_lines_as_the_file_iterator_does_whatever_the_chunks(body: str) -> None:
    expected = [line.strip() for line in io.StringIO(body, newline="") if line.strip()]
    path = _temp_file(body, ".txt")
    try:
        for chunk in (1, 2, 5):
            with mock.patch.object(rows_module, "CHUNK_CHARS", chunk):
                assert list(read_rows(str(path))) == expected
    finally:
        path.unlink()


@settings(max_examples=400, deadline=None)
@given(body=_CSV_TEXT, cuts=st.lists(st.integers(min_value=1, max_value=5), max_size=20))
def test_quote_scan_finds_where_a_record_ends_as_the_csv_module_does(body: str, cuts: list[int]) -> None:
    lines = list(io.StringIO(body, newline=""))
    reader = csv.reader(iter(lines), strict=True)
    while True:
        before = reader.line_num
        try:
            next(reader)
        except StopIteration:
            break
        except csv.Error:  # the reader refused the record: it starts afresh, so does the reader of rows
            continue
        scan = rows_module._QuoteScan()
        scan.start()
        for number, line in enumerate(lines[before : reader.line_num], before + 1):
            at, steps = 0, iter(cuts)
            while at < len(line):  # the line in pieces, as a line over the cap is read
                step = next(steps, len(line))
                scan.feed(line[at : at + step], number)
                at += step
            assert scan.inside == (number < reader.line_num), (lines[before : reader.line_num], number)


def test_count_rows_never_holds_a_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    write_big(path, "a.fr\n\n  \n", 16 * MiB, "\nb.fr")

    tracemalloc.start()
    try:
        count = count_rows(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert count == 3
    assert peak < 8 * MiB


# -- what the output and the report quote -----------------------------------------------


def test_run_rows_error_that_quotes_the_whole_row_is_written_shortened() -> None:
    def play(row: Any, ctx: Any) -> Any:
        raise ValueError(f"not a domain name: {row!r} (the end)")

    out = io.BytesIO()
    summary = run_rows(
        Play(name="p", tools=[], run=play),
        ["a" * 1_000_000, "b.fr"],
        None,
        concurrency=2,
        out=out,
        stop=threading.Event(),
    )

    lines = out.getvalue().splitlines()
    assert summary.failed == 2 and len(lines) == 2
    first = lines[0].decode()
    assert len(first) < 1_000_000 + MAX_ERROR_CHARS + 200  # the row itself, and a short error
    error = json.loads(first)["error"]
    assert len(error) <= MAX_ERROR_CHARS + 60  # its type's name, the text cut
    assert error.startswith("ValueError: not a domain name: 'aaa") and error.endswith("(the end)")
    (_, _, example), *_ = summary.errors.most_common(1)
    assert len(example) <= 160


# -- the command line --------------------------------------------------------------------

PLAY = """
import sys

sys.path.insert(0, {examples!r})
from domains_play import play as _play, tools


def play(row, ctx):
    return _play(row["domain"] if isinstance(row, dict) else row, ctx)
"""

RSS = """
import resource, subprocess, sys

done = subprocess.run(sys.argv[1:])
print(f"peak-rss-kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", file=sys.stderr)
sys.exit(done.returncode)
"""


def _run_measured(cli: Any, tmp_path: Path, *args: Any, env: dict[str, str]) -> tuple[Any, int]:
    """Run the CLI under a parent that reports its peak resident memory (KiB)."""
    wrapper = tmp_path / "rss.py"
    wrapper.write_text(RSS, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(wrapper), *cli.command(*args)],
        cwd=cli.cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    found = re.search(r"peak-rss-kib=(\d+)", done.stderr)
    assert found, done.stderr[-2000:]
    return done, int(found.group(1))


def _receipt_tools(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [tool for (tool,) in conn.execute("select tool_id from receipts order by tool_id")]


@pytest.mark.scenario
@pytest.mark.parametrize(
    ("name", "head", "tail"),
    [
        ("rows.txt", "lemonde.fr\n", ".com\nbbc.co.uk\n"),
        ("rows.jsonl", '"lemonde.fr"\n"', '.com"\n"bbc.co.uk"\n'),
        ("rows.csv", 'domain\nlemonde.fr\n"', '.com"\nbbc.co.uk\n'),
    ],
)
def test_cli_row_over_the_cap_is_refused_unread_and_nothing_of_it_is_sent(
    cli: Any, provider: Any, tmp_path: Path, name: str, head: str, tail: str
) -> None:
    play = tmp_path / "play.py"
    play.write_text(PLAY.format(examples=str(cli.examples)), encoding="utf-8")
    rows, out, db = tmp_path / name, tmp_path / "out.jsonl", tmp_path / "r.db"
    write_big(rows, head, OVER, tail)
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url)

    done, peak_kib = _run_measured(
        cli, tmp_path, "run", play, "--input", rows, "--db", db, "--output", out, env=env
    )

    assert done.returncode == 1, done.stderr[-3000:]
    lines = cli.read_jsonl(out)
    assert [line["index"] for line in lines] == [0, 1, 2]
    assert lines[1]["row"] is None and lines[1]["result"] is None
    assert re.match(
        r"RowError: line \d: input too large: the line is \d+ bytes; the cap is", lines[1]["error"]
    )
    assert lines[0]["error"] is None and lines[2]["error"] is None
    assert out.stat().st_size < 2000
    billed = provider.calls()["billed"]
    assert billed and all(len(item) < 200 for item in billed), [item[:200] for item in billed]
    assert sum(1 for item in billed if "domain" in item) == 2
    assert _receipt_tools(db).count("inspect_domain") == 2
    assert "never closed" not in done.stderr
    assert peak_kib < 250 * 1024, f"peak RSS {peak_kib // 1024} MiB for a {OVER // MiB} MiB line"


@pytest.mark.scenario
def test_cli_row_error_quoting_the_whole_input_is_written_shortened(
    cli: Any, provider: Any, tmp_path: Path
) -> None:
    play = tmp_path / "play.py"
    play.write_text(PLAY.format(examples=str(cli.examples)), encoding="utf-8")
    rows, out, db = tmp_path / "rows.txt", tmp_path / "out.jsonl", tmp_path / "r.db"
    write_big(rows, "lemonde.fr\n", 2 * MiB, "\n")  # no dot: the provider answers an error quoting it

    done = cli.run(
        "run",
        play,
        "--input",
        rows,
        "--db",
        db,
        "--output",
        out,
        env=cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url),
    )

    assert done.returncode == 1, done.stderr[-3000:]
    lines = cli.read_jsonl(out)
    assert lines[1]["error"].startswith("ProviderError: not a domain name: 'xxx")
    assert len(lines[1]["error"]) <= MAX_ERROR_CHARS + 50
    assert out.stat().st_size < 2 * MiB + 2 * MAX_ERROR_CHARS + 500  # the row once, its error short
    assert len(done.stderr) < 20_000
    with sqlite3.connect(db) as conn:
        (longest,) = conn.execute("select max(length(error)) from receipts").fetchone()
    assert longest <= MAX_ERROR_CHARS + 30


TAKE_PLAY = """
from actors import Tool


def take(input, ctx):
    return {"kind": type(input).__name__}


tools = [Tool(tool_id="take", fn=take)]


def play(row, ctx):
    return ctx.tool("take", row)  # the row itself is the call's input
"""


@pytest.mark.scenario
@pytest.mark.parametrize("name", ["rows.txt", "rows.csv", "rows.jsonl"])
def test_cli_row_at_the_cap_runs_and_one_byte_over_fails_in_every_format(
    cli: Any, tmp_path: Path, name: str
) -> None:
    play = tmp_path / "play.py"
    play.write_text(TAKE_PLAY, encoding="utf-8")
    rows, out, db = tmp_path / name, tmp_path / "out.jsonl", tmp_path / "r.db"
    short = '{"n":[' + ",".join(["1e20"] * 1000) + '],"pad":"'  # canonical: 17 bytes more per number
    with open(rows, "w", encoding="utf-8", newline="") as fh:
        fh.write("domain\n" if name.endswith(".csv") else "")
        for size in (MAX_INPUT_BYTES, MAX_INPUT_BYTES + 1):
            if name.endswith(".jsonl"):
                fh.write(short + "x" * (size - len(short) - 2 - 1000 * (len(BIG_NUMBER) - 4)) + '"}\n')
            else:
                head, repeats, tail = boundary_rows(name, size)
                fh.write(head + "x" * repeats + tail + "\n")

    done = cli.run("run", play, "--input", rows, "--db", db, "--output", out)

    assert done.returncode == 1, done.stderr[-3000:]
    with open(out, encoding="utf-8") as fh:
        at, over = (json.loads(line) for line in fh)
    assert at["error"] is None and at["result"] == {
        "kind": {"rows.txt": "str", "rows.csv": "dict", "rows.jsonl": "dict"}[name]
    }
    line = 3 if name.endswith(".csv") else 2
    assert over["result"] is None and over["error"].startswith(
        f"RowError: line {line}: input too large: its JSON text is {MAX_INPUT_BYTES + 1} bytes;"
    )
    assert _receipt_tools(db) == ["take"]  # the row at the cap was claimed and run; the other not
