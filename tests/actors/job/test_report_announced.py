"""The run's report says a limit the provider announced is announced, not learnt."""

from __future__ import annotations

from actors.job.report import pacing_cell


def test_report_pacing_cell_names_an_announced_limit() -> None:
    view = {"learnt": "announced", "rate_rps": 49.0, "limit_rps": 50.0, "held_s": 1.25}
    assert pacing_cell(view) == "announced: 49.0/s (limit announced 50.0/s), calls held back 1.2 s"
    learnt = {**view, "learnt": "plateau"}
    assert pacing_cell(learnt).startswith("plateau: 49.0/s (limit learnt 50.0/s)")
