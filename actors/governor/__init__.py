"""The governor: admission decisions (budgets, concurrency, pacing, backpressure) and its actor.

A :class:`Governor` paces through a :class:`GovernorPacing` over a pacer: its own
:class:`~actors.pacing.pacers.LocalPacer`, or one shared with other processes (as in
:func:`shared_governor`); the same code paces both.
"""

from actors.governor.actor import GovernorActor
from actors.governor.budgets import MoneyBudgets, check_money_budgets
from actors.governor.decisions import (
    BUDGET_KINDS,
    Decisions,
    Governor,
    GovernorPacing,
    suggested_parallelism,
)
from actors.governor.shared import shared_governor

__all__ = [
    "BUDGET_KINDS",
    "Decisions",
    "Governor",
    "GovernorActor",
    "GovernorPacing",
    "MoneyBudgets",
    "check_money_budgets",
    "shared_governor",
    "suggested_parallelism",
]
