"""The ledger against the provider's own bill (``examples/provider.py``, which counts the
lookups it served and billed): on a fresh run, a rerun, and runs with a money budget that
runs out, what the run reports spent, what the receipts cost and what the provider billed
agree, lookup for lookup, at the tool's price; the budget is never passed. (A run killed
with -9 and resumed: ``test_cli_kill9.py``.) Real processes: the provider and the CLI."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

ROWS = 30
PRICE = Decimal("0.25")

PLAY = """
import os

from actors import Pacing
from actors.http import http_tool
from stores import Money

BASE = os.environ["TOOLDISPATCH_PROVIDER_URL"]
tools = [http_tool("inspect_domain", f"{BASE}/v1/domain", provider="billing-provider",
                   pacing=Pacing(rps=1000, max_concurrency=4), price=Money("0.25", "USD"))]


def play(row, ctx):
    return ctx.tool("inspect_domain", {"domain": row})
"""


class _Ledger:
    def __init__(self, cli: Any, tmp_path: Any, provider: Any) -> None:
        self.cli, self.tmp_path, self.provider = cli, tmp_path, provider
        (tmp_path / "billing_play.py").write_text(PLAY, encoding="utf-8")
        (tmp_path / "domains.txt").write_text("".join(f"host{i}.fr\n" for i in range(ROWS)), encoding="utf-8")
        self.db = tmp_path / "r.db"
        self.env = cli.env(TOOLDISPATCH_PROVIDER_URL=provider.url)
        self.runs = 0

    def billed(self) -> int:
        return int(self.provider.stats().get("items", 0))

    def run(self, *extra: str) -> tuple[int, dict[str, Any], int]:
        """(exit code, the run's JSON report, lookups the provider billed during it)."""
        self.runs += 1
        report = self.tmp_path / f"run{self.runs}.json"
        before = self.billed()
        done = self.cli.run(
            "run", self.tmp_path / "billing_play.py", "--input", self.tmp_path / "domains.txt",
            "--db", self.db, "--report-json", report, *extra, env=self.env, timeout_s=120,
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr[-3000:]
        return done.returncode, json.loads(report.read_text(encoding="utf-8")), self.billed() - before

    def receipts_cost(self) -> Decimal:
        done = self.cli.run("receipts", "cost", "--db", self.db, "--json", env=self.env, timeout_s=60)
        assert done.returncode == 0, done.stderr
        lines = json.loads(done.stdout)
        return sum((Decimal(line["spent"]) for line in lines if line["spent"] is not None), Decimal(0))


def _spent(report: dict[str, Any]) -> Decimal:
    return Decimal(report["ledger"]["spent"]["total"].get("USD", "0"))


def _saved(report: dict[str, Any]) -> Decimal:
    return Decimal(report["ledger"]["saved"]["total"].get("USD", "0"))


def test_the_ledger_equals_the_providers_bill_fresh_and_rerun(cli, provider, tmp_path):
    ledger = _Ledger(cli, tmp_path, provider)
    code, fresh, billed = ledger.run()
    assert code == 0 and billed == ROWS
    assert _spent(fresh) == PRICE * billed and _saved(fresh) == 0
    assert ledger.receipts_cost() == PRICE * ledger.billed()

    code, rerun, billed = ledger.run()
    assert code == 0 and billed == 0
    assert _spent(rerun) == 0 and _saved(rerun) == PRICE * ROWS
    assert rerun["ledger"]["wasted"]["total"] == {}
    assert ledger.receipts_cost() == PRICE * ledger.billed() == PRICE * ROWS


def test_the_ledger_equals_the_providers_bill_when_a_money_budget_runs_out(cli, provider, tmp_path):
    ledger = _Ledger(cli, tmp_path, provider)
    code, first, billed = ledger.run("--budget", "2USD")  # 8 lookups at 0.25
    assert code == 1  # the rows refused for the budget failed
    assert billed == 8 and _spent(first) == PRICE * billed == Decimal(2)
    assert first["rows"]["ok"] == 8 and first["rows"]["failed"] == ROWS - 8
    assert ledger.receipts_cost() == PRICE * ledger.billed()

    code, second, billed = ledger.run("--budget", "3 USD")  # 12 more; the first 8 are free
    assert code == 1 and billed == 12 and _spent(second) == Decimal(3) and _saved(second) == Decimal(2)
    assert ledger.receipts_cost() == PRICE * ledger.billed() == PRICE * 20

    code, third, billed = ledger.run("--budget", "100USD")
    assert code == 0 and billed == ROWS - 20 and _spent(third) == PRICE * (ROWS - 20)
    assert ledger.receipts_cost() == PRICE * ledger.billed() == PRICE * ROWS  # each lookup billed once
