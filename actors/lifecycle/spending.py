"""What a unit is charged under a money budget, and what its answer settles it at.

A unit is charged, when it is granted its slot, what it is known to cost
(:meth:`~actors.tool.Tool.known_cost`: a fixed price, or the tool's ``price_estimate``,
per member, and a batch request's ``request_price``); once its answer comes, the charge
is settled to what the answer cost (``UnitFinished.costs``), a member whose cost is
unknown or in another currency being counted at its estimate. Amounts are
:class:`~decimal.Decimal` in the budget's currency, summed exactly.
"""

from __future__ import annotations

import decimal
import logging
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from actors.lifecycle.calls import Unit
from actors.tool import Tool
from stores.money import Money

__all__ = ["ZERO", "exact_sum", "settled_cost", "unit_cost"]

log = logging.getLogger("tooldispatch")

ZERO = Decimal(0)
_EXACT = decimal.Context(prec=80, traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation])
_warned: set[tuple[str, str]] = set()
"""(tool id, currency) whose cost in another currency than its budget's was logged."""


def exact_sum(amounts: Iterable[Decimal]) -> Decimal:
    """The sum of ``amounts``, exact (never rounded)."""
    out = ZERO
    for amount in amounts:
        out = _EXACT.add(out, amount)
    return out


def exact_difference(a: Decimal, b: Decimal) -> Decimal:
    """``a - b``, exact."""
    return _EXACT.subtract(a, b)


def _batched(tool: Tool, members: int) -> bool:
    return tool.batch is not None and members > 1  # as the attempt's spec (``spec_for``)


def unit_cost(tool: Tool, unit: Unit) -> Decimal:
    """What ``unit``'s request is known to cost before it is sent (0: nothing known)."""
    known = tool.known_cost(len(unit.groups), _batched(tool, len(unit.groups)))
    return known.amount if known is not None else ZERO


def settled_cost(
    tool: Tool, unit: Unit, charge: Decimal, costs: Sequence[Any], failed: Sequence[bool], currency: str
) -> Decimal:
    """What ``unit``'s answered request cost, from its members' ``costs`` (in member order,
    as :func:`~actors.worker.prices.member_costs` gives them; ``failed[i]``: member i's
    answer was an error, which costs its share of the request price alone): a member's
    cost in ``currency``, or its estimate when its cost is unknown (None) or in another
    currency (logged at WARNING once per tool and currency). Costs that do not match the
    members (none at all): ``charge``, what it was charged, as it was."""
    members = len(unit.groups)
    if not costs or len(costs) != members:
        return charge
    batched = _batched(tool, members)
    own = tool.stated_price
    shares = (
        tool.batch.request_price.split(members)
        if batched and tool.batch and tool.batch.request_price
        else None
    )
    total = ZERO
    for i, cost in enumerate(costs):
        if isinstance(cost, Money) and cost.currency == currency:
            total = _EXACT.add(total, cost.amount)
            continue
        if isinstance(cost, Money) and (tool.tool_id, cost.currency) not in _warned:
            _warned.add((tool.tool_id, cost.currency))
            log.warning(
                "%s: a call cost %s, not in its money budget's currency (%s): counted at its estimate",
                tool.tool_id, cost, currency,
            )  # fmt: skip
        estimate = own.amount if own is not None and not (i < len(failed) and failed[i]) else ZERO
        if shares is not None:
            estimate = _EXACT.add(estimate, shares[i].amount)
        total = _EXACT.add(total, estimate)
    return total
