"""``tooldispatch run`` on bad input and bad plays: exit 2 with one line for usage and
configuration errors, exit 1 when some rows fail (they fail alone, the rest go on).

The plays are tiny files in ``tmp_path`` with local tools (no HTTP), so each run is fast.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.scenario

LOCAL_PLAY = """
from actors import Tool


def double(input, ctx):
    return {"n": input["n"] * 2}


tools = [Tool(tool_id="double", fn=double)]


def play(row, ctx):
    if row.get("boom"):
        raise ValueError(f"boom in row {row['n']}")
    return ctx.tool("double", {"n": int(row["n"])})
"""

UNKNOWN_TOOL_PLAY = """
from actors import Tool

tools = [Tool(tool_id="double", fn=lambda input, ctx: input)]


def play(row, ctx):
    return ctx.tool("no_such_tool", {"row": row})
"""


@pytest.fixture
def local_play(tmp_path):
    path = tmp_path / "local_play.py"
    path.write_text(LOCAL_PLAY, encoding="utf-8")
    return path


@pytest.fixture
def good_csv(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("n,boom\n1,\n2,\n3,\n", encoding="utf-8")
    return path


def _assert_one_line_error(done, *fragments):
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tooldispatch: error:"), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_cli_errors_missing_input_file(cli, local_play, tmp_path):
    done = cli.run("run", local_play, "--input", tmp_path / "missing.csv", "--db", tmp_path / "r.db")

    _assert_one_line_error(done, "missing.csv")


def test_cli_errors_play_that_does_not_import(cli, good_csv, tmp_path):
    play = tmp_path / "broken_play.py"
    play.write_text("def play(row, ctx:\n    return row\n", encoding="utf-8")

    done = cli.run("run", play, "--input", good_csv, "--db", tmp_path / "r.db")

    _assert_one_line_error(done, "SyntaxError")


def test_cli_errors_play_without_tools_or_play(cli, good_csv, tmp_path):
    play = tmp_path / "empty_play.py"
    play.write_text("NOTHING = 1\n", encoding="utf-8")

    done = cli.run("run", play, "--input", good_csv, "--db", tmp_path / "r.db")

    _assert_one_line_error(done, "tools", "play")


def test_cli_errors_unknown_tool(cli, good_csv, tmp_path):
    play = tmp_path / "unknown_tool_play.py"
    play.write_text(UNKNOWN_TOOL_PLAY, encoding="utf-8")

    done = cli.run("run", play, "--input", good_csv, "--db", tmp_path / "r.db")

    _assert_one_line_error(done, "no_such_tool")


def test_cli_errors_unknown_tool_after_paid_calls_says_what_was_kept(cli, good_csv, tmp_path):
    play = tmp_path / "late_typo_play.py"
    play.write_text(
        UNKNOWN_TOOL_PLAY.replace(
            'return ctx.tool("no_such_tool"',
            'ctx.tool("double", {"row": row})\n    return ctx.tool("no_such_tool"',
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", good_csv, "--db", tmp_path / "r.db", "--output", out)

    _assert_one_line_error(done, "no_such_tool", "the run stopped after", "does not pay for them", str(out))


def test_cli_error_kinds_keep_words_with_digits_and_abstract_numbers() -> None:
    from actors.job.error_kinds import error_kind

    kind = error_kind(
        "ProviderUnavailableError: provider 'p' is unavailable (connection errors, 5xx or timeouts): "
        "http://127.0.0.1:8750/v1/domain/batch [Errno 111] after 3.5 s"
    )
    assert "5xx" in kind and "/v1/" in kind  # words that hold digits are words
    assert "127" not in kind and "8750" not in kind and "111" not in kind and "3.5" not in kind


def test_cli_error_kinds_keep_digits_inside_words_like_utf_8() -> None:
    from actors.job.error_kinds import error_kind

    assert error_kind("RowError: line 3: not UTF-8") == "RowError: line N: not UTF-8"
    assert error_kind("RowError: line 12: not UTF-8") == error_kind("RowError: line 7: not UTF-8")
    kept = error_kind("decoded as ISO-8859-1 on x86-64 with sha-256, HTTP/2 and 5xx")
    assert "ISO-8859-1" in kept and "x86-64" in kept and "sha-256" in kept and "5xx" in kept
    assert error_kind("RowError: lines 3-7: x") == error_kind("RowError: lines 10-12: x")
    assert not re.search(r"\d", error_kind("got -5 items on 2024-01-05 after 1.5 s"))


def test_cli_error_group_label_is_a_real_message_keeping_what_every_message_shares() -> None:
    from actors.job.error_kinds import ErrorKinds

    kinds = ErrorKinds()
    cap = "the cap is 33554432 bytes (32 MiB)"
    for line, size in ((2, 33554433), (5, 50000005), (9, 33554433)):
        kinds.add(f"RowError: line {line}: input too large: the line is {size} bytes; {cap}")
    for line in (3, 12):
        kinds.add(f"RowError: line {line}: not UTF-8")
    for _ in range(2):
        kinds.add("ProviderError: HTTP 503 from 'acme' after 3 tries in 2.5 s")
    kinds.add("ValueError: boom in row 2")

    groups = {label: (count, example) for label, count, example in kinds.most_common(10)}
    assert groups == {
        f"RowError: line N: input too large: the line is N bytes; {cap}": (
            3,
            f"RowError: line 2: input too large: the line is 33554433 bytes; {cap}",
        ),
        "RowError: line N: not UTF-8": (2, "RowError: line 3: not UTF-8"),
        # the same in every message: shown as written, the message itself
        "ProviderError: HTTP 503 from 'acme' after 3 tries in 2.5 s": (
            2,
            "ProviderError: HTTP 503 from 'acme' after 3 tries in 2.5 s",
        ),
        "ValueError: boom in row 2": (1, "ValueError: boom in row 2"),
    }


OVER_CAP_PLAY = """
from actors import Tool

