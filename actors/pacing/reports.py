"""What a tool tells the dispatcher about the request it just made: units used, limits announced.

A tool function (or :func:`~actors.http.http_tool`, for every answer) calls
:func:`report_usage` and :func:`report_limits` while it runs; the dispatcher collects
them per attempt (:func:`collecting`) and hands them to the governor with the attempt's
outcome: usage corrects the weighted limits' estimates, announcements set the limits.
Outside an attempt both are no-ops.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence

import attrs

from actors.pacing.announced import Announcement

__all__ = ["MAX_UNITS", "Report", "collecting", "report_limits", "report_usage"]

log = logging.getLogger(__name__)


@attrs.define
class Report:
    """What one attempt reported: ``usage`` (unit -> units used, summed over its calls to
    :func:`report_usage`) and ``announced`` (every :class:`Announcement`, oldest first)."""

    usage: dict[str, float] = attrs.field(factory=dict)
    announced: list[Announcement] = attrs.field(factory=list)


_current: contextvars.ContextVar[Report | None] = contextvars.ContextVar("tooldispatch_report", default=None)


class collecting:
    """Collect what the code run inside reports, into the :class:`Report` it yields.

    A plain context manager, not a generator's: an exception raised inside passes through
    untouched (a generator's would have its traceback set again, which an error class
    may refuse)."""

    def __enter__(self) -> Report:
        self._report = Report()
        self._token = _current.set(self._report)
        return self._report

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


MAX_UNITS = 1e15
"""The most one report may state of a unit: more is no real use (a runaway count, 1e300),
and would hold its limits for ever."""


def report_usage(**units: float) -> None:
    """Say what the request just made used, e.g. ``report_usage(tokens=812)``: each unit's
    amount (an int or float, finite, 0 to :data:`MAX_UNITS`) replaces the call's estimate
    for the limits counted in that unit; several reports of one unit add up.

    Never raises: it runs after the provider answered, and the answer is paid for. An
    amount that is not such a number (None, a string, a bool, NaN, negative, too large)
    is ignored, with a warning logged, and the call's estimate stands.
    """
    report = _current.get()
    for unit, amount in units.items():
        value = _amount(amount)
        if value is None:
            log.warning(
                "report_usage(%s=%.60r) ignored: an amount is a number from 0 to %g", unit, amount, MAX_UNITS
            )
            continue
        if report is not None:
            report.usage[unit] = min(MAX_UNITS, report.usage.get(unit, 0.0) + value)


def _amount(amount: object) -> float | None:
    """``amount`` as units used, or None when it is no such number."""
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        return None
    try:
        value = float(amount)
    except OverflowError:  # an int past a float's range
        return None
    return value if 0 <= value <= MAX_UNITS else None  # NaN fails both


def report_limits(announcements: Sequence[Announcement]) -> None:
    """Say what limits the provider announced in its answer (see
    :func:`actors.pacing.announced.parse_rate_limit_headers`)."""
    report = _current.get()
    if report is not None:
        report.announced.extend(announcements)
