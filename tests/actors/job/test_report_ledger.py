"""The run report's ledger, as a table and as JSON: what was spent, saved and wasted per
provider (tools of one provider summed), the waste by reason, amounts exact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from actors import Tool
from actors.job.report import report_table
from actors.job.report_json import report_json, write_report_json
from actors.job.runner import RunSummary
from actors.stats import Stats
from stores.money import Money


def _noop(input: Any, ctx: Any) -> Any:
    return input


TOOLS = [
    Tool(tool_id="verify", provider="acme", fn=_noop, price=Money("0.1", "USD")),
    Tool(tool_id="enrich", provider="acme", fn=_noop, price=Money("0.2", "USD")),
    Tool(tool_id="geo", provider="maps", fn=_noop, price=Money("1", "EUR")),
]


def _stats() -> dict[str, Any]:
    stats = Stats()
    stats.spend([Money("0.1", "USD")] * 3, "verify")
    stats.spend([Money("0.2", "USD")], "enrich")
    stats.save([Money("0.1", "USD")] * 7, "verify")
    stats.waste([Money("0.1", "USD")], "verify", "refused")
    stats.waste([Money("1", "EUR")], "geo", "uncertain")
    return {
        **stats.snapshot(),
        "spent": stats.snapshot_spent(),
        "saved": stats.snapshot_saved(),
        "wasted": stats.snapshot_wasted(),
        "tools": stats.snapshot_tools(),
    }


def _rows(table: Any) -> dict[str, str]:
    console = Console(width=300, record=True)
    console.print(table)
    rows = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_the_report_shows_spent_saved_and_wasted_per_provider() -> None:
    summary = RunSummary(rows=10, ok=10)
    rows = _rows(report_table(_stats(), summary, None, TOOLS))
    assert rows["spent at acme (by the tools' prices)"] == "0.5 USD"
    assert rows["saved at acme (answered from receipts, at what they cost when paid)"] == "0.7 USD"
    assert rows["wasted at acme (paid, answer not used)"] == "0.1 USD"
    assert rows["wasted at maps (paid, answer not used)"] == "1 EUR"
    assert rows["wasted, by reason"] == "refused: 0.1 USD; uncertain: 1 EUR"
    assert "spent at maps (by the tools' prices)" not in rows


def test_the_report_as_json_carries_the_ledger_exactly(tmp_path: Path) -> None:
    summary = RunSummary(rows=10, ok=9, failed=1, wall_s=2.0)
    path = tmp_path / "report.json"
    write_report_json(str(path), report_json(_stats(), summary, None, TOOLS))
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["version"] == 1 and report["status"] == "finished"
    assert report["rows"] == {"total": 10, "ok": 9, "failed": 1, "cut": 0}
    ledger = report["ledger"]
    assert ledger["spent"] == {
        "total": {"USD": "0.5"},
        "providers": {"acme": {"USD": "0.5"}},
        "tools": {"enrich": {"USD": "0.2"}, "verify": {"USD": "0.3"}},
    }
    assert ledger["saved"]["providers"] == {"acme": {"USD": "0.7"}}
    assert ledger["wasted"]["reasons"] == {"refused": {"USD": "0.1"}, "uncertain": {"EUR": "1"}}
    assert ledger["wasted"]["providers"] == {"acme": {"USD": "0.1"}, "maps": {"EUR": "1"}}
    assert set(report["providers"]) == {"acme", "maps"} and report["providers"]["acme"]["tools"] == [
        "verify",
        "enrich",
    ]


def test_the_report_says_where_each_providers_time_went() -> None:
    stats = _stats()
    stats["waits"] = {"providers": {"acme": {"running": 6.0, "slot": 3.0, "store": 1.0}}}
    rows = _rows(report_table(stats, RunSummary(rows=1, ok=1), None, TOOLS))
    assert rows["time at acme (call-seconds, by reason)"] == (
        "running 6.0 s (60%), slot 3.0 s (30%), store 1.0 s (10%)"
    )
    assert "time at maps (call-seconds, by reason)" not in rows
    report = report_json(stats, RunSummary(rows=1, ok=1), None, TOOLS)
    assert report["providers"]["acme"]["waits_s"] == {"running": 6.0, "slot": 3.0, "store": 1.0}