tools = [Tool(tool_id="take", fn=lambda input, ctx: {"ok": True})]


def play(row, ctx):
    return ctx.tool("take", {"row": row})
"""


def test_cli_report_error_label_keeps_the_cap_every_row_error_names(cli, tmp_path):
    from stores import MAX_INPUT_BYTES

    play = tmp_path / "take_play.py"
    play.write_text(OVER_CAP_PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    with open(rows, "w", encoding="utf-8") as fh:
        fh.write("a.fr\n" + "x" * (MAX_INPUT_BYTES + 1) + "\nb.fr\n" + "y" * (MAX_INPUT_BYTES + 7) + "\n")

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", env=cli.env(COLUMNS="400"))

    assert done.returncode == 1, done.stderr[-3000:]
    errors = {k: v for k, v in cli.report(done.stderr).items() if k.startswith("error")}
    cap = f"the cap is {MAX_INPUT_BYTES} bytes (32 MiB)"
    assert errors == {
        f"error: RowError: line N: input too large: the line is N bytes; {cap} (2 rows)": (
            f"e.g. RowError: line 2: input too large: the line is {MAX_INPUT_BYTES + 1} bytes; {cap}"
        )
    }, errors


def test_cli_errors_malformed_csv_row_fails_alone(cli, local_play, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("n,boom\n1,\n2,\n3,,too,many\n4,\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", local_play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = cli.read_jsonl(out)
    assert [line["index"] for line in lines] == [0, 1, 2, 3]
    assert lines[2]["error"] and "RowError" in lines[2]["error"]
    assert lines[2]["result"] is None
    assert [line["result"] for i, line in enumerate(lines) if i != 2] == [{"n": 2}, {"n": 4}, {"n": 8}]
    assert all(line["error"] is None for i, line in enumerate(lines) if i != 2)
    assert cli.report(done.stderr)["rows"] == "4 (3 ok, 1 failed)"


def test_cli_errors_play_raising_for_one_row(cli, local_play, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("n,boom\n1,\n2,yes\n3,\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", local_play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = cli.read_jsonl(out)
    assert [line["error"] for line in lines] == [None, "ValueError: boom in row 2", None]
    assert [line["result"] for line in lines] == [{"n": 2}, None, {"n": 6}]
    report = cli.report(done.stderr)
    assert report["rows"] == "3 (2 ok, 1 failed)"
    # the reason, in the report: its label (a group of one: the message), its count, one example
    assert report["error: ValueError: boom in row 2 (1 row)"] == "e.g. ValueError: boom in row 2"


def test_cli_errors_force_refresh_with_retry_failed(cli, local_play, good_csv, tmp_path):
    done = cli.run(
        "run", local_play, "--input", good_csv, "--db", tmp_path / "r.db", "--force-refresh", "--retry-failed"
    )

    _assert_one_line_error(done, "--force-refresh", "--retry-failed")


NAMESPACED_PLAY = """
from types import SimpleNamespace

