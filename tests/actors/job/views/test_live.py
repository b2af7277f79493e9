"""The live view: a row per provider under the progress line (sent/s, pacing and its
limit, calls in flight, 429s, spent, saved, what holds it up), the holdups said from the
stats, and the display sampling the run's time series on its own thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from rich.console import Console

import actors.job.report as report_module
from actors.job.report import ProgressDisplay
from actors.job.views import Timeline, holdups, live_view
from stores.money import Money


def _view(**over: Any) -> dict[str, Any]:
    view = {
        "rate_rps": 9.5, "learnt": "plateau", "limit_rps": 10.2, "paused_for_s": 0.0, "pauses": [],
        "circuit": "closed", "held_s": 1.0, "in_flight": 3,
    }  # fmt: skip
    view.update(over)
    return view


def _stats(**view: Any) -> dict[str, Any]:
    return {
        "tools": {
            "verify": {"requests": 50, "backpressure": 4},
            "enrich": {"requests": 5, "backpressure": 1},
        },
        "pacing": {"default/acme": _view(**view)},
        "spent": {"tools": {"verify": {"USD": Money("1.5", "USD")}, "enrich": {"USD": Money("0.25", "USD")}}},
        "saved": {"tools": {"verify": {"USD": Money("3", "USD")}}},
        "outages": [],
    }


def _text(renderable: Any, width: int = 200) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_live_view_shows_a_row_per_provider_with_its_figures() -> None:
    text = _text(live_view("progress: rows 1/2", _stats(), {"acme": ["verify", "enrich"]}, {"acme": 9.8}))
    assert text.splitlines()[0] == "progress: rows 1/2"
    header = text.splitlines()[1].split()
    assert header[:2] == ["provider", "sent/s"] and "holding" in header
    row = text.splitlines()[2]
    for figure in ("acme", "9.8", "9.5/s (plateau), limit 10.2/s", " 3 ", " 5 ", "1.75 USD", "3 USD"):
        assert figure in row, (figure, row)


def test_live_view_without_providers_is_the_progress_line() -> None:
    assert _text(live_view("progress: rows 1/2", _stats(), {}, {})).strip() == "progress: rows 1/2"


def test_holdups_say_a_pause_with_its_retry_after() -> None:
    stats = _stats(paused_for_s=0.84, pauses=[{"ago_s": 0.2, "pause_s": 1.0, "retry_after": "1"}])
    assert holdups("acme", stats, _stats()) == ["paused 0.8 s more (Retry-After 1)"]


def test_holdups_say_an_open_circuit() -> None:
    assert holdups("acme", _stats(circuit="half_open"), None) == ["circuit half-open"]


def test_holdups_say_pacing_when_calls_were_held_since_the_last_look() -> None:
    assert holdups("acme", _stats(held_s=1.3), _stats(held_s=1.0)) == [
        "pacing: calls wait their turn at 9.5/s"
    ]
    assert holdups("acme", _stats(held_s=1.0), _stats(held_s=1.0)) == []  # nothing held now


def test_holdups_name_the_waits_by_reason_that_grew_most_running_aside() -> None:
    now, before = _stats(held_s=1.0), _stats(held_s=1.0)
    now["waits"] = {"providers": {"acme": {"slot": 5.0, "store": 2.5, "pause": 1.0, "running": 60.0}}}
    before["waits"] = {"providers": {"acme": {"slot": 4.9, "store": 1.0, "pause": 0.5, "running": 1.0}}}
    assert holdups("acme", now, before) == ["waiting for the receipt store", "waiting for a pause"]
    assert holdups("acme", now, now) == []


def test_live_view_says_what_holds_every_provider_up() -> None:
    stats = _stats()
    stats["outages"] = [
        {"service": "receipt store", "ongoing": True, "duration_s": 3.25, "cause": "database is locked"},
        {"service": "receipt store", "ongoing": False, "duration_s": 1.0, "cause": "gone"},
    ]
    stats["waiting_on_owner"] = 2
    last = _text(live_view("p", stats, {"acme": ["verify"]}, {})).strip().splitlines()[-1]
    assert last == (
        "holding every provider up: receipt store away for 3.2 s: database is locked; "
        "2 calls wait for another run's receipt"
    )


def test_live_view_shows_text_from_the_play_as_written() -> None:
    stats = _stats()
    stats["pacing"] = {"default/[bold]acme[/]": _view()}
    text = _text(live_view("p", stats, {"[bold]acme[/]": ["verify"]}, {}))
    assert "[bold]acme[/]" in text  # never read as markup


def test_progress_display_samples_the_timeline_on_its_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_module, "SAMPLE_EVERY_S", 0.01)
    enough = threading.Event()
    calls: list[str] = []
    stats = _stats()

    def read() -> dict[str, Any]:
        calls.append(threading.current_thread().name)
        if len(calls) >= 5:
            enough.set()
        return stats

    timeline = Timeline({"acme": ["verify", "enrich"]}, started=0.0)
    console = Console(file=open("/dev/null", "w"), force_terminal=False)  # noqa: SIM115
    display = ProgressDisplay(console, 10, read, interval_s=0.01, timeline=timeline).start()
    try:
        assert enough.wait(10), calls
    finally:
        display.close(final=False)
        console.file.close()
    points = timeline.series()["acme"]
    assert points and points[-1].requests == 55 and points[-1].limited == 5
    assert set(calls) == {"tooldispatch-progress"}  # never the caller's thread
