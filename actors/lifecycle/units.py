"""What a unit is counted at under a provider's limits in units (tokens, credits, rows).

A unit takes, when it is granted its slot, its members' estimates (``Tool.units`` of each
input, summed), each unit name scaled by :class:`UnitBias` (how far real use has run past
the estimates lately), so that estimates that run low do not let the run pass a limit
before their answers correct it. Its answer's real use (``Tool.units_used``, or what the
tool reported with :func:`actors.pacing.reports.report_usage`) corrects the limits by the
difference; a unit never sent gives its units back.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from actors.lifecycle.calls import Unit
from actors.tool import Limit, Tool

__all__ = [
    "BIAS_SAMPLES",
    "COLD_FACTOR",
    "COLD_SAMPLES",
    "MARGIN",
    "MAX_FACTOR",
    "PERCENTILE",
    "UnitBias",
    "estimate_units",
    "used_units",
]

log = logging.getLogger("tooldispatch")

BIAS_SAMPLES = 64
"""Answers per unit name whose real use / estimate :class:`UnitBias` keeps."""
COLD_FACTOR = 2.0
"""The factor estimates are taken at until :data:`COLD_SAMPLES` answers have shown how far
off they run (estimates that run up to half low pass no limit meanwhile)."""
COLD_SAMPLES = 8
MARGIN = 1.05
"""The high ratio seen (:data:`PERCENTILE`) is taken this much larger (the next answers
may run a little further off than the last :data:`BIAS_SAMPLES` did)."""
PERCENTILE = 0.95
"""The ratio the factor follows: this fraction of the last answers ran at or under it (one
outlier answer, a short prompt with a long answer, moves it not)."""
MAX_FACTOR = 2.0
"""The factor's cap: estimates are never taken at more than this multiple."""


def _units_of(tool: Tool, value: Any) -> dict[str, float]:
    """``tool.units(value)`` checked: a mapping of finite numbers >= 0 (else {} and a warning)."""
    if tool.units is None:
        return {}
    try:
        found = tool.units(value)
        out = {str(k): float(v) for k, v in dict(found).items()}
        if not all(math.isfinite(v) and v >= 0 for v in out.values()):
            raise ValueError(f"amounts must be finite numbers >= 0, got {found!r}")
    except Exception as exc:  # one call's bad estimate counts it at 0, never breaks the others
        log.warning("%s: Tool.units failed (%s: %s): the call is counted at 0 units", tool.tool_id,
                    type(exc).__name__, exc)  # fmt: skip
        return {}
    return out


def estimate_units(tool: Tool, unit: Unit) -> dict[str, float]:
    """What ``unit``'s request is expected to use: its members' ``Tool.units``, summed."""
    total: dict[str, float] = {}
    for group in unit.groups:
        for name, amount in _units_of(tool, group.input).items():
            total[name] = total.get(name, 0.0) + amount
    return total


def used_units(
    tool: Tool, inputs: list[Any], values: list[Any], reported: Mapping[str, float]
) -> dict[str, float]:
    """What a request really used: ``Tool.units_used`` of each answered member, summed,
    the units the tool reported (``report_usage``) replacing it unit by unit."""
    used: dict[str, float] = {}
    if tool.units_used is not None:
        for value, output in zip(inputs, values, strict=False):
            if isinstance(output, BaseException):
                continue
            try:
                found = {str(k): float(v) for k, v in dict(tool.units_used(value, output)).items()}
            except Exception as exc:
                log.warning("%s: Tool.units_used failed (%s: %s): its estimate stands", tool.tool_id,
                            type(exc).__name__, exc)  # fmt: skip
                continue
            for name, amount in found.items():
                if math.isfinite(amount) and amount >= 0:
                    used[name] = used.get(name, 0.0) + amount
    used.update(reported)
    return used


class UnitBias:
    """How far real use has run past the estimates, per unit name: the
    :data:`PERCENTILE` ratio real / estimate of the last :data:`BIAS_SAMPLES` answers that
    reported real use, times :data:`MARGIN`, between 1 and :data:`MAX_FACTOR`; before
    :data:`COLD_SAMPLES` answers: :data:`COLD_FACTOR`; 1 when none of them reported real
    use (no evidence of bias: the estimate stands). Estimates are taken at this multiple
    (a margin that follows the tool's error), then corrected to the real use when the
    answer comes, so a run of low estimates is not a run of 429s: what the calls in
    flight may use past their estimates is held back, and no more. A scaled amount is
    never judged against a quota's whole amount: :meth:`scaled` takes it at the quota."""

    def __init__(self) -> None:
        self._ratios: dict[str, collections.deque[float]] = {}
        self._answers: dict[str, int] = {}

    def factor(self, name: str) -> float:
        if self._answers.get(name, 0) < COLD_SAMPLES:
            return COLD_FACTOR
        ratios = sorted(self._ratios.get(name, ()))
        if not ratios:
            return 1.0
        high = ratios[max(0, math.ceil(PERCENTILE * len(ratios)) - 1)]
        return min(MAX_FACTOR, max(1.0, high * MARGIN))

    def scaled(self, estimate: Mapping[str, float], limits: Sequence[Limit] = ()) -> dict[str, float]:
        """``estimate`` with each unit at its factor; an amount so scaled above the whole
        amount of a quota of its unit in ``limits`` is taken at that amount (or at the
        estimate, when the estimate alone passes it): a call is refused as larger than a
        quota for its own estimate, never for the factor."""
        out: dict[str, float] = {}
        for name, amount in estimate.items():
            value = amount * self.factor(name)
            for lim in limits:
                if lim.unit == name and not lim.is_rate and value > lim.amount:
                    value = max(amount, float(lim.amount))
            out[name] = value
        return out

    def learn(self, estimate: Mapping[str, float], used: Mapping[str, float]) -> None:
        """One answer: its unbiased ``estimate`` and its real ``used`` units (empty: it
        reported none). A ratio that is not a finite number >= 0 is ignored."""
        for name, amount in estimate.items():
            if amount <= 0:
                continue
            self._answers[name] = self._answers.get(name, 0) + 1
            if name not in used:
                continue
            ratio = used[name] / amount
            if math.isfinite(ratio) and ratio >= 0:
                self._ratios.setdefault(name, collections.deque(maxlen=BIAS_SAMPLES)).append(ratio)
