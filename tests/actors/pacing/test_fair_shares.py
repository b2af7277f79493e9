"""Fair shares of one bucket between fairness keys (``Take.key``): the rules of
:class:`~actors.pacing.pacer_state.BucketState`, driven through a :class:`LocalPacer` on a
fake clock.

Each contender acts as a governor with work waiting does: it asks for up to ``want``
tokens (``partial``), asks again at once after a grant, and after a refusal at the
``wait_s`` it was told. The Lua script is held to the same rules by
``shared/test_pacer_rules_conformance.py``.
"""

from __future__ import annotations

import heapq
import math

import attrs
import pytest

from actors.pacing import LocalPacer, ProviderLimits

RATE = 50.0


@attrs.define
class Contender:
    """A fairness key taking from the bucket between ``start`` and ``stop`` (seconds)."""

    weight: float = 1.0
    start: float = 0.0
    stop: float = math.inf
    demand_rps: float | None = None
    """Calls per second it has (None: always more than it is granted)."""
    grants: list[float] = attrs.field(factory=list)
    """When each token was granted."""

    def granted(self, since: float, until: float) -> int:
        return sum(1 for t in self.grants if since <= t < until)


def run(contenders: dict[str, Contender], seconds: float, burst: float | None = None) -> LocalPacer:
    """Drive ``contenders`` for ``seconds`` of the fake clock; the pacer they shared."""
    now = [0.0]
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=RATE, burst=burst)}, clock=lambda: now[0])
    due = [(c.start, name) for name, c in contenders.items()]
    heapq.heapify(due)
    backlog = dict.fromkeys(contenders, 0.0)
    last = {name: c.start for name, c in contenders.items()}
    while due:
        t, name = heapq.heappop(due)
        c = contenders[name]
        if t >= min(c.stop, seconds):
            continue
        now[0] = t
        want = 20
        if c.demand_rps is not None:  # work arrives at demand_rps
            backlog[name] += (t - last[name]) * c.demand_rps
            last[name] = t
            want = int(backlog[name] + 1e-9)
            if want < 1:
                heapq.heappush(due, (t + max(1e-4, (1 - backlog[name]) / c.demand_rps), name))
                continue
        grant = pacer.take("o", "p", want, partial=True, key=name, weight=c.weight)
        c.grants += [t] * grant.granted
        if c.demand_rps is not None:
            backlog[name] -= grant.granted
        heapq.heappush(due, (t + (1e-9 if grant.granted else grant.wait_s), name))
    return pacer


def test_fair_shares_two_keys_wanting_more_get_half_each() -> None:
    a, b = Contender(), Contender()
    run({"a": a, "b": b}, 10.0)
    assert a.granted(0, 10) == pytest.approx(250, abs=2)
    assert b.granted(0, 10) == pytest.approx(250, abs=2)


def test_fair_shares_weights_3_to_1_give_75_and_25_percent() -> None:
    a, b = Contender(weight=3.0), Contender(weight=1.0)
    run({"a": a, "b": b}, 10.0)
    assert a.granted(0, 10) == pytest.approx(375, abs=2)
    assert b.granted(0, 10) == pytest.approx(125, abs=2)


def test_fair_shares_three_keys_by_weight_within_the_rate() -> None:
    a, b, c = Contender(weight=1.0), Contender(weight=1.0), Contender(weight=2.0)
    run({"a": a, "b": b, "c": c}, 10.0, burst=5.0)
    assert (a.granted(0, 10), b.granted(0, 10)) == (pytest.approx(125, abs=6), pytest.approx(125, abs=6))
    assert c.granted(0, 10) == pytest.approx(250, abs=6)
    assert a.granted(0, 10) + b.granted(0, 10) + c.granted(0, 10) <= RATE * 10 + 5


def test_fair_shares_one_key_alone_gets_the_full_rate() -> None:
    a = Contender()
    run({"a": a}, 10.0)
    assert a.granted(0, 10) == pytest.approx(500, abs=2)