from actors import Tool

enrich = SimpleNamespace(
    tools=[Tool(tool_id="double", fn=lambda input, ctx: {"n": input["n"] * 2})],
    play=lambda row, ctx: ctx.tool("double", {"n": int(row["n"])}),
)
"""


def test_cli_errors_play_file_with_attr_runs_and_a_missing_attr_says_so(cli, good_csv, tmp_path):
    play = tmp_path / "plays.py"
    play.write_text(NAMESPACED_PLAY, encoding="utf-8")

    ran = cli.run("run", f"{play}:enrich", "--input", good_csv, "--db", tmp_path / "r.db")
    missing = cli.run("run", f"{play}:nope", "--input", good_csv, "--db", tmp_path / "r.db")

    assert ran.returncode == 0, ran.stderr
    assert cli.report(ran.stderr)["rows"] == "3 (3 ok, 0 failed)"
    _assert_one_line_error(missing, "has no attribute 'nope'", str(play))


def test_cli_errors_db_in_a_missing_directory_is_not_created(cli, local_play, good_csv, tmp_path):
    db = tmp_path / "no" / "such" / "dir" / "r.db"

    done = cli.run("run", local_play, "--input", good_csv, "--db", db)

    _assert_one_line_error(done, str(db.parent))
    assert not (tmp_path / "no").exists()


def test_cli_errors_default_db_directory_is_made(cli, local_play, good_csv):
    done = cli.run("run", local_play, "--input", good_csv)

    assert done.returncode == 0, done.stderr
    assert (cli.cwd / ".tooldispatch" / "receipts.db").is_file()


def test_cli_errors_salvage_ls_without_a_store_or_file(cli, tmp_path):
    no_store = cli.run("salvage", "ls", "--db", tmp_path / "missing.db")
    no_file = cli.run("salvage", "ls", "--salvage", tmp_path / "missing.jsonl")

    _assert_one_line_error(no_store, "no receipt store at", "missing.db")
    _assert_one_line_error(no_file, "no salvage file at", "missing.jsonl")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".txt"])
def test_cli_errors_a_row_that_is_not_utf8_fails_alone(cli, tmp_path, suffix):
    play = tmp_path / "echo_play.py"
    play.write_text(
        "from actors import Tool\n"
        "tools = [Tool(tool_id='echo', fn=lambda input, ctx: input)]\n"
        "def play(row, ctx):\n"
        "    return ctx.tool('echo', {'row': row})\n",
        encoding="utf-8",
    )
    good = [f"row{n}" for n in range(300)]
    lines = [b"name"] if suffix == ".csv" else []
    for n, text in enumerate(good):
        value = text.encode() if suffix != ".jsonl" else b'"' + text.encode() + b'"'
        lines.append(value)
        if n == 150:
            lines.append(b"caf\xe9" if suffix != ".jsonl" else b'"caf\xe9"')  # Latin-1, not UTF-8
    rows = tmp_path / f"rows{suffix}"
    rows.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr
    assert cli.report(done.stderr)["rows"] == "301 (300 ok, 1 failed)"
    written = cli.read_jsonl(out)
    assert len(written) == 301
    (bad,) = [line for line in written if line["error"]]
    assert bad["index"] == 151 and "not UTF-8" in bad["error"]


def test_cli_errors_output_that_cannot_be_written(cli, local_play, good_csv, tmp_path):
    done = cli.run(
        "run",
        local_play,
        "--input",
        good_csv,
        "--db",
        tmp_path / "r.db",
        "--output",
        tmp_path / "no" / "o.jsonl",
    )

    _assert_one_line_error(done, "cannot write the output", "o.jsonl")


def test_cli_errors_salvage_path_that_is_a_directory(cli, tmp_path):
    for command in ("ls", "replay"):
        (tmp_path / "r.db").touch()
        done = cli.run("salvage", command, "--db", tmp_path / "r.db", "--salvage", tmp_path)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert done.stderr.startswith("tooldispatch: error:")


def test_cli_scope_names_the_cache_so_a_renamed_play_keeps_it(cli, local_play, good_csv, tmp_path):
    renamed = tmp_path / "renamed_play.py"
    renamed.write_text(local_play.read_text(encoding="utf-8"), encoding="utf-8")
    db = tmp_path / "r.db"

    first = cli.run("run", local_play, "--input", good_csv, "--db", db, "--scope", "enrich")
    again = cli.run("run", renamed, "--input", good_csv, "--db", db, "--scope", "enrich")
    other = cli.run("run", renamed, "--input", good_csv, "--db", db)

    assert first.returncode == again.returncode == other.returncode == 0
    billed, reused = "receipts completed this run (calls that ran)", "reused from earlier runs"
    assert cli.report(first.stderr)[billed] == "3"
    assert cli.report(again.stderr)[reused] == "3 receipts (3 calls)"  # same scope: the rename costs nothing
    assert cli.report(again.stderr)[billed] == "0"
    assert cli.report(other.stderr)[billed] == "3"  # the file's name is another scope


def test_cli_receipts_purge_asks_first(cli, local_play, good_csv, tmp_path):
    db = tmp_path / "r.db"
    assert cli.run("run", local_play, "--input", good_csv, "--db", db).returncode == 0

    declined = cli.run("receipts", "purge", "--db", db, input="n\n")
    kept = cli.run("receipts", "stats", "--db", db)

    assert declined.returncode == 0, declined.stderr  # declining is not an error
    assert "delete 3 receipts" in declined.stdout and "paid again" in declined.stdout
    assert declined.stdout.splitlines()[-1].endswith("nothing deleted")
    assert "completed" in kept.stdout


def test_runner_input_that_breaks_mid_read_stops_the_run_and_says_so():
    import threading

    from actors.job.play import Play
    from actors.job.runner import run_rows

    def rows():
        yield from (1, 2, 3)
        raise OSError(5, "Input/output error")

    play = Play(name="p", tools=[], run=lambda row, ctx: row * 2)
    summary = run_rows(play, rows(), ctx=None, concurrency=4, out=None, stop=threading.Event())

    assert summary.rows == 3 and summary.ok == 3
    assert summary.config_error is not None and "cannot read the input" in summary.config_error
    assert "Input/output error" in summary.config_error


@pytest.mark.parametrize("clash", ["--input", "--db"])
def test_cli_errors_output_that_would_overwrite_the_input_or_the_store(
    cli, local_play, good_csv, tmp_path, clash
):
    db = tmp_path / "r.db"
    assert cli.run("run", local_play, "--input", good_csv, "--db", db).returncode == 0
    before = {p: p.read_bytes() for p in (good_csv, db)}
    target = good_csv if clash == "--input" else db

    done = cli.run("run", local_play, "--input", good_csv, "--db", db, "--output", target)

    _assert_one_line_error(done, f"is also {clash}")
    assert {p: p.read_bytes() for p in (good_csv, db)} == before


def test_cli_errors_empty_org(cli, local_play, good_csv, tmp_path):
    done = cli.run("run", local_play, "--input", good_csv, "--db", tmp_path / "r.db", "--org", " ")

    _assert_one_line_error(done, "--org")


def test_cli_errors_csv_with_a_byte_order_mark_and_a_header_that_is_not_utf8(cli, local_play, tmp_path):
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbfn,boom\r\n1,\r\n2,\r\n")
    bad_header = tmp_path / "latin1.csv"
    bad_header.write_bytes(b"n,caf\xe9\n1,\n")

    exported = cli.run("run", local_play, "--input", bom, "--db", tmp_path / "r.db")
    broken = cli.run("run", local_play, "--input", bad_header, "--db", tmp_path / "r.db")

    assert exported.returncode == 0, exported.stderr  # row["n"] found: the mark is not part of the name
    assert cli.report(exported.stderr)["rows"] == "2 (2 ok, 0 failed)"
    _assert_one_line_error(broken, "CSV header", "not UTF-8")


RECURSIVE_ERROR_PLAY = """
from actors import Tool

