"""``tooldispatch run --fairness-key KEY --weight W``: the run's fair share of a provider's
rate (docs/pacing.md, Fair shares). A weight out of 1e-6 to 1e6 is a
configuration error (exit 2, one line); a good one runs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.scenario

PLAY = """
from actors import Tool

tools = [Tool(tool_id="double", fn=lambda input, ctx: {"n": input["n"] * 2})]


def play(row, ctx):
    return ctx.tool("double", {"n": int(row["n"])})
"""


@pytest.fixture
def play_and_rows(tmp_path):
    play = tmp_path / "fair_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n2\n", encoding="utf-8")
    return play, rows


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "inf", "1e308"])
def test_cli_fairness_a_bad_weight_is_a_configuration_error(cli, play_and_rows, tmp_path, weight):
    play, rows = play_and_rows
    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--weight", weight)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "--weight must be a number from 1e-06 to 1e+06" in lines[0], done.stderr


def test_cli_fairness_key_and_weight_run(cli, play_and_rows, tmp_path):
    play, rows = play_and_rows
    done = cli.run(
        "run",
        play,
        "--input",
        rows,
        "--db",
        tmp_path / "r.db",
        "--fairness-key",
        "customer-42",
        "--weight",
        "3",
    )
    assert done.returncode == 0, done.stderr
