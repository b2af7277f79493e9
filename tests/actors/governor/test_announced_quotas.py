"""A quota the provider announces counts even when ``Pacing.limits`` does not state it: the
governor adds it to the quota state (stated limits first, then the announced ones sorted
by unit and window, so workers agree on the list), then its remaining count and reset
hold calls as a stated quota's would. A plain state machine on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from actors.errors import QuotaExhaustedError
from actors.governor.decisions import Governor
from actors.pacing.announced import Announcement
from actors.pacing.pacers import LocalPacer
from actors.tool import Limit, Pacing, Policy

ORG = "acme"


def _gov(pacing: Pacing, now: list[float]) -> tuple[Governor, LocalPacer]:
    pacer = LocalPacer(clock=lambda: now[0])
    return Governor(Policy(max_concurrency=1000), {"p": pacing}, lambda: now[0], pacer), pacer


def _daily(limit: float, remaining: float, reset_s: float) -> Announcement:
    return Announcement(limit=limit, window_s=86400.0, remaining=remaining, reset_s=reset_s, name="daily")


def _granted(out: Any, reply: str) -> int:
    return sum(n for r, n in out.grants if r == reply)


def test_an_announced_quota_never_stated_holds_calls_until_its_reset() -> None:
    now = [0.0]
    gov, pacer = _gov(Pacing(rps=100), now)  # no quota stated
    assert gov.pacing.has_quotas("p") is False
    first = gov.acquire(ORG, "p", 1, "first", now=0.0)
    assert _granted(first, "first") == 1
    # its answer: RateLimit-Policy: "daily";q=1000;w=86400, RateLimit: "daily";r=0;t=3600
    gov.release(ORG, "p", 1, 1, now=0.1, announced=[(0.0, [_daily(1000, 0, 3600.0)])])
    assert pacer.unit_limits["p"] == (Limit(1000.0, "day"),)
    now[0] = 0.2
    waiting = gov.acquire(ORG, "p", 1, "patient", now=0.2)  # no timeout: waits for the reset
    assert _granted(waiting, "patient") == 0 and not waiting.refusals
    assert waiting.wake_at is not None and waiting.wake_at >= 1.0  # (a shared pacer's: polled)
    now[0] = 100.0
    out = gov.wake(100.0)
    assert not out.grants
    now[0] = 3600.5  # the reset: the day's quota has room again (counted as stated now)
    out = gov.wake(3600.5)
    assert _granted(out, "patient") == 1


def test_a_call_past_its_patience_is_refused_naming_the_announced_quota() -> None:
    now = [0.0]
    gov, _ = _gov(Pacing(rps=100), now)
    gov.acquire(ORG, "p", 1, "first", now=0.0)
    gov.release(ORG, "p", 1, 1, now=0.1, announced=[(0.0, [_daily(1000, 0, 3600.0)])])
    out = gov.acquire(ORG, "p", 1, "hasty", now=0.2, patience_s=30.0)
    assert not out.grants
    [(reply, error)] = out.refusals
    assert reply == "hasty" and isinstance(error, QuotaExhaustedError)
    assert error.limit == "1000 requests/day" and error.reset_s == pytest.approx(3599.9, abs=0.5)
    assert "1000 requests/day" in str(error)


def test_announced_quotas_keep_a_canonical_order_and_a_new_amount_replaces_one() -> None:
    stated = Limit(5000, "hour")
    tokens = Announcement(unit="tokens", limit=20000, window_s=60.0, remaining=19000, reset_s=30.0)
    minute = Announcement(limit=200, window_s=60.0, remaining=150, reset_s=30.0)
    daily = _daily(1000, 900, 3600.0)
    again = Announcement(limit=4000, window_s=3600.0, remaining=10, reset_s=30.0)  # the stated one's
    lists = []
    for order in ([tokens, daily, minute, again], [again, minute, daily, tokens]):
        now = [0.0]
        gov, pacer = _gov(Pacing(rps=100, limits=[stated]), now)
        for a in order:
            gov.announced(ORG, "p", [a], sent_at=0.0, now=0.0)
        lists.append(pacer.unit_limits["p"])
    expected = (stated, Limit(200.0, "minute"), Limit(1000.0, "day"), Limit(20000.0, "minute", "tokens"))
    assert lists == [expected, expected]  # the same list whichever came first (the shared state's signature)
    gov.announced(ORG, "p", [_daily(2000, 1900, 3000.0)], sent_at=0.0, now=1.0)  # a new amount: replaced
    assert pacer.unit_limits["p"] == (stated, Limit(200.0, "minute"), Limit(2000.0, "day"), expected[3])


def test_a_limit_added_keeps_the_counts_of_the_others() -> None:
    """Locally, the quota state follows its limits as they are added (renumbered by unit and
    window, not started afresh): what a stated quota and an announced one counted stays."""
    now = [0.0]
    gov, pacer = _gov(Pacing(rps=100, limits=[Limit(10, "hour")]), now)
    tokens = Announcement(unit="tokens", limit=500, window_s=60.0, remaining=400, reset_s=30.0)
    gov.announced(ORG, "p", [tokens], sent_at=0.0, now=0.0)
    assert pacer.take_units(ORG, "p", [{"tokens": 50.0}] * 3).granted == 3
    assert pacer.give_back_units(ORG, "p", {}).room == (7.0, 250.0)
    gov.announced(ORG, "p", [_daily(1000, 900, 3600.0)], sent_at=0.0, now=0.0)  # sorts before tokens
    assert pacer.unit_limits["p"][1:] == (Limit(1000.0, "day"), Limit(500.0, "minute", "tokens"))
    assert pacer.give_back_units(ORG, "p", {}).room == (7.0, 900.0, 250.0)


def test_announced_limits_stating_no_usable_amount_or_window_are_ignored() -> None:
    now = [0.0]
    gov, pacer = _gov(Pacing(rps=100), now)
    for bad in (
        Announcement(window_s=60.0, remaining=0, reset_s=30.0),  # no amount
        Announcement(limit=100, remaining=0, reset_s=30.0),  # no window
        Announcement(limit=0.0, window_s=60.0, remaining=0, reset_s=30.0),
        Announcement(limit=float("nan"), window_s=60.0, remaining=0, reset_s=30.0),
        Announcement(limit=100, window_s=float("inf"), remaining=0, reset_s=30.0),
    ):
        gov.announced(ORG, "p", [bad], sent_at=0.0, now=0.0)
    assert "p" not in pacer.unit_limits
    assert _granted(gov.acquire(ORG, "p", 1, "r", now=0.0, patience_s=1.0), "r") == 1
    gov.announced(ORG, "p", [_daily(1000, 0, 3600.0)], sent_at=0.0, now=0.0)  # a sane one is taken
    assert pacer.unit_limits["p"] == (Limit(1000.0, "day"),)
