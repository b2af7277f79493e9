"""``tooldispatch run --budget``: calls that would pass the run's budget in money are
refused unsent (their rows fail, exit 1) and a rerun with more budget pays them; money
text that does not parse, or a budget the play's prices cannot be counted against, is a
one-line usage error (exit 2)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.scenario

PRICED_PLAY = """
import os

from actors import Tool
from stores.money import Money

PAID = os.environ["PAID_FILE"]


def verify(input, ctx):
    with open(PAID, "a", encoding="utf-8") as f:  # what the provider was paid for
        f.write(f"{input['n']}\\n")
    return {"n": input["n"]}


tools = [Tool(tool_id="verify", fn=verify, provider="acme", price=Money("10", "USD"))]


def play(row, ctx):
    return ctx.tool("verify", {"n": int(row["n"])})
"""


@pytest.fixture
def priced(tmp_path, cli):
    play = tmp_path / "priced.py"
    play.write_text(PRICED_PLAY, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n2\n3\n4\n5\n", encoding="utf-8")
    paid = tmp_path / "paid.txt"
    env = cli.env(PAID_FILE=str(paid))
    return play, rows, paid, env


def test_cli_budget_refuses_calls_past_it_and_a_rerun_with_more_pays_them(tmp_path, cli, priced):
    play, rows, paid, env = priced
    db = tmp_path / "receipts.db"
    first = cli.run("run", play, "--input", rows, "--db", db, "--budget", "25USD", env=env)
    assert first.returncode == 1, first.stderr
    assert len(paid.read_text().split()) == 2  # 2 x 10 USD within 25 USD; the rest never sent
    second = cli.run("run", play, "--input", rows, "--db", db, "--budget", "100 USD", env=env)
    assert second.returncode == 0, second.stderr
    assert sorted(paid.read_text().split()) == ["1", "2", "3", "4", "5"]  # each paid once


def test_cli_budget_per_provider(tmp_path, cli, priced):
    play, rows, paid, env = priced
    done = cli.run(
        "run", play, "--input", rows, "--db", tmp_path / "r.db", "--budget-provider", "acme=10USD", env=env
    )
    assert done.returncode == 1, done.stderr
    assert len(paid.read_text().split()) == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--budget", "25"), "--budget '25': expected an amount and a currency"),
        (("--budget", "lots USD"), "--budget 'lots USD'"),
        (("--budget", "-1USD"), "--budget '-1USD': a money amount must be finite and at least 0"),
        (("--budget-provider", "25USD"), "--budget-provider '25USD': expected NAME=MONEY"),
        (("--budget-provider", "acme=x"), "--budget-provider 'x'"),
        (("--budget", "25EUR"), "its price is in USD and its money budget in EUR"),
        (("--budget-provider", "nobody=5USD"), "provider 'nobody', which no tool uses"),
    ],
)
def test_cli_budget_bad_text_is_a_usage_error(tmp_path, cli, priced, args, fragment):
    play, rows, paid, env = priced
    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", *args, env=env)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    assert not paid.exists()
