"""What an answered call cost, worked out on the worker that sent it.

A tool's ``price`` is a :class:`~stores.money.Money` or a function of the input and the
answer (``Tool.price``); a batched tool's ``BatchStrategy.request_price`` is split over
the request's members (:meth:`~stores.money.Money.split`) and added to each member's own
price. A member that failed costs its share of the request price alone. The costs ride
with the answers (``UnitFinished.costs``) and are kept on the receipts when stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from actors.errors import error_text, is_a, signalled, type_name
from actors.tool import Tool
from stores.money import Money

__all__ = ["member_costs"]

log = logging.getLogger(__name__)

_warned: set[tuple[str, str]] = set()
"""(tool id, what went wrong) already logged at WARNING: later ones go to DEBUG."""


def _warn(tool: Tool, what: str, text: str, *args: Any) -> None:
    first = (tool.tool_id, what) not in _warned
    _warned.add((tool.tool_id, what))
    log.log(logging.WARNING if first else logging.DEBUG, "%s: " + text + "; the call's cost is unknown",
            tool.tool_id, *args)  # fmt: skip


def member_costs(
    tool: Tool, inputs: Sequence[Any], values: Sequence[Any], batched: bool
) -> tuple[Money | None, ...]:
    """One cost per member (``values[i]``: its answer, or the exception it failed with),
    in member order; () for a tool with no price at all. Never raises: a price function
    that fails, or gives anything but a Money, leaves that member's cost None (logged at
    WARNING the first time for each tool and kind of fault, then at DEBUG)."""
    price = tool.price
    shared = tool.batch.request_price if batched and tool.batch is not None else None
    if price is None and shared is None:
        return ()
    shares = shared.split(len(values)) if shared is not None else None
    costs: list[Money | None] = []
    for i, value in enumerate(values):
        own: Money | None = None
        if price is not None and not is_a(value, BaseException):
            own = _own(tool, price, inputs[i], value)
            if own is None:
                costs.append(None)  # unknown: its share alone would understate it
                continue
        share = shares[i] if shares is not None else None
        costs.append(_sum(tool, own, share))
    return tuple(costs)


def _own(tool: Tool, price: Any, input: Any, output: Any) -> Money | None:
    if isinstance(price, Money):
        return price
    try:
        cost = price(input, output)
    except BaseException as exc:  # SystemExit & co too: the answer is paid (past Money's bound: ValueError)
        if signalled(exc):  # a host's signal handler raised it: the host's, not this price's
            raise
        _warn(tool, "raised", "its price function raised %s: %s", type_name(exc), error_text(exc))
        return None
    if not isinstance(cost, Money):
        _warn(tool, "not money", "its price function gave %r, not a stores.Money", cost)
        return None
    return cost


def _sum(tool: Tool, own: Money | None, share: Money | None) -> Money | None:
    if own is None or share is None:
        return own if share is None else share
    try:
        return own + share
    except ValueError:  # two currencies, or a sum past Money's bound
        _warn(tool, "sum", "its price (%s) and its share of the request price (%s) do not add up", own, share)
        return None
