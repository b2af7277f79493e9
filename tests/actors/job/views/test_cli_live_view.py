"""``tooldispatch run`` on a terminal (a pseudo-terminal, 150 columns): the live view
redraws a row per provider under the progress line, in the report's words, and the report
follows. The example provider is rate-limited, so its pacing has something to show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from .._terminal import run_on_a_terminal

pytestmark = pytest.mark.scenario

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_cli_live_view_shows_a_row_per_provider_on_a_terminal(
    cli: Any, provider_factory: Any, tmp_path: Path
) -> None:
    limited = provider_factory("--rate", "10", "--burst", "2")
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"live{i}.example.fr\n" for i in range(40)), encoding="utf-8")
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=limited.url, TOOLDISPATCH_BATCH="0", TERM="xterm-256color")
    del env["COLUMNS"]  # the terminal's width, as a user's
    argv = cli.command("run", cli.examples / "domains_play.py", "--input", rows, "--db", tmp_path / "r.db")
    code, raw = run_on_a_terminal(argv, cwd=tmp_path, env=env, timeout_s=180, size=(150, 20))
    text = ESCAPES.sub("", raw)
    assert code == 0, text[-4000:]
    assert "Traceback" not in text
    header = re.search(r"^provider +sent/s +pacing +in flight +429s +spent +saved +holding it up", text, re.M)
    assert header is not None, text[-4000:]
    row = re.findall(r"^local-provider +[\d.]+ +(?:[\d.]+/s \(\w+\)|unpaced).*$", text, re.M)
    assert row, text[-4000:]
    assert "progress: rows" not in text  # a terminal gets the live view, not the plain lines
    assert "tooldispatch run report" in text
