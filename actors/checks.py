"""Checks of configuration values (Tool, Pacing, BatchStrategy, Policy), at construction.

A value that would only fail later, on an actor's thread (a NaN timeout, an int past a
float's range, a batch size of 2.5, a concurrency of 0), is refused where it is given,
with a ``ValueError`` naming the field: later it would stop the actor or hang every call.
"""

from __future__ import annotations

import math
from typing import Any

from stores.quoting import brief

__all__ = ["check_count", "check_number"]


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