def test_fair_shares_a_late_key_gets_its_share_at_once() -> None:
    """The issue's case: a small run started beside one saturating the rate."""
    big, small = Contender(), Contender(start=3.0, stop=13.0)
    run({"big": big, "small": small}, 13.0)
    assert big.granted(0, 3) == pytest.approx(150, abs=2)
    assert small.granted(3, 4) == pytest.approx(25, abs=2)
    assert big.granted(3, 4) == pytest.approx(25, abs=2)


def test_fair_shares_an_idle_keys_share_is_lent_within_the_window() -> None:
    a, b = Contender(), Contender(stop=5.0)
    pacer = run({"a": a, "b": b}, 10.0)
    window = pacer.settings.fair_window_s
    assert a.granted(0, 5) == pytest.approx(125, abs=2)
    assert a.granted(5 + window, 10) == pytest.approx(RATE * (5 - window), abs=2)
    state = pacer.bucket_state("o", "p")
    assert state is not None and set(state.shares) == {"a"}  # b was forgotten


def test_fair_shares_a_key_wanting_less_than_its_share_leaves_the_rest() -> None:
    """Weighted max-min: b needs 10/s of its 25/s; a gets the other 40/s, not 25/s."""
    a, b = Contender(), Contender(demand_rps=10.0)
    run({"a": a, "b": b}, 10.0)
    assert b.granted(0, 10) == pytest.approx(100, abs=2)
    assert a.granted(0, 10) == pytest.approx(400, abs=3)


def test_fair_shares_a_refused_take_waits_for_the_later_of_the_bucket_and_its_share() -> None:
    now = [100.0]
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=10.0, burst=1.0)}, clock=lambda: now[0])
    assert pacer.take("o", "p", 2, partial=True, key="b").granted == 1  # b wants more
    now[0] += 0.1
    assert pacer.take("o", "p", 1, key="a").granted == 1  # a's share is 1/2: 5/s
    now[0] += 0.1  # the bucket has a token again; a's share has none for 0.1 s more
    refused = pacer.take("o", "p", 1, key="a")
    assert refused.granted == 0 and refused.wait_s == pytest.approx(0.1)
    now[0] += 0.1
    assert pacer.take("o", "p", 1, key="a").granted == 1


def test_fair_shares_idle_keys_are_forgotten() -> None:
    now = [0.0]
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=1000.0)}, clock=lambda: now[0])
    for i in range(500):
        now[0] += 0.001
        pacer.take("o", "p", 1, key=f"customer-{i}")
    now[0] += pacer.settings.fair_window_s + 0.01
    pacer.take("o", "p", 1, key="last")
    state = pacer.bucket_state("o", "p")
    assert state is not None and set(state.shares) == {"last"}


def test_fair_shares_takes_without_a_key_keep_to_the_rate_alone() -> None:
    now = [0.0]
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=10.0, burst=1.0)}, clock=lambda: now[0])
    assert pacer.take("o", "p", 2, partial=True, key="b").granted == 1  # b wants more
    granted = 0
    for _ in range(10):
        now[0] += 0.1
        granted += pacer.take("o", "p", 1).granted
    assert granted == 10  # no share applies to an unkeyed take


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf, 1e308, 1e-320, True, "2"])
def test_fair_shares_a_bad_weight_fails_that_take_alone(weight: float) -> None:
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=10.0)})
    with pytest.raises(ValueError, match="weight must be a number from 1e-06 to 1e"):
        pacer.take("o", "p", key="a", weight=weight)
    assert pacer.take("o", "p", key="a").granted == 1


def test_fair_shares_the_widest_weights_share_exactly() -> None:
    """Weights at both ends of their range (1e6 against 1e-6) still share by weight: the
    light key gets its sliver, no NaN, no division by zero."""
    now = [0.0]
    pacer = LocalPacer({"p": ProviderLimits(rate_rps=50.0)}, clock=lambda: now[0])
    got = {"heavy": 0, "light": 0}
    for _ in range(500):
        now[0] += 0.02
        for key, weight in (("heavy", 1e6), ("light", 1e-6)):
            got[key] += pacer.take("o", "p", 1, partial=True, key=key, weight=weight).granted
    assert got["heavy"] + got["light"] <= 50 * 10 + 2
    assert got["heavy"] >= 490