tools = [Tool(tool_id="double", fn=lambda input, ctx: input)]


def play(row, ctx):
    if row["n"] == "2":
        error = RuntimeError()
        error.args = (error,)  # its str() recurses
        raise error
    return ctx.tool("double", {"n": row["n"]})
"""


def test_cli_errors_a_row_error_whose_message_cannot_be_read_fails_that_row_alone(cli, good_csv, tmp_path):
    play = tmp_path / "recursive_error_play.py"
    play.write_text(RECURSIVE_ERROR_PLAY, encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", good_csv, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr  # one row failed; the run went on
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3, lines
    assert '"error":null' in lines[0] and '"error":null' in lines[2]
    assert "RuntimeError" in lines[1]


EXITING_PLAY = """
from actors import Tool

tools = [Tool(tool_id="echo", fn=lambda input, ctx: input)]


def play(row, ctx):
    value = ctx.tool("echo", {"n": row["n"]})
    if row["n"] == "2":
        raise {kind}("leaving from row 2")
    return value
"""


@pytest.mark.parametrize("kind", ["SystemExit", "GeneratorExit", "KeyboardInterrupt"])
@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_cli_errors_play_raising_systemexit_and_co_fails_its_row_alone(cli, tmp_path, kind, concurrency):
    play = tmp_path / "exiting_play.py"
    play.write_text(EXITING_PLAY.replace("{kind}", kind), encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n2\n3\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out,
                   "--concurrency", concurrency)  # fmt: skip

    assert done.returncode == 1, done.stderr
    lines = cli.read_jsonl(out)
    assert [line["result"] for line in lines] == [{"n": "1"}, None, {"n": "3"}]  # no row lost
    assert lines[1]["error"].startswith(f"{kind}: leaving from row 2")
    assert cli.report(done.stderr)["rows"] == "3 (2 ok, 1 failed)"


MARKUP_PLAY = """
from actors import Tool

