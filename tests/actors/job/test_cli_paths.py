"""``tooldispatch run`` refuses, before anything runs, a report or output path that would
destroy a file the run needs: the input, the store and SQLite's files beside it, the
salvage file, the play's own source, another output. Click's runner, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from actors.job.cli import main

PLAY = (
    "from actors import Tool\n"
    "tools = [Tool(tool_id='t', fn=lambda i, c: i)]\n"
    "def play(row, ctx):\n    return row\n"
)


@pytest.mark.parametrize(
    ("option", "target", "says"),
    [
        ("--report-html", "play.py", "is also the play"),
        ("--report-json", "play.py", "is also the play"),
        ("--report-json", "r.db-wal", "is also the store's wal file"),
        ("--report-html", "r.db-shm", "is also the store's shm file"),
        ("--output", "r.db-journal", "is also the store's journal file"),
        ("--report-json", "rows.txt", "is also --input"),
        ("--report-html", "r.db.salvage.jsonl", "is also the salvage file"),
        ("--report-json", "out.jsonl", "is also --output"),
    ],
)
def test_cli_refuses_to_write_over_what_the_run_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, target: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("play.py").write_text(PLAY, encoding="utf-8")
    Path("rows.txt").write_text("a\n", encoding="utf-8")
    args = ["run", "play.py", "--input", "rows.txt", "--db", "r.db", option, target]
    if option != "--output":
        args += ["--output", "out.jsonl"]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 2 and says in done.output, done.output
    assert Path("play.py").read_text(encoding="utf-8") == PLAY and not Path("r.db").exists()


def test_cli_knows_the_play_file_behind_a_named_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("play.py").write_text(PLAY, encoding="utf-8")
    Path("rows.txt").write_text("a\n", encoding="utf-8")
    args = ["run", "play.py:play", "--input", "rows.txt", "--db", "r.db", "--report-json", "play.py"]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 2 and "is also the play" in done.output
