"""Budgets in money: what the governor charges a call before it is sent, and the checks
made when a system starts.

A call (or a batch request) is charged what it is known to cost
(:meth:`~actors.tool.Tool.known_cost`) when it is granted its slot, before it is sent;
one that would pass the run's budget (``Policy.max_spend``) or its provider's
(``Policy.max_spend_by_provider``) is refused. A charge comes back when nothing was sent,
and is settled to the real cost once the answer says it. Amounts are
:class:`~decimal.Decimal` in the budget's currency: :func:`check_money_budgets` has made
sure, at start, that every price counted under a budget is in that currency.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Sequence
from decimal import Decimal

from actors.errors import BudgetExceededError
from actors.tool import Policy, Tool
from stores.money import Money

__all__ = ["MoneyBudgets", "check_money_budgets"]

ZERO = Decimal(0)
_EXACT = decimal.Context(prec=80, traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation])
"""As :mod:`stores.money`'s: sums of amounts are exact, never rounded."""


def check_money_budgets(tools: Iterable[Tool], policy: Policy) -> None:
    """Refuse, before any actor starts, money budgets that cannot be kept.

    Raises:
        ValueError: a provider budget names no provider of ``tools``; the run's budget and
            a provider's are in two currencies; a fixed price (``Tool.price``,
            ``BatchStrategy.request_price``) or a ``price_estimate`` counted under a budget
            is in another currency than the budget's; or a tool priced from its answer (a
            ``price`` function) under a budget states no ``price_estimate``. Each names
            the tool (or provider) and both currencies.
    """
    tools = list(tools)
    providers = {t.provider_name for t in tools if t.durable}  # (a local tool is free: no provider)
    for provider, budget in policy.max_spend_by_provider.items():
        if provider not in providers:
            raise ValueError(
                f"Policy.max_spend_by_provider names provider {provider!r}, which no tool uses "
                f"(providers: {', '.join(sorted(providers))})"
            )
        if policy.max_spend is not None and budget.currency != policy.max_spend.currency:
            raise ValueError(
                f"provider {provider!r}'s budget is in {budget.currency} and the run's in "
                f"{policy.max_spend.currency}: a price cannot count against both"
            )
    for tool in tools:
        currency = policy.spend_currency(tool.provider_name)
        if currency is None or not tool.durable or not tool.priced:
            continue
        fixed = [
            ("price", tool.price if isinstance(tool.price, Money) else None),
            ("price_estimate", tool.price_estimate if not isinstance(tool.price, Money) else None),
            ("BatchStrategy.request_price", tool.batch.request_price if tool.batch is not None else None),
        ]
        for name, price in fixed:
            if price is not None and price.currency != currency:
                raise ValueError(
                    f"tool {tool.tool_id!r}: its {name} is in {price.currency} and its money budget "
                    f"in {currency}: state them in one currency"
                )
        if callable(tool.price) and not isinstance(tool.price, Money) and tool.price_estimate is None:
            raise ValueError(
                f"tool {tool.tool_id!r} is priced from its answer and runs under a money budget "
                f"({currency}): give it a price_estimate, what a call is counted at until it is paid"
            )


class MoneyBudgets:
    """The run's money budget and each provider's, and what is charged against them.

    Args:
        policy: ``max_spend`` and ``max_spend_by_provider``.
    """

    def __init__(self, policy: Policy) -> None:
        self.run = policy.max_spend
        self.providers = dict(policy.max_spend_by_provider)
        self.spent = ZERO
        """Charged against the run's budget: the settled costs and the charges still out."""
        self.spent_by_provider: dict[str, Decimal] = {}
        """Provider name -> charged against its budget (providers with one only)."""

    def applies(self, provider: str) -> bool:
        """Whether a budget in money counts ``provider``'s calls."""
        return self.run is not None or provider in self.providers

    def room(self, provider: str, prices: Sequence[Decimal]) -> int:
        """How many of ``prices`` (in order, from the first) fit in what is left."""
        left = self._left(provider)
        fit = 0
        for price in prices:
            if price > left:
                break
            left = _EXACT.subtract(left, price)
            fit += 1
        return fit

    def refusal(self, provider: str, price: Decimal) -> BudgetExceededError:
        """The error for a call of ``price`` that would pass a budget of ``provider``."""
        for name, budget, spent in self._budgets(provider):
            if _EXACT.add(spent, price) > budget.amount:
                return BudgetExceededError(
                    f"{name} ({budget}) would be passed: {spent:f} {budget.currency} is spent or held "
                    f"for calls under way, and this request (a call, or a batch of calls and its request "
                    f"price) costs {price:f} {budget.currency}; it was not sent (its receipt is left "
                    "pending, for a run with more budget)"
                )
        return BudgetExceededError(
            f"a money budget of provider {provider!r} would be passed"
        )  # pragma: no cover

    def charge(self, provider: str, prices: Sequence[Decimal]) -> None:
        """Charge the sum of ``prices`` (known to fit: :meth:`room`) to every budget of
        ``provider``."""
        amount = ZERO
        for price in prices:
            amount = _EXACT.add(amount, price)
        self._add(provider, amount)

    def give_back(self, provider: str, amount: Decimal) -> None:
        """Give back ``amount`` charged and not spent (a request never sent, or an estimate
        above the real cost); a negative amount charges the rest of a cost above its
        estimate (it was paid: counted even past the budget). Never below nothing spent."""
        if amount:
            self._add(provider, -amount)

    def _add(self, provider: str, amount: Decimal) -> None:
        if self.run is not None:
            self.spent = max(ZERO, _EXACT.add(self.spent, amount))
        if provider in self.providers:
            spent = self.spent_by_provider.get(provider, ZERO)
            self.spent_by_provider[provider] = max(ZERO, _EXACT.add(spent, amount))

    def _left(self, provider: str) -> Decimal:
        return min(
            (_EXACT.subtract(budget.amount, spent) for _, budget, spent in self._budgets(provider)),
            default=Decimal("Infinity"),
        )

    def _budgets(self, provider: str) -> list[tuple[str, Money, Decimal]]:
        out = []
        if self.run is not None:
            out.append(("the run's money budget", self.run, self.spent))
        budget = self.providers.get(provider)
        if budget is not None:
            spent = self.spent_by_provider.get(provider, ZERO)
            out.append((f"the money budget of provider {provider!r}", budget, spent))
        return out
