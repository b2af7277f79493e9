"""The governor: admission decisions (budgets, concurrency, pacing, backpressure) and its actor."""

from actors.governor.actor import GovernorActor
from actors.governor.decisions import BUDGET_KINDS, Decisions, Governor, suggested_parallelism
from actors.governor.shared import SharedGovernor

__all__ = [
    "BUDGET_KINDS",
    "Decisions",
    "Governor",
    "GovernorActor",
    "SharedGovernor",
    "suggested_parallelism",
]
