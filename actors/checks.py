"""Checks of configuration values (Tool, Pacing, BatchStrategy, Policy), at construction.

A value that would only fail later, on an actor's thread (a NaN timeout, an int past a
float's range, a batch size of 2.5, a concurrency of 0), is refused where it is given,
with a ``ValueError`` naming the field: later it would stop the actor or hang every call.
"""

from __future__ import annotations

import math
from typing import Any

from stores.quoting import brief

__all__ = ["MAX_WEIGHT", "MIN_WEIGHT", "check_count", "check_number", "check_weight"]


def check_number(
    name: str, value: Any, *, positive: bool = False, minimum: float = 0.0, optional: bool = False
) -> None:
    """``value`` is a real number (not a bool, not NaN; ``inf`` is "never"), at least
    ``minimum`` (above it when ``positive``); None passes when ``optional``.

    Raises:
        ValueError: anything else, naming ``name``.
    """
    if value is None and optional:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        ok = ok and not math.isnan(value) and (value > minimum if positive else value >= minimum)
    except OverflowError:  # an int past a float's range
        ok = False
    if not ok:
        bound = f"> {minimum:g}" if positive else f">= {minimum:g}"
        raise ValueError(f"{name} must be a number {bound}, got {brief(value)}")


def check_count(name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> None:
    """``value`` is an int (not a bool) of at least ``minimum``; None passes when ``optional``.

    Raises:
        ValueError: anything else, naming ``name``.
    """
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {brief(value)}")


MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6
"""The range of a fairness weight: a ratio of 10^12 between two keys is more than any
share needs, and the shares' arithmetic stays exact within it (a weight of 1e308, or a
denormal one, made a share NaN or divided by zero)."""


def check_weight(name: str, value: Any) -> float:
    """``value`` as a fairness weight: a real number (not a bool) from :data:`MIN_WEIGHT` to
    :data:`MAX_WEIGHT`.

    Raises:
        ValueError: anything else, naming ``name``.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        ok = ok and MIN_WEIGHT <= value <= MAX_WEIGHT  # NaN fails it
    except OverflowError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {brief(value)}")
    return float(value)
