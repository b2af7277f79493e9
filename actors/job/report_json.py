"""The run's report as JSON (``tooldispatch run --report-json FILE``), for CI and dashboards.

One object, written when the run ends (also when a signal stopped it)::

    {"version": 1, "status": "finished" | "interrupted" | "aborted",
     "rows": {"total", "ok", "failed", "cut"}, "wall_s", "rows_per_s",
     "ledger": {"spent": LEDGER, "saved": LEDGER, "wasted": LEDGER + {"reasons"}},
     "calls": {"ran", "reused", "reused_receipts", "reused_this_run", "joined", "failed", ...},
     "providers": {name: {"tools", "requests", "answered_429", "answered", "replayed",
                          "pacing": {"org/provider": view}, "waits_s": {reason: seconds}}},
     "counters": {name: int}, "outages": [...], "errors": [{"kind", "rows", "example"}]}

``LEDGER`` is ``{"total": {currency: amount}, "providers": {name: {currency: amount}},
"tools": {tool id: {currency: amount}}}``; amounts are decimal strings (exact: never a
float), currencies ISO 4217 codes. ``spent``: what the answers this run was sent cost by
the tools' prices; ``saved``: what the calls it answered from receipts cost when paid;
``wasted``: what paid calls whose answer was not used cost, with ``reasons`` (``refused``,
``uncertain``: :data:`actors.stats.WASTE_REASONS`) -> {currency: amount}.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from actors.job.runner import RunSummary
from actors.job.tally import CallTally
from stores.money import Money, total

__all__ = ["VERSION", "report_json", "write_report_json"]

VERSION = 1
"""The shape's version: a field's meaning never changes within one."""


def report_json(
    stats: Mapping[str, Any], summary: RunSummary, tally: CallTally | None, tools: Iterable[Any]
) -> dict[str, Any]:
    """The report as a JSON-ready dict (see the module's docstring for its shape)."""
    local = tally.local if tally is not None else set()
    providers: dict[str, list[str]] = {}
    for tool in tools:
        if tool.tool_id not in local:
            providers.setdefault(tool.provider_name, []).append(tool.tool_id)
    per_tool = stats.get("tools") if isinstance(stats.get("tools"), dict) else {}
    assert isinstance(per_tool, dict)

    def summed(ids: list[str], name: str) -> int:
        return sum(int(per_tool.get(t, {}).get(name, 0)) for t in ids)

    pacing = stats.get("pacing") or {}
    status = "aborted" if summary.aborted else "interrupted" if summary.interrupted else "finished"
    return {
        "version": VERSION,
        "status": status,
        "rows": {"total": summary.rows, "ok": summary.ok, "failed": summary.failed, "cut": summary.cut_short},
        "wall_s": round(summary.wall_s, 3),
        "rows_per_s": round(summary.rows_per_s, 1),
        "ledger": {what: _ledger(stats.get(what) or {}, providers) for what in ("spent", "saved", "wasted")},
        "calls": tally.totals() if tally is not None else {},
        "providers": {
            name: {
                "tools": ids,
                "requests": summed(ids, "requests"),
                "answered_429": summed(ids, "backpressure"),
                "answered": summed(ids, "answered"),
                "replayed": summed(ids, "replayed"),
                "pacing": {k: v for k, v in pacing.items() if k.rpartition("/")[2] == name},
                "waits_s": ((stats.get("waits") or {}).get("providers") or {}).get(name, {}),
            }
            for name, ids in sorted(providers.items())
        },
        "counters": {k: v for k, v in stats.items() if isinstance(v, int) and not isinstance(v, bool)},
        "outages": list(stats.get("outages") or ()),
        "errors": [
            {"kind": label, "rows": count, "example": example}
            for label, count, example in summary.errors.most_common(20)
        ],
    }


def write_report_json(path: str, report: Mapping[str, Any]) -> None:
    """Write ``report`` to ``path`` (UTF-8, indented; Money as its decimal string).

    Raises:
        OSError: the file cannot be written.
    """
    data = orjson.dumps(report, default=_plain, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    with open(path, "wb") as out:
        out.write(data + b"\n")


def _ledger(sums: Mapping[str, Any], providers: Mapping[str, list[str]]) -> dict[str, Any]:
    tools = sums.get("tools") or {}
    reasons = {why: _amounts(by.values()) for why, by in sorted((sums.get("reasons") or {}).items())}
    return {
        **({"reasons": reasons} if "reasons" in sums else {}),
        "total": _amounts((sums.get("total") or {}).values()),
        "providers": {
            name: _amounts(m for t in ids for m in tools.get(t, {}).values())
            for name, ids in sorted(providers.items())
            if any(tools.get(t) for t in ids)
        },
        "tools": {tool: _amounts(by.values()) for tool, by in sorted(tools.items())},
    }


def _amounts(amounts: Iterable[Money]) -> dict[str, str]:
    return {currency: f"{money.amount:f}" for currency, money in sorted(total(amounts).items())}


def _plain(value: Any) -> Any:
    if isinstance(value, Money):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)
