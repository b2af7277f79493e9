"""The quota state's rules (:class:`actors.pacing.quotas.QuotaState`), on a fake clock."""

from __future__ import annotations

import math

import pytest

from actors.pacing.quotas import (
    SUB_BUCKETS,
    Announce,
    Correct,
    GiveBack,
    QuotaState,
    TakeUnits,
    UnitsTaken,
    limit_key,
)
from actors.tool import Limit, Pacing, Tool

PER_MINUTE = Limit(1000, "minute")
TOKENS = Limit(20000, "minute", "tokens")


def take(state: QuotaState, now: float, limits: list[Limit], *requests: dict[str, float]) -> UnitsTaken:
    reply = state.handle(TakeUnits(requests=tuple(requests)), now, limits)
    assert isinstance(reply, UnitsTaken)
    return reply


def test_limit_rejects_bad_values_with_a_clear_error() -> None:
    for bad, words in (
        (lambda: Limit(0, "minute"), "Limit.amount"),
        (lambda: Limit(5, "week"), "Limit.per"),
        (lambda: Limit(5, -1.0), "Limit.per"),
        (lambda: Limit(5, "minute", ""), "Limit.unit"),
        (lambda: Limit(5, "minute", burst=0), "Limit.burst"),
        (lambda: Pacing(limits=["50/s"]), "Pacing.limits"),
    ):
        with pytest.raises(ValueError, match=words):
            bad()


def test_limit_requests_per_second_is_the_request_rate() -> None:
    pacing = Pacing(limits=[Limit(50, "second"), PER_MINUTE])
    assert pacing.rps == 50 and pacing.unit_limits == (PER_MINUTE,)
    assert Pacing(rps=40, limits=[Limit(50, "second")]).unit_limits == (Limit(50, "second"),)


def test_quota_never_holds_more_than_its_amount_in_any_window() -> None:
    state, limits = QuotaState(), [PER_MINUTE]
    granted: list[float] = []
    now = 1000.0
    while now < 1300.0:
        got = take(state, now, limits, *([{}] * 7))
        granted += [now] * got.granted
        now += 0.05
    for t in granted:  # every window of 60 s, anchored at each grant
        assert sum(1 for g in granted if t <= g < t + 60.0) <= 1000
    # conservative by at most two sub-buckets: 300 s hold at least 5 windows' worth less one
    assert len(granted) >= 1000 * 300 / (60.0 * (1 + 2 / SUB_BUCKETS)) - 1000


def test_quota_spent_waits_for_its_oldest_units_to_leave() -> None:
    state, limits = QuotaState(), [PER_MINUTE]
    assert take(state, 600.0, limits, *([{}] * 1000)).granted == 1000
    refused = take(state, 630.0, limits, {})
    assert refused.granted == 0 and refused.limit == 0
    # the sub-bucket of 600 s leaves the window (and its slack sub-bucket) at 662 s
    assert refused.wait_s == pytest.approx((SUB_BUCKETS + 2) * 1.0 - 30.0)
    assert take(state, 630.0 + refused.wait_s, limits, {}).granted == 1


def test_take_is_all_limits_or_none_and_partial_by_requests() -> None:
    state, limits = QuotaState(), [PER_MINUTE, TOKENS]
    got = take(state, 0.0, limits, *([{"tokens": 1500}] * 20))
    assert got.granted == 13 and got.limit == 1  # 13 * 1500 = 19,500 tokens; requests left over
    assert got.room == (987.0, 500.0)
    assert take(state, 1.0, limits, {"tokens": 501}).granted == 0
    assert take(state, 1.0, limits, {"tokens": 500}).room == (986.0, 0.0)


def test_request_larger_than_a_quota_never_fits() -> None:
    got = take(QuotaState(), 0.0, [TOKENS], {"tokens": 20001})
    assert got.granted == 0 and math.isinf(got.wait_s)


def test_give_back_and_correction_move_the_count() -> None:
    state, limits = QuotaState(), [PER_MINUTE, TOKENS]
    take(state, 0.0, limits, *([{"tokens": 1000}] * 10))
    state.handle(GiveBack(units={"requests": 2, "tokens": 2000}), 0.5, limits)
    read = state.handle(Correct(delta={"tokens": -3000}, age_s=1.0), 1.0, limits)
    assert read.room == (992.0, 20000 - 8000 + 3000)
    read = state.handle(Correct(delta={"tokens": 500}), 2.0, limits)
    assert read.room == (992.0, 14500.0)


def test_correction_down_comes_off_the_sub_bucket_it_was_granted_in() -> None:
    state, limits = QuotaState(), [TOKENS]
    take(state, 0.0, limits, {"tokens": 5000})
    take(state, 30.0, limits, {"tokens": 5000})
    state.handle(Correct(delta={"tokens": -5000}, age_s=30.0), 30.0, limits)  # the one granted at 0 s
    assert state.counts[limit_key(TOKENS)] == {30: 5000.0}


