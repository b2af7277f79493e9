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

__all__ = ["ZERO", "exact_sum", "overrun_of", "settled_cost", "unit_cost"]

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


def _shares(tool: Tool, members: int) -> list[Money] | None:
    """Each member's share of its batch request's ``request_price`` (None: no such price)."""
    request = tool.batch.request_price if _batched(tool, members) and tool.batch else None
    return request.split(members) if request is not None else None


def unit_cost(tool: Tool, unit: Unit, overrun: Decimal = ZERO) -> Decimal:
    """What ``unit``'s request is known to cost before it is sent (0: nothing known), each
    member counted ``overrun`` more (what a member of this tool has cost past its estimate
    at most so far: :func:`overrun_of`), so that an estimate set too low is passed by a
    budget at most once per call in flight, not by every call of the run."""
    members = len(unit.groups)
    known = tool.known_cost(members, _batched(tool, members))
    amount = known.amount if known is not None else ZERO
    return _EXACT.add(amount, _EXACT.multiply(overrun, members)) if overrun else amount


def overrun_of(tool: Tool, unit: Unit, costs: Sequence[Any], currency: str) -> Decimal:
    """The most a member of ``unit`` cost past its estimate (its stated price and its
    share of the request price), in ``currency`` (0: none did; a fixed price never does)."""
    members = len(unit.groups)
    own = tool.stated_price
    if isinstance(tool.price, Money) or own is None or len(costs) != members:
        return ZERO
    shares = _shares(tool, members)
    most = ZERO
    for i, cost in enumerate(costs):
        if isinstance(cost, Money) and cost.currency == currency:
            estimate = _EXACT.add(own.amount, shares[i].amount) if shares is not None else own.amount
            most = max(most, _EXACT.subtract(cost.amount, estimate))
    return most


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
    own = tool.stated_price
    shares = _shares(tool, members)
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
