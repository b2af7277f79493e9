"""A governor whose pacing is shared with other worker processes through one pacer.

Its rate, Retry-After pauses and circuit live in the pacer, so every worker process
pointed at the same pacer paces one provider together; the pacing code is the one every
governor runs (:class:`~actors.governor.decisions.GovernorPacing`). What stays in each
process: budgets, the global ceiling (``Policy.max_concurrency``) and each provider's
``max_concurrency`` (both are per process), the send gates, and the counters of the
pacing report.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from actors.governor.decisions import Governor
from actors.pacing.pacers import Pacer
from actors.tool import Pacing, Policy

__all__ = ["shared_governor"]


def shared_governor(
    policy: Policy,
    pacings: dict[str, Pacing],
    pacer: Pacer,
    rng: Callable[[], float] = random.random,
    fairness_key: str | None = None,
    fairness_weight: float = 1.0,
) -> Governor:
    """A :class:`~actors.governor.decisions.Governor` pacing through ``pacer``, shared with
    other processes (its state: ``governor.pacing``).

    Args:
        policy: as :class:`~actors.governor.decisions.Governor`; its circuit settings
            become the pacer's when the pacer's were not chosen.
        pacings: provider name -> Pacing; a provider the pacer has no limits for gets
            :meth:`ProviderLimits.from_pacing` of its Pacing.
        pacer: the pacer (the caller closes it).
        rng: jitter source.
        fairness_key / fairness_weight: this governor's fair share among the keys taking
            from ``pacer`` (as :class:`~actors.governor.decisions.Governor`).
    """
    return Governor(policy, pacings, rng, pacer, fairness_key, fairness_weight)