def test_rate_in_units_paces_by_gcra() -> None:
    state, limits = QuotaState(), [Limit(1000, "second", "tokens", burst=1000)]
    assert take(state, 0.0, limits, {"tokens": 1000}).granted == 1
    got = take(state, 0.0, limits, {"tokens": 500})
    assert got.granted == 0 and got.wait_s == pytest.approx(0.5)
    assert take(state, 0.5, limits, {"tokens": 500}).granted == 1


def test_announcement_sets_remaining_until_its_reset() -> None:
    state, limits = QuotaState(), [PER_MINUTE]
    take(state, 0.0, limits, *([{}] * 10))
    # the provider counted 10 requests of others too: 5 left, reset in 20 s; the
    # announcing request was sent 1 s ago, and 2 were granted since (same sub-bucket: all 10)
    state.handle(Announce(unit="requests", remaining=15, reset_s=20.0, sent_ago_s=0.0), 0.5, limits)
    got = take(state, 0.6, limits, *([{}] * 10))
    assert got.granted == 5 and got.wait_s == pytest.approx(19.9) and got.reset_s == pytest.approx(19.9)
    assert take(state, 20.5, limits, {}).granted == 1  # its reset passed: the sliding window again


def test_announcement_of_an_unknown_unit_is_ignored() -> None:
    state = QuotaState()
    read = state.handle(Announce(unit="credits", remaining=0, reset_s=9.0), 0.0, [PER_MINUTE])
    assert read.room == (1000.0,)


def test_callers_stating_different_limits_share_the_limits_in_common() -> None:
    """A rolling deploy: one caller states 5/minute, another 5.0/minute and 1000/day, on
    one state; the minute's count is one (never reset by the other list), 5 in all."""
    state = QuotaState()
    old, new = [Limit(5, "minute")], [Limit(5.0, "minute"), Limit(1000, "day")]
    granted = 0
    for i in range(12):
        granted += take(state, float(i), old if i % 2 else new, {}).granted
    assert granted == 5
    assert take(state, 20.0, [Limit(1000, "day")], {}).granted == 1  # the day's count: its own
    assert state.handle(GiveBack(units={}), 20.0, new).room == (
        0.0,
        996.0,
    )  # 3 under the new list, 1 under the day alone


def test_the_same_limit_stated_twice_counts_once() -> None:
    state = QuotaState()
    got = take(state, 0.0, [Limit(5, "minute"), Limit(5.0, "minute")], *([{}] * 5))
    assert got.granted == 5 and got.room == (0.0, 0.0)


def test_announcement_applies_only_to_a_quota_of_about_its_window() -> None:
    """A minute's announcement is not a stated day's count (windows more than 10 % apart)."""
    state, limits = QuotaState(), [Limit(20, "day")]
    read = state.handle(Announce(unit="requests", remaining=900, reset_s=30.0, window_s=60.0), 0.0, limits)
    assert read.room == (20.0,)
    assert take(state, 1.0, limits, *([{}] * 30)).granted == 20
    read = state.handle(
        Announce(unit="requests", remaining=3, reset_s=30.0, window_s=57.0), 0.0, [PER_MINUTE]
    )
    assert read.room == (3.0,)  # within 10 %: the provider's count of that minute


def test_announcement_only_lowers_a_stated_quota() -> None:
    """The provider's 1000/minute says 990 left: the user's own 5/minute still holds."""
    state, limits = QuotaState(), [Limit(5, "minute")]
    take(state, 0.0, limits, {}, {})
    read = state.handle(Announce(unit="requests", remaining=990, reset_s=50.0, window_s=60.0), 0.5, limits)
    assert read.room == (3.0,)
    got = take(state, 1.0, limits, *([{}] * 10))
    assert got.granted == 3 and got.wait_s > 50
    read = state.handle(Announce(unit="requests", remaining=0, reset_s=20.0, window_s=60.0), 2.0, limits)
    assert read.room == (0.0,)


def test_a_limit_in_a_misspelt_requests_unit_is_refused_at_start() -> None:
    from actors.pacing.providers import provider_pacings

    tool = Tool(
        tool_id="t", fn=lambda i, c: i, provider="p", pacing=Pacing(limits=[Limit(2, "minute", "request")])
    )
    with pytest.raises(ValueError, match="did you mean 'requests'"):
        provider_pacings([tool])


def test_a_limit_in_a_unit_no_tool_states_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from actors.pacing.providers import provider_pacings

    pacing = Pacing(limits=[Limit(2, "minute", "tokens")])
    bare = Tool(tool_id="bare", fn=lambda i, c: i, provider="p", pacing=pacing)
    with caplog.at_level("WARNING", logger="tooldispatch"):
        provider_pacings([bare])
    assert "'2 tokens/minute' counts 'tokens', which none of its tools (bare) states" in caplog.text
    caplog.clear()
    stating = Tool(tool_id="s", fn=lambda i, c: i, provider="p", pacing=pacing, units=lambda i: {"tokens": 1})
    with caplog.at_level("WARNING", logger="tooldispatch"):
        provider_pacings([bare, stating])
    assert "counts 'tokens'" not in caplog.text
