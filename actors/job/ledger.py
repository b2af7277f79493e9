"""What the receipts in a store cost, summed by a grouping (``tooldispatch receipts cost``).

Each receipt keeps what its call cost when it was paid (``Receipt.cost``, a
:class:`~stores.money.Money`); this sums those costs per group and currency, exactly.
A receipt holds its latest payment only: a refresh replaces its cost, and a purged
receipt is gone, so the sums are what the receipts held now were paid.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from stores.money import Money
from stores.rows import read_cost

__all__ = ["BY", "CostLine", "cost_lines", "parse_since"]

BY = ("tool", "provider", "org", "day", "run")
"""The groupings ``receipts cost --by`` knows: a receipt's tool id, its tool's provider
(from the play's tools: receipts do not keep it), its org, the UTC day its call was paid
(completed), the run that stored its output (``lease_owner_run_id``, kept after
completion; ``(unknown)`` where a resolution or a restored refresh dropped it)."""


@attrs.frozen
class CostLine:
    """One group's sum in one currency (``spent``: None when none of its receipts kept a cost).

    Attributes:
        group: the tool id, org or ``YYYY-MM-DD`` (UTC) the line sums.
        spent: what its receipts cost when paid, in one currency.
        paid: receipts with a cost in that currency.
        unpriced: its completed receipts that kept no cost (paid while their tool had
            no price, or a price that could not be worked out), on the group's first line.
    """

    group: str
    spent: Money | None
    paid: int
    unpriced: int


def cost_lines(
    rows: Iterable[Mapping[str, Any]], by: str, providers: Mapping[str, str] | None = None
) -> list[CostLine]:
    """Sum ``rows`` (``tool_id``, ``org_id``, ``status``, ``cost`` text, ``completed_at``
    epoch seconds, ``lease_owner_run_id``) by ``by`` (one of :data:`BY`), sorted by group
    then currency. A cost whose text is not an amount of money (set by hand) counts as
    none. ``providers``: tool id -> provider, for ``by="provider"`` (a tool not in it is
    its own provider, as ``Tool.provider_name`` has it).

    Raises:
        ValueError: ``by`` is not one of :data:`BY`; a group's sum reaches Money's bound.
    """
    if by not in BY:
        raise ValueError(f"--by {by!r}: one of {', '.join(BY)}")
    providers = providers or {}
    sums: dict[str, dict[str, list[Any]]] = {}
    unpriced: dict[str, int] = {}
    for row in rows:
        group = _group(row, by, providers)
        cost = read_cost(row.get("cost"))
        if cost is None:
            if row.get("status") == "completed":
                unpriced[group] = unpriced.get(group, 0) + 1
            continue
        held = sums.setdefault(group, {}).get(cost.currency)
        if held is None:
            sums[group][cost.currency] = [cost, 1]
        else:
            held[0] += cost
            held[1] += 1
    lines: list[CostLine] = []
    for group in sorted(set(sums) | set(unpriced)):
        currencies = sums.get(group, {})
        left = unpriced.get(group, 0)
        if not currencies:
            lines.append(CostLine(group, None, 0, left))
            continue
        for i, currency in enumerate(sorted(currencies)):
            spent, paid = currencies[currency]
            lines.append(CostLine(group, spent, paid, left if i == 0 else 0))
    return lines


def _group(row: Mapping[str, Any], by: str, providers: Mapping[str, str]) -> str:
    if by == "tool":
        return str(row.get("tool_id"))
    if by == "provider":
        tool = str(row.get("tool_id"))
        return providers.get(tool, tool)
    if by == "org":
        return str(row.get("org_id"))
    if by == "run":
        run = row.get("lease_owner_run_id")
        return str(run) if run else "(unknown)"
    at = row.get("completed_at")
    if not isinstance(at, (int, float)):
        return "(not completed)"
    return datetime.datetime.fromtimestamp(at, tz=datetime.timezone.utc).date().isoformat()


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", re.IGNORECASE)
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now_s: float) -> float:
    """``--since`` as epoch seconds: a duration back from ``now_s`` (``"36h"``, ``"7d"``,
    ``"2w"``; s, m, h, d, w) or an ISO 8601 date or time (``"2026-12-01"``,
    ``"2026-12-01T09:30"``; UTC when it names no offset).

    Raises:
        ValueError: neither.
    """
    match = _DURATION.fullmatch(text)
    if match is not None:
        return now_s - float(match.group(1)) * _SECONDS[match.group(2).lower()]
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give a duration back from now (36h, 7d, 2w) or a date (2026-12-01)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()
