"""The governor paces to the limits a provider announces (``Governor.announced``): a
per-second limit sets the rate from the first answer on (no slow start, no learner), is
grown back to after a cut and followed when it changes; a longer window or a token limit
goes to the quota state; a provider that says nothing is learnt as before. A plain state
machine on a fake clock (a LocalPacer stands for Redis when shared)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from actors.governor.decisions import Governor
from actors.governor.shared import shared_governor
from actors.pacing.announced import Announcement
from actors.pacing.bucket import AIMD_DECREASE, PACE_MARGIN, SLOW_START_RPS, pacing_report
from actors.pacing.pacers import LocalPacer
from actors.tool import Limit, Pacing, Policy

ORG = "acme"
KEY = (ORG, "p")


def _per_second(limit: float, name: str = "requests-1s") -> Announcement:
    return Announcement(limit=limit, window_s=1.0, remaining=limit - 1, reset_s=1.0, name=name)


def _gov(pacing: Pacing | None = None, pacer: Any = None) -> Governor:
    return Governor(
        Policy(max_concurrency=1000), {"p": pacing or Pacing(start_rps=SLOW_START_RPS)}, lambda: 0.0, pacer
    )


def _grants_in(gov: Governor, start: float, seconds: float, step: float = 0.001) -> int:
    """Requests granted over ``seconds`` from ``start``: one waiter always queued, each
    grant released (a success) at once."""
    granted, now = 0, start
    out = gov.acquire(ORG, "p", 1, object(), now)
    while True:
        n = sum(k for _, k in out.grants)
        if n:
            granted += n
            gov.release(ORG, "p", n, n, now)
            out = gov.acquire(ORG, "p", 1, object(), now)
            continue
        now += step
        if now >= start + seconds - 1e-9:
            return granted
        out = gov.wake(now)


def _rate(gov: Governor) -> float | None:
    return gov.buckets[KEY].rate


def test_announced_per_second_limit_sets_the_rate_from_the_first_answer() -> None:
    gov = _gov()
    gov.acquire(ORG, "p", 1, "first", now=0.0)
    assert _rate(gov) == SLOW_START_RPS  # the limit unknown: slow start, learnt
    out = gov.announced(ORG, "p", [_per_second(50)], sent_at=0.0, now=0.01)
    gov.release(ORG, "p", 1, 1, now=0.01)
    assert _rate(gov) == pytest.approx(50 * PACE_MARGIN)
    assert out.gates[KEY][0] == pytest.approx(50 * PACE_MARGIN)  # the send gate is retimed
    bucket = gov.buckets[KEY]
    assert bucket.learner is None and not bucket.slow_start
    assert KEY not in gov.pacing.roles
    granted = _grants_in(gov, 0.01, 10.0)
    assert 0.97 * 500 <= granted <= 50 * 10  # at the announced rate at once, never above it
    assert _rate(gov) == pytest.approx(50 * PACE_MARGIN)  # no probing above it
    report = pacing_report(gov.buckets, 10.0)["acme/p"]
    assert (report["learnt"], report["limit_rps"], report["learner_cuts"]) == ("announced", 50, None)


def test_a_provider_that_announces_nothing_is_learnt_as_before() -> None:
    gov = _gov()
    gov.announced(ORG, "p", [], sent_at=None, now=0.0)
    gov.announced(ORG, "p", [Announcement(remaining=5)], sent_at=None, now=0.0)  # no limit stated
    _grants_in(gov, 0.0, 2.0)
    bucket = gov.buckets[KEY]
    assert bucket.learner is not None and pacing_report(gov.buckets, 2.0)["acme/p"]["learnt"] == "slow_start"
    assert _rate(gov) > 2 * SLOW_START_RPS  # slow start went on


def test_announced_rate_changes_are_followed_up_and_down() -> None:
    gov = _gov()
    gov.announced(ORG, "p", [_per_second(50)], sent_at=None, now=0.0)
    assert _grants_in(gov, 0.0, 5.0) >= 0.97 * 250
    gov.announced(ORG, "p", [_per_second(200)], sent_at=None, now=5.0)
    assert _rate(gov) == pytest.approx(200 * PACE_MARGIN)
    assert 0.97 * 1000 <= _grants_in(gov, 5.0, 5.0) <= 1000
    gov.announced(ORG, "p", [_per_second(20)], sent_at=None, now=10.0)
    assert _rate(gov) == pytest.approx(20 * PACE_MARGIN)
    assert _grants_in(gov, 10.0, 5.0) <= 20 * 5 + 2
    assert pacing_report(gov.buckets, 15.0)["acme/p"]["limit_rps"] == 20


def test_announced_rate_cut_by_a_429_grows_back_to_it_never_past_it() -> None:
    gov = _gov()
    gov.announced(ORG, "p", [_per_second(100)], sent_at=None, now=0.0)
    _grants_in(gov, 0.0, 1.0)
    gov.backpressure(ORG, "p", "0.1", now=1.0, wall=0.0, sent_at=1.0)  # someone else spent our share
    assert _rate(gov) == pytest.approx(100 * PACE_MARGIN * AIMD_DECREASE)
    gov.announced(ORG, "p", [_per_second(100)], sent_at=1.0, now=1.0)  # the same limit: no reset
    assert _rate(gov) == pytest.approx(100 * PACE_MARGIN * AIMD_DECREASE)
    _grants_in(gov, 1.2, 20.0)
    assert _rate(gov) == pytest.approx(100 * PACE_MARGIN)  # back to the announced rate, capped there
    assert pacing_report(gov.buckets, 21.2)["acme/p"]["learnt"] == "announced"


def test_announced_rate_is_never_above_a_stated_one() -> None:
    gov = _gov(Pacing(rps=30))
    gov.announced(ORG, "p", [_per_second(50)], sent_at=None, now=0.0)
    assert _rate(gov) == pytest.approx(30 * PACE_MARGIN)


def test_announced_window_seen_longer_once_is_no_rate() -> None:
    """One answer in a per-minute window's last second looks per-second (its reset is
    under a second): the longest window seen for that limit decides."""
    gov = _gov()
    minute = Announcement(limit=600, window_s=60.0, remaining=300, reset_s=30.0)
    gov.announced(ORG, "p", [minute], sent_at=None, now=0.0)
    gov.announced(ORG, "p", [Announcement(limit=600, window_s=1.0, remaining=3, reset_s=0.5)], None, 29.5)
    assert _rate(gov) == SLOW_START_RPS and gov.buckets[KEY].learner is not None


def test_announced_garbage_is_ignored() -> None:
    gov = _gov()
    bad: list[Any] = [
        "50/s",
        None,
        Announcement(limit=0, window_s=1.0),
        Announcement(unit="concurrent-requests", limit=5, window_s=1.0),
        Announcement(limit=50),  # no window: not a rate
    ]
    gov.announced(ORG, "p", bad, sent_at=None, now=0.0)
    assert _rate(gov) == SLOW_START_RPS and gov.buckets[KEY].learner is not None


def test_announced_longer_windows_and_tokens_go_to_the_quota_state() -> None:
    """A per-minute count and a token count set what the quota state lets go: the first
    window's remaining units exactly (less those granted since the request was sent)."""
    now = [0.0]
    pacer = LocalPacer(clock=lambda: now[0])
    limits = [Limit(1000, "minute"), Limit(20000, "minute", unit="tokens")]
    gov = _gov(Pacing(start_rps=SLOW_START_RPS, limits=limits), pacer=pacer)
    assert pacer.give_back_units(ORG, "p", {}).room == (1000, 20000)
    minute = Announcement(limit=1000, window_s=60.0, remaining=990, reset_s=41.0, name="requests-60s")
    tokens = Announcement(unit="tokens", limit=20000, window_s=60.0, remaining=19000, reset_s=41.0)
    unstated = Announcement(unit="tokens", limit=20000, window_s=60.0)  # no count: nothing to set
    gov.announced(ORG, "p", [_per_second(50), minute, tokens, unstated], sent_at=1.5, now=2.0)
    assert pacer.give_back_units(ORG, "p", {}).room == (990, 19000)
    assert _rate(gov) == pytest.approx(50 * PACE_MARGIN)


