"""The run report names every outage its calls met (the receipt store, a shared pacer) with
its duration (actors/job/report.py ``outage_rows``, from ``stats()["outages"]``, kept by
actors.stats.Outages). Outages is a plain record: a fake clock drives it here."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from actors.job.report import outage_rows, report_table
from actors.job.runner import RunSummary
from actors.stats import Outages

BEGAN_AT = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _outages() -> tuple[Outages, Clock]:
    clock = Clock()
    return Outages(clock, wall=lambda: BEGAN_AT + (clock.now - 100.0)), clock


def test_outages_open_at_the_first_failure_and_close_at_the_next_answer() -> None:
    outages, clock = _outages()
    where = "postgresql://db/x"
    assert outages.answered("receipt store", where) is None  # none open: nothing to end
    outages.failed("receipt store", where, "AdminShutdown: terminating connection", since=clock.now - 2.0)
    clock.now += 3.0
    outages.failed("receipt store", where, "no connection within 10 s")
    assert outages.since("receipt store", where) == 98.0  # began when the first failing call did
    (ongoing,) = outages.snapshot()
    assert ongoing["ongoing"] and ongoing["duration_s"] == 5.0 and ongoing["failures"] == 2
    clock.now += 7.0
    assert outages.answered("receipt store", where) == 12.0
    (done,) = outages.snapshot()
    assert (done["ongoing"], done["duration_s"], done["began_at"]) == (False, 12.0, BEGAN_AT - 2.0)
    assert done["cause"] == "AdminShutdown: terminating connection"
    assert done["last_error"] == "no connection within 10 s"


def test_outage_rows_name_each_service_and_its_duration() -> None:
    outages, clock = _outages()
    outages.failed("receipt store", "pg", "AdminShutdown: terminating")
    clock.now += 61.5
    outages.answered("receipt store", "pg")
    outages.failed("pacer", "redis://r", "ConnectionError: refused")
    clock.now += 2.0
    outages.answered("pacer", "redis://r")
    outages.failed("receipt store", "pg", "no connection")
    clock.now += 1.0
    rows = dict(outage_rows(outages.snapshot()))
    assert rows == {
        "outage: receipt store #1": "61.5 s from 08:00:00 UTC, 1 call met it: AdminShutdown: terminating",
        "outage: pacer": "2.0 s from 08:01:01 UTC, 1 call met it: ConnectionError: refused",
        "outage: receipt store #2 (still away)": "1.0 s from 08:01:03 UTC, 1 call met it: no connection",
    }


def test_the_report_table_shows_the_outages_of_the_stats() -> None:
    outages, clock = _outages()
    outages.failed("receipt store", "pg", "AdminShutdown")
    clock.now += 4.25
    outages.answered("receipt store", "pg")
    stats: dict[str, Any] = {"outages": outages.snapshot()}
    out = io.StringIO()
    Console(file=out, width=200).print(report_table(stats, RunSummary(rows=1, ok=1)))
    assert "outage: receipt store" in out.getvalue()
    assert "4.2 s from 08:00:00 UTC, 1 call met it: AdminShutdown" in out.getvalue()
