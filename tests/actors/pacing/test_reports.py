"""What a tool reports of the request it made (actors.pacing.reports): a report runs after
the provider answered, so whatever it is given it never raises and never loses the answer."""

from __future__ import annotations

import logging
import math

import pytest

from actors.pacing.announced import Announcement
from actors.pacing.reports import MAX_UNITS, collecting, report_limits, report_usage


def test_reports_add_up_within_an_attempt() -> None:
    with collecting() as report:
        report_usage(tokens=800, credits=1.5)
        report_usage(tokens=12)
        report_limits([Announcement(limit=50, window_s=1)])
    assert report.usage == {"tokens": 812.0, "credits": 1.5}
    assert report.announced == [Announcement(limit=50, window_s=1)]


def test_reports_outside_an_attempt_do_nothing() -> None:
    report_usage(tokens=5)
    report_limits([Announcement(limit=50)])


@pytest.mark.parametrize(
    "junk", [None, "12", True, math.nan, math.inf, -1, 1e300, 10**400, object(), [3]], ids=repr
)
def test_report_usage_ignores_what_is_no_amount_and_never_raises(
    junk: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="actors.pacing.reports"), collecting() as report:
        report_usage(tokens=junk, credits=3)  # type: ignore[arg-type]
    assert report.usage == {"credits": 3.0}
    assert "report_usage(tokens=" in caplog.text and "ignored" in caplog.text


def test_report_usage_sums_stay_within_the_cap() -> None:
    with collecting() as report:
        report_usage(tokens=MAX_UNITS)
        report_usage(tokens=MAX_UNITS)
    assert report.usage == {"tokens": MAX_UNITS}