def test_announced_without_a_quota_state_longer_windows_are_left() -> None:
    gov = _gov()  # a pacer without announce (before the quota state)
    gov.announced(ORG, "p", [Announcement(limit=1000, window_s=60.0, remaining=5, reset_s=9.0)], None, 0.0)
    assert _rate(gov) == SLOW_START_RPS


def test_announced_rate_through_a_shared_pacer_every_worker_follows() -> None:
    now = [100.0]
    pacer = LocalPacer(clock=lambda: now[0])
    pacings = {"p": Pacing(start_rps=SLOW_START_RPS)}
    one = shared_governor(Policy(), pacings, pacer, rng=lambda: 0.0)
    two = shared_governor(Policy(), pacings, pacer, rng=lambda: 0.0)
    for gov in (one, two):  # both learn, one holds the learner lease
        gov.acquire(ORG, "p", 1, object(), now[0])
        gov.release(ORG, "p", 1, 1, now[0])
    one.announced(ORG, "p", [_per_second(200)], sent_at=None, now=now[0])
    two.acquire(ORG, "p", 1, object(), now[0])  # two hears the new rate from the pacer
    assert two.pacing.seen[KEY][0] == pytest.approx(200 * PACE_MARGIN)
    granted = 0
    for _ in range(100):  # one second, both asking
        now[0] += 0.01
        for gov in (one, two):
            n = sum(k for _, k in gov.acquire(ORG, "p", 10, object(), now[0]).grants)
            if n:
                granted += n
                gov.release(ORG, "p", n, n, now[0])
    assert 0.95 * 200 <= granted <= 200 * PACE_MARGIN + 3  # one rate for both, not slow start
    assert math.isclose(pacer.state(ORG, "p").rate_rps or 0, 200 * PACE_MARGIN)