tools = [Tool(tool_id="t[/x]", fn=lambda input, ctx: input)]


def play(row, ctx):
    if row == "bad":
        raise ValueError("the provider said [/x] :smile: [bold]no")
    return ctx.tool("t[/x]", {"row": row})
"""


def test_cli_errors_report_shows_text_that_looks_like_markup_as_it_is(cli, tmp_path):
    """An error text, tool id or path holding ``[/x]``: rich read it as markup and the
    end-of-run report crashed with MarkupError after the whole run (breaker round 3's
    kind: text from users' plays and stores rendered as if it were ours)."""
    play = tmp_path / "p.py"
    play.write_text(MARKUP_PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nbad\nz\n", encoding="utf-8")
    out = tmp_path / "out[bold].jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "MarkupError" not in done.stderr, done.stderr[-3000:]
    assert "the provider said [/x] :smile: [bold]no" in done.stderr
    assert "t[/x]" in done.stderr and "out[bold].jsonl" in done.stderr


NAMELESS_PLAY = """
from actors import Tool


class NamelessMeta(type):
    @property
    def __name__(cls):
        raise RuntimeError("no name")


class Nameless(Exception, metaclass=NamelessMeta):
    def __str__(self):
        raise ValueError("no message either")


tools = [Tool(tool_id="echo", fn=lambda input, ctx: input, durable=False)]


def play(row, ctx):
    if row == "bad":
        raise Nameless()
    return ctx.tool("echo", {"row": row})
"""


def test_cli_errors_a_play_error_whose_class_name_raises_fails_its_row_alone(cli, tmp_path):
    """The runner named a play's error by ``type(exc).__name__`` in its worker loop: a
    class whose metaclass's ``__name__`` raises ended that worker, and its rows were
    never written. The row fails alone, with a stand-in for what cannot be read."""
    play = tmp_path / "p.py"
    play.write_text(NAMELESS_PLAY, encoding="utf-8")
    rows = tmp_path / "rows.txt"
    rows.write_text("a\nbad\nz\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"

    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--output", out)

    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = cli.read_jsonl(out)
    assert [line["result"] for line in lines] == [{"row": "a"}, None, {"row": "z"}]
    assert "Nameless" in lines[1]["error"]
