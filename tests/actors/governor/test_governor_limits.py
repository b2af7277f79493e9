"""State-machine tests of the governor under several limits and limits in units: quota
units taken before the rate's tokens, given back when the rate does not grant, waits
and refusals past a call's patience, corrections on release.

The plain :class:`Governor` (its own LocalPacer, timed by the ``now`` passed in).
"""

from __future__ import annotations

from actors.errors import QuotaExhaustedError
from actors.governor.decisions import Decisions, Governor
from actors.pacing.announced import Announcement
from actors.tool import Limit, Pacing, Policy

ORG = "acme"
TOKENS = Pacing(limits=[Limit(50, "second", burst=10), Limit(10, "minute"), Limit(1000, "minute", "tokens")])


def _granted(decisions: Decisions) -> dict[object, int]:
    return dict(decisions.grants)


def _gov(**pacings: Pacing) -> Governor:
    return Governor(Policy(), dict(pacings), rng=lambda: 0.0)


def _room(gov: Governor, now: float) -> tuple[float, ...]:
    gov.now = now
    return gov.pacing.pacer.give_back_units(ORG, "p", {}).room


def test_limits_grant_as_many_requests_as_every_limit_has_room_for() -> None:
    gov = _gov(p=TOKENS)
    a = object()
    out = gov.acquire(ORG, "p", 5, a, now=0.0, units=[{"tokens": 300}] * 5, patience_s=120.0)
    assert _granted(out) == {a: 3}  # a 4th would pass 1,000 tokens
    assert _room(gov, 0.0) == (7.0, 100.0)


def test_limits_units_of_requests_the_rate_does_not_grant_go_back() -> None:
    gov = _gov(p=Pacing(rps=1.0, burst=2.0, limits=[Limit(1000, "minute", "tokens")]))
    a = object()
    out = gov.acquire(ORG, "p", 5, a, now=0.0, units=[{"tokens": 100}] * 5)
    assert _granted(out) == {a: 2}  # the rate's burst
    assert _room(gov, 0.0) == (800.0,)  # the 3 others' tokens came back
    b = object()
    out = gov.acquire(ORG, "p", 1, b, now=0.1, units=[{"tokens": 100}])
    assert _granted(out) == {} and _room(gov, 0.1) == (800.0,)  # no rate token: none taken


def test_limits_spent_quota_waits_then_grants_with_its_wait() -> None:
    gov = _gov(p=Pacing(limits=[Limit(2, "minute")]))
    a, b = object(), object()
    gov.acquire(ORG, "p", 2, a, now=0.0, patience_s=300.0)
    out = gov.acquire(ORG, "p", 1, b, now=1.0, patience_s=300.0)
    assert _granted(out) == {} and out.wake_at is not None and 61.0 < out.wake_at <= 63.0
    gov.release(ORG, "p", count=2, successes=2, now=2.0)
    out = gov.wake(out.wake_at)
    grant = _granted(out)[b]
    assert grant == 1 and 60.0 < getattr(grant, "quota_s", 0.0) <= 62.0  # counted as a quota wait


def test_limits_wait_past_the_patience_refuses_naming_limit_and_reset() -> None:
    gov = _gov(p=Pacing(limits=[Limit(2, "minute")]))
    a, b = object(), object()
    gov.acquire(ORG, "p", 2, a, now=0.0, patience_s=5.0)
    out = gov.acquire(ORG, "p", 1, b, now=1.0, patience_s=5.0)
    error = dict(out.refusals)[b]
    assert isinstance(error, QuotaExhaustedError)
    assert error.limit == "2 requests/minute" and 60.0 < error.reset_s <= 62.0
    assert "2 requests/minute" in str(error) and "timeout (5 s)" in str(error)
    assert not gov.waiters[(ORG, "p", False)]


def test_limits_request_larger_than_a_quota_is_refused_at_once() -> None:
    gov = _gov(p=TOKENS)
    a = object()
    out = gov.acquire(ORG, "p", 1, a, now=0.0, units=[{"tokens": 5000}])
    assert isinstance(dict(out.refusals)[a], QuotaExhaustedError)


def test_limits_release_gives_back_unsent_and_corrects_by_usage() -> None:
    gov = _gov(p=TOKENS)
    gov.acquire(ORG, "p", 3, object(), now=0.0, units=[{"tokens": 300}] * 3)
    usage = ((0.0, {"tokens": -200.0}), (0.0, {"tokens": 50.0}))
    gov.release(
        ORG, "p", count=3, successes=2, now=1.0, refunds=1, unsent_units={"requests": 1.0, "tokens": 300.0},
        usage=usage,
    )  # fmt: skip
    assert _room(gov, 1.0) == (8.0, 1000 - 600 + 200 - 50)


def test_limits_announced_quota_count_sets_the_room() -> None:
    gov = _gov(p=TOKENS)
    gov.acquire(ORG, "p", 1, object(), now=0.0, units=[{"tokens": 100}])
    said = Announcement(unit="tokens", limit=1000, window_s=60.0, remaining=150.0, reset_s=20.0)
    gov.release(ORG, "p", count=1, successes=1, now=0.5, announced=((0.0, [said]),))
    assert _room(gov, 0.5)[1] == 50.0  # 150 left as the provider counted, less the 100 since