def test_announced_rate_is_set_again_when_the_pacer_went_past_it() -> None:
    """Another worker's learner (not told yet) published a rate above the announced one,
    or slow start: the next announcement sets it back."""
    now = [0.0]
    pacer = LocalPacer(clock=lambda: now[0])
    gov = _gov(pacer=pacer)
    gov.announced(ORG, "p", [_per_second(50)], sent_at=None, now=0.0)
    for published, slow in ((400.0, False), (30.0, True)):
        pacer.set_rate(ORG, "p", published, slow_start=slow)
        gov.acquire(ORG, "p", 1, object(), now[0])  # hears it
        assert _rate(gov) == published
        gov.announced(ORG, "p", [_per_second(50)], sent_at=None, now=now[0])
        assert _rate(gov) == pytest.approx(50 * PACE_MARGIN) and not gov.buckets[KEY].slow_start


def _inferred(limit: float, reset_s: float, remaining: float = 50) -> Announcement:
    """``X-RateLimit-*`` read: no window stated, one inferred from the reset."""
    window = 1.0 if reset_s <= 1 else 60.0
    return Announcement(
        limit=limit, window_s=window, remaining=remaining, reset_s=reset_s, window_stated=False
    )


def test_announced_inferred_second_window_is_a_rate_only_once_confirmed() -> None:
    """A reset under a second may be a per-minute window's last second: the window it
    implies is a rate only when an answer after that window ended implies it again."""
    gov = _gov()
    gov.announced(ORG, "p", [_inferred(100, reset_s=0.8)], sent_at=None, now=0.0)
    gov.announced(ORG, "p", [_inferred(100, reset_s=0.3, remaining=40)], sent_at=None, now=0.5)
    assert _rate(gov) == SLOW_START_RPS and gov.buckets[KEY].learner is not None  # learnt meanwhile
    gov.announced(ORG, "p", [_inferred(100, reset_s=0.8, remaining=99)], sent_at=None, now=1.2)
    assert _rate(gov) == pytest.approx(100 * PACE_MARGIN) and gov.buckets[KEY].announced


