"""The governor: admission decisions (budgets, concurrency, pacing, backpressure) and its actor.

A :class:`Governor` holds a :class:`GovernorPacing`: :class:`LocalPacing` (this process's
buckets) or :class:`SharedPacing` (a shared pacer, as in :func:`shared_governor`).
"""

from actors.governor.actor import GovernorActor
from actors.governor.decisions import (
    BUDGET_KINDS,
    Decisions,
    Governor,
    GovernorPacing,
    LocalPacing,
    suggested_parallelism,
)
from actors.governor.shared import SharedPacing, shared_governor

__all__ = [
    "BUDGET_KINDS",
    "Decisions",
    "Governor",
    "GovernorActor",
    "GovernorPacing",
    "LocalPacing",
    "SharedPacing",
    "shared_governor",
    "suggested_parallelism",
]
