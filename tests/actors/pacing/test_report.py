"""Pacing made visible: :func:`actors.pacing.bucket.pacing_report` over the governor's state
(plain state machine, time passed in)."""

from __future__ import annotations

import pytest

from actors.governor.decisions import Governor
from actors.pacing.bucket import PACE_MARGIN, pacing_report
from actors.tool import Pacing, Policy

ORG = "org"


def _report(gov: Governor, now: float, waits: dict[tuple[str, str], float] | None = None) -> dict:
    return pacing_report(gov.buckets, now, waits)


def test_pacing_report_says_how_each_rate_was_set() -> None:
    gov = Governor(
        Policy(), {"stated": Pacing(rps=10.0), "unknown": Pacing(start_rps=10.0), "local": Pacing()}
    )
    for provider in ("stated", "unknown", "local"):
        gov.acquire(ORG, provider, 1, provider, now=0.0)
    report = _report(gov, 0.0)
    assert report["org/stated"]["learnt"] == "stated"
    assert report["org/stated"]["rate_rps"] == pytest.approx(10.0 * PACE_MARGIN)
    assert report["org/stated"]["limit_rps"] == 10.0
    assert report["org/unknown"]["learnt"] == "slow_start"
    assert report["org/unknown"]["limit_rps"] is None
    assert report["org/local"]["learnt"] == "unpaced" and report["org/local"]["rate_rps"] is None
    assert all(r["circuit"] == "closed" and r["rate_limited"] == 0 for r in report.values())


def test_pacing_report_shows_pauses_with_their_retry_after_and_the_learnt_limit() -> None:
    gov = Governor(Policy(), {"p": Pacing(start_rps=40.0)}, rng=lambda: 0.0)
    gov.acquire(ORG, "p", 1, "a", now=0.0)
    for i in range(40):
        gov.release(ORG, "p", 1 if i == 0 else 0, successes=1, now=0.5 + i / 40.0)
    gov.backpressure(ORG, "p", "1", now=1.5, wall=1_000.0, sent_at=1.49)
    gov.backpressure(ORG, "p", "1", now=1.51, wall=1_000.0, sent_at=1.495)  # same event
    report = _report(gov, 2.0)["org/p"]
    assert report["learnt"] == "plateau"
    assert report["limit_rps"] == pytest.approx(40.0, rel=0.1)
    assert report["rate_limited"] == 2 and report["cuts"] == 1
    assert [p["retry_after"] for p in report["pauses"]] == ["1", "1"]
    assert report["pauses"][0]["pause_s"] == pytest.approx(1.0)
    assert report["pauses"][0]["ago_s"] == pytest.approx(0.5)
    assert report["paused_for_s"] == pytest.approx(0.51)


def test_pacing_report_counts_time_waited_for_pacing_and_the_circuit() -> None:
    gov = Governor(Policy(circuit_failures=1), {"p": Pacing(rps=2.0, burst=1)})
    gov.acquire(ORG, "p", 1, "first", now=0.0)
    gov.acquire(ORG, "p", 1, "second", now=0.0)  # waits for the next token
    gov.wake(0.6)
    report = _report(gov, 0.6, {(ORG, "p"): 0.25})["org/p"]
    assert report["waited_s"] == pytest.approx(0.6 + 0.25)
    gov.release(ORG, "p", 2, successes=0, now=1.0, unavailable=2, answered=0)
    report = _report(gov, 1.0)["org/p"]
    assert report["circuit"] == "open" and report["circuit_opened"] == 1


def test_pacing_report_stated_rate_cut_by_a_429_is_aimd() -> None:
    gov = Governor(Policy(), {"p": Pacing(rps=10.0)}, rng=lambda: 0.0)
    gov.acquire(ORG, "p", 1, "a", now=0.0)
    gov.backpressure(ORG, "p", None, now=1.0, wall=1_000.0)
    report = _report(gov, 1.0)["org/p"]
    assert report["learnt"] == "aimd" and report["cuts"] == 1
    assert report["pauses"][0]["retry_after"] is None