def test_announced_per_minute_window_answered_in_its_last_second_is_no_rate() -> None:
    """The breaker's case: 100/min, first answered with ``X-RateLimit-Reset: 1``, then 59."""
    now = [0.0]
    pacer = LocalPacer(clock=lambda: now[0])
    gov = _gov(Pacing(start_rps=SLOW_START_RPS, limits=[Limit(100, "minute")]), pacer=pacer)
    gov.announced(ORG, "p", [_inferred(100, reset_s=1.0, remaining=99)], sent_at=None, now=0.0)
    assert _rate(gov) == SLOW_START_RPS  # not 98/s on one sighting
    now[0] = 1.1
    gov.announced(ORG, "p", [_inferred(100, reset_s=59.0, remaining=98)], sent_at=1.05, now=1.1)
    assert _rate(gov) == SLOW_START_RPS and not gov.buckets[KEY].announced
    assert pacer.give_back_units(ORG, "p", {}).room == (98,)  # the quota state has its count


@pytest.mark.parametrize(
    ("pacing", "rate", "slow_start"),
    [(Pacing(start_rps=SLOW_START_RPS), SLOW_START_RPS, True), (Pacing(rps=30), 30 * PACE_MARGIN, False)],
)
def test_announced_rate_is_withdrawn_when_its_limit_shows_a_longer_window(
    pacing: Pacing, rate: float, slow_start: bool
) -> None:
    """A rate taken from a limit later seen with a longer window is withdrawn: the provider
    is paced as its Pacing starts again (learnt afresh, or stated)."""
    gov = _gov(pacing)
    gov.announced(ORG, "p", [_per_second(20, name="")], sent_at=None, now=0.0)
    assert _rate(gov) == pytest.approx(20 * PACE_MARGIN)
    out = gov.announced(ORG, "p", [_inferred(20, reset_s=45.0)], sent_at=None, now=2.0)
    bucket = gov.buckets[KEY]
    assert _rate(gov) == pytest.approx(rate) and bucket.slow_start == slow_start
    assert out.gates[KEY][0] == pytest.approx(rate)  # the send gate is retimed
    assert not bucket.announced and KEY not in gov.pacing.caps
    assert (bucket.learner is not None) == slow_start
    gov.announced(ORG, "p", [_per_second(20, name="")], sent_at=None, now=3.0)  # seen longer: never again
    assert _rate(gov) == pytest.approx(rate)


def test_announced_one_rate_per_answer_the_strictest() -> None:
    """Several per-second limits in one answer set one rate, once: the strictest."""
    now = [0.0]
    pacer = LocalPacer(clock=lambda: now[0])
    gov = _gov(pacer=pacer)
    set_to: list[float | None] = []
    set_rate = pacer.set_rate

    def counted(org_id: str, provider: str, rate_rps: float | None, **kw: Any) -> Any:
        set_to.append(rate_rps)
        return set_rate(org_id, provider, rate_rps, **kw)

    pacer.set_rate = counted  # type: ignore[method-assign]
    for _ in range(2):
        gov.announced(ORG, "p", [_per_second(5, name="a"), _per_second(100, name="b")], sent_at=None, now=0.0)
        assert _rate(gov) == pytest.approx(5 * PACE_MARGIN)
    assert set_to == [pytest.approx(5 * PACE_MARGIN)]


def test_a_learnt_rate_slower_than_the_calls_timeout_is_waited_for() -> None:
    """A rate (here a learnt one) is waited for, however slow: a call's timeout runs from
    its send, not from its turn; never refused."""
    gov = _gov(Pacing(start_rps=0.1))
    gov.acquire(ORG, "p", 1, "first", now=0.0, patience_s=3.0)
    out = gov.acquire(ORG, "p", 1, "second", now=0.1, patience_s=3.0)
    assert not out.refusals and out.wake_at is not None
