"""What a tool tells the dispatcher about the request it just made: units used, limits announced.

A tool function (or :func:`~actors.http.http_tool`, for every answer) calls
:func:`report_usage` and :func:`report_limits` while it runs; the dispatcher collects
them per attempt (:func:`collecting`) and hands them to the governor with the attempt's
outcome: usage corrects the weighted limits' estimates, announcements set the limits.
Outside an attempt both are no-ops.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence

import attrs

from actors.pacing.announced import Announcement

__all__ = ["Report", "collecting", "report_limits", "report_usage"]


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


def report_usage(**units: float) -> None:
    """Say what the request just made used, e.g. ``report_usage(tokens=812)``: each unit's
    amount (a finite number >= 0) replaces the call's estimate for the limits counted in
    that unit.

    Raises:
        ValueError: an amount that is not a finite number >= 0.
    """
    report = _current.get()
    for unit, amount in units.items():
        value = float(amount)
        if not (value >= 0 and value != float("inf")):
            raise ValueError(f"report_usage({unit}={amount!r}): an amount must be a finite number >= 0")
        if report is not None:
            report.usage[unit] = report.usage.get(unit, 0.0) + value


def report_limits(announcements: Sequence[Announcement]) -> None:
    """Say what limits the provider announced in its answer (see
    :func:`actors.pacing.announced.parse_rate_limit_headers`)."""
    report = _current.get()
    if report is not None:
        report.announced.extend(announcements)
