"""``tooldispatch run --force-refresh`` whose refresh ends uncertain never hides the last
good output (issue 26, defect 3): the refresh's connection is reset after sending, or
its process is killed with SIGKILL while the provider holds its requests. Then an
ordinary run answers every row from the stored output (the report counts those calls),
a forced run meets the uncertainty and sends nothing, ``receipts show`` says what
ordinary calls get, and ``receipts resolve --fail`` leaves the old output completed.

Real processes: the CLI (in the suite's runtime), a provider on 127.0.0.1
(``scripted_provider``), SQLite files and Postgres.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

pytestmark = pytest.mark.scenario

PLAY = """
import os

from actors import Tool
from actors.http import HttpEndpoint

tools = [Tool(tool_id="charge", fn=HttpEndpoint(os.environ["CHARGE_URL"] + "/charge"), timeout_s=60.0)]
# not retry-safe: a request that may have reached the provider is never sent again silently


def play(row, ctx):
    return ctx.tool("charge", {"card": int(row)})
"""
CARDS = (1, 2, 3, 4)
LAST_GOOD = "reused while a refresh is uncertain (calls)"
WAIT_S = 120.0


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    """The receipt store: a SQLite file, or a Postgres schema of the test's own."""
    if request.param == "sqlite":
        return str(tmp_path / "r.db")
    return request.getfixturevalue("pg_db")


class _Runs:
    def __init__(self, cli, tmp_path, server, db) -> None:
        self.cli, self.server, self.db = cli, server, db
        self.play, self.rows = tmp_path / "charge_play.py", tmp_path / "cards.txt"
        self.out = tmp_path / "out.jsonl"
        self.play.write_text(PLAY, encoding="utf-8")
        self.rows.write_text("".join(f"{n}\n" for n in CARDS), encoding="utf-8")
        self.env = cli.env(CHARGE_URL=server.url)

    def args(self, *extra: str) -> tuple:
        return ("run", self.play, "--input", self.rows, "--db", self.db, "--output", self.out, *extra)

    def run(self, *extra: str):
        return self.cli.run(*self.args(*extra), env=self.env)

    def results(self) -> dict[int, dict]:
        return {line["row"]["card"] if isinstance(line["row"], dict) else int(line["row"]): line
                for line in self.cli.read_jsonl(self.out)}  # fmt: skip


def _good_run(runs: _Runs) -> dict[int, object]:
    done = runs.run()
    assert done.returncode == 0, done.stderr[-3000:]
    good = {card: line["result"] for card, line in runs.results().items()}
    assert sorted(good) == list(CARDS) and all(good.values())
    return good


def _after_uncertain_refresh(runs: _Runs, good: dict[int, object], sent: int) -> None:
    """Ordinary runs get the last good outputs; forced runs are refused; nothing is sent."""
    runs.server.set_mode("answer")  # what would answer, were anything sent
    ordinary = runs.run()
    assert ordinary.returncode == 0, ordinary.stderr[-3000:]
    assert {card: line["result"] for card, line in runs.results().items()} == good
    report = runs.cli.report(ordinary.stderr)
    assert report[LAST_GOOD] == str(len(CARDS)), report
    assert report["receipts completed this run (calls that ran)"] == "0"

    forced = runs.run("--force-refresh")
    assert forced.returncode == 1, forced.stderr[-3000:]
    for line in runs.results().values():
        assert line["result"] is None and line["error"].startswith("UncertainOutcomeError"), line
    assert runs.server.count() == sent  # neither run sent anything

    listed = runs.cli.run("receipts", "ls", "--db", runs.db, "--status", "uncertain")
    assert listed.returncode == 0, listed.stderr
    keys = re.findall(r"│ ([0-9a-f]{16}) │", listed.stdout)
    assert len(keys) == len(CARDS), listed.stdout
    shown = runs.cli.run("receipts", "show", keys[0], "--db", runs.db)
    assert shown.returncode == 0, shown.stderr
    receipt = json.loads(shown.stdout)
    assert receipt["status"] == "uncertain" and receipt["output"] in good.values()
    assert "ordinary calls get the output stored at completed_at" in receipt["note"]

    resolved = runs.cli.run("receipts", "resolve", keys[0], "--db", runs.db, "--fail", "--note", "no charge")
    assert resolved.returncode == 0, resolved.stderr
    assert "completed with its last good output" in resolved.stdout
    after = json.loads(runs.cli.run("receipts", "show", keys[0], "--db", runs.db).stdout)
    assert (after["status"], after["output"], after["error"]) == ("completed", receipt["output"], None)
    assert "note" not in after


def test_cli_refresh_reset_after_sending_keeps_the_last_good_output(cli, tmp_path, scripted_provider, db):
    runs = _Runs(cli, tmp_path, scripted_provider, db)
    good = _good_run(runs)

    scripted_provider.set_mode("reset")
    refresh = runs.run("--force-refresh")
    assert refresh.returncode == 1, refresh.stderr[-3000:]
    assert all(line["error"] for line in runs.results().values())  # the refresh's own outcome
    assert scripted_provider.count() == 2 * len(CARDS)

    _after_uncertain_refresh(runs, good, 2 * len(CARDS))


def test_cli_refresh_killed_while_sent_keeps_the_last_good_output(cli, tmp_path, scripted_provider, db):
    runs = _Runs(cli, tmp_path, scripted_provider, db)
    good = _good_run(runs)

    scripted_provider.set_mode("hold")  # the provider has the requests and does not answer
    err_path = tmp_path / "refresh.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            cli.command(*runs.args("--force-refresh")), cwd=tmp_path, env=runs.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:
            cli.poll_until(
                lambda: proc.poll() is not None or scripted_provider.count() == 2 * len(CARDS),
                timeout_s=WAIT_S, what="every refresh to reach the provider",
            )  # fmt: skip
            assert proc.poll() is None, err_path.read_text()[-3000:]
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=WAIT_S)
    assert proc.returncode == -signal.SIGKILL
    scripted_provider.set_mode("refuse")  # the held requests are answered to nobody

    _after_uncertain_refresh(runs, good, 2 * len(CARDS))
