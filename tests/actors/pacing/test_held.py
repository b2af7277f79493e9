"""How long pacing held a provider's calls back: :class:`actors.pacing.held.HeldClock`
(a plain counter, times passed in) and the figure a real dispatch system reports from it
(``stats()["pacing"][...]["held_s"]``), which never exceeds the time elapsed, while
the waits added up (``waited_s``) do when calls wait together."""

from __future__ import annotations

import time
from typing import Any

import pytest

from actors import Pacing, Policy, Tool
from actors.pacing.held import HeldClock


def test_held_clock_counts_overlapping_waits_once() -> None:
    clock = HeldClock()
    clock.enter(10.0)
    clock.enter(11.0)  # a second holder while the first waits
    clock.leave(12.0)
    assert clock.held_s(12.5) == pytest.approx(2.5)  # still held by the first
    clock.leave(13.0)
    assert clock.held_s(20.0) == pytest.approx(3.0)  # 10..13, once
    clock.enter(30.0)
    clock.leave(30.5)
    clock.leave(31.0)  # a leave with nobody in changes nothing
    assert clock.held_s(40.0) == pytest.approx(3.5)


@pytest.mark.waits
def test_pacing_report_held_time_never_exceeds_the_time_elapsed(make_system: Any) -> None:
    # two tools of one provider paced at 20/s, both with calls waiting at once: their
    # waits overlap, so added up they exceed the run's wall time; held back does not
    tools = [
        Tool(tool_id=name, fn=lambda input, ctx: {"ok": input}, provider="acme", pacing=Pacing(rps=20.0))
        for name in ("lookup", "enrich")
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.01))
    started = time.monotonic()
    proxy = system.proxy()
    futures = [proxy.execute(tool, {"n": n}) for n in range(30) for tool in ("lookup", "enrich")]
    for future in futures:
        assert future.get(timeout=30.0).execution == "live"
    view = system.stats()["pacing"]["acme/acme"]
    elapsed = time.monotonic() - started
    assert 1.0 < view["held_s"] <= elapsed, (view["held_s"], elapsed)
    assert view["waited_s"] > elapsed, "the waits did not overlap: the test shows nothing"
