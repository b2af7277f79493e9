"""State-machine tests of the governor: budgets, ceiling, pacing, backpressure, stop.

The plain :class:`Governor` is driven with time passed in as values; reply tokens are
plain objects, since :class:`Decisions` only carries them back.
"""

from __future__ import annotations

import pytest

from actors.errors import BudgetExceededError, CallCancelledError
from actors.governor.decisions import Decisions, Governor, suggested_parallelism
from actors.pacing.bucket import AIMD_DECREASE, PACE_MARGIN
from actors.tool import Pacing, Policy

ORG = "acme"


def _granted(decisions: Decisions) -> dict[object, int]:
    return dict(decisions.grants)


def _refused(decisions: Decisions) -> dict[object, BaseException]:
    return dict(decisions.refusals)


def _gov(policy: Policy | None = None, rng: object = lambda: 0.0, **pacings: Pacing) -> Governor:
    return Governor(policy or Policy(), dict(pacings), rng=rng)  # type: ignore[arg-type]


# -- ceiling and pacing ---------------------------------------------------------------


def test_governor_grants_up_to_want_within_the_ceiling() -> None:
    gov = _gov(Policy(max_concurrency=4))
    a, b = object(), object()
    first = gov.acquire(ORG, "p", 3, a, now=0.0)
    assert _granted(first) == {a: 3}
    second = gov.acquire(ORG, "p", 3, b, now=0.0)
    assert _granted(second) == {b: 1}  # only one slot left under the ceiling
    assert gov.in_flight == 4
    assert not second.refusals


def test_governor_waiter_at_the_ceiling_is_granted_on_release() -> None:
    gov = _gov(Policy(max_concurrency=1))
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, a, now=0.0)) == {a: 1}
    waiting = gov.acquire(ORG, "p", 1, b, now=0.0)
    assert waiting.grants == [] and waiting.refusals == []
    released = gov.release(ORG, "p", count=1, successes=1, now=1.0)
    assert _granted(released) == {b: 1}
    assert gov.in_flight == 1


def test_governor_waiting_for_pacing_holds_no_global_slot() -> None:
    gov = _gov(Policy(max_concurrency=2), slow=Pacing(rps=1.0, burst=1.0))
    a, b, c = object(), object(), object()
    assert _granted(gov.acquire(ORG, "slow", 1, a, now=0.0)) == {a: 1}
    paced = gov.acquire(ORG, "slow", 1, b, now=0.0)
    assert paced.grants == []
    assert gov.in_flight == 1  # the paced waiter holds nothing
    other = gov.acquire(ORG, "fast", 1, c, now=0.0)
    assert _granted(other) == {c: 1}
    assert gov.in_flight == 2


def test_governor_exhausted_bucket_does_not_block_another_provider() -> None:
    gov = _gov(Policy(max_concurrency=64), slow=Pacing(rps=1.0, burst=1.0))
    slow_waiters = [object() for _ in range(5)]
    granted: dict[object, int] = {}
    for token in slow_waiters:
        granted.update(_granted(gov.acquire(ORG, "slow", 1, token, now=0.0)))
    assert len(granted) == 1  # one token, four wait for pacing
    fast = [object() for _ in range(10)]
    for token in fast:
        decisions = gov.acquire(ORG, "fast", 1, token, now=0.0)
        assert _granted(decisions) == {token: 1}


def test_governor_wake_at_says_when_tokens_arrive() -> None:
    gov = _gov(slow=Pacing(rps=2.0, burst=1.0))
    a, b = object(), object()
    gov.acquire(ORG, "slow", 1, a, now=10.0)
    waiting = gov.acquire(ORG, "slow", 1, b, now=10.0)
    assert waiting.wake_at == pytest.approx(10.0 + 1 / (2.0 * PACE_MARGIN))  # paced just under 2/s
    assert gov.wake(10.5).grants == []
    assert _granted(gov.wake(waiting.wake_at)) == {b: 1}


def test_governor_release_grants_waiters_of_a_concurrency_capped_provider() -> None:
    gov = _gov(capped=Pacing(max_concurrency=1))
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "capped", 1, a, now=0.0)) == {a: 1}
    waiting = gov.acquire(ORG, "capped", 1, b, now=0.0)
    assert waiting.grants == [] and waiting.wake_at is None  # only a release helps
    assert _granted(gov.release(ORG, "capped", count=1, successes=1, now=0.1)) == {b: 1}


def test_governor_waiters_are_granted_in_order() -> None:
    gov = _gov(slow=Pacing(rps=1.0, burst=1.0))
    tokens = [object() for _ in range(3)]
    order = []
    for token in tokens:
        order += [t for t, _ in gov.acquire(ORG, "slow", 1, token, now=0.0).grants]
    for t in (1.1, 2.2):
        order += [t for t, _ in gov.wake(t).grants]
    assert order == tokens


def test_governor_following_wake_at_grants_every_paced_waiter() -> None:
    # Regression for a lost wake-up: a wake at the announced time must grant, or
    # announce a later time; never neither while waiters remain.
    gov = _gov(p=Pacing(rps=7.0, burst=3.0))
    gov.backpressure(ORG, "p", "13", now=1000.0, wall=1_700_000_000.0)
    tokens = [object() for _ in range(40)]
    granted = []
    wake_at = None
    for token in tokens:
        decisions = gov.acquire(ORG, "p", 1, token, now=1000.0)
        wake_at = decisions.wake_at
    wakes = 0
    while len(granted) < len(tokens):
        assert wake_at is not None, f"stranded after {len(granted)} grants"
        decisions = gov.wake(wake_at)
        granted += [t for t, _ in decisions.grants]
        gov.release(ORG, "p", count=len(decisions.grants), successes=0, now=wake_at)
        wake_at = decisions.wake_at
        wakes += 1
        assert wakes < 200
    assert granted == tokens
    assert wake_at is None


# -- backpressure ---------------------------------------------------------------------


def test_governor_backpressure_pauses_every_tool_of_that_provider_only() -> None:
    gov = _gov(Policy(max_concurrency=64), a=Pacing(rps=10.0, burst=10.0), b=Pacing(rps=10.0, burst=10.0))
    paused = gov.backpressure(ORG, "a", "30", now=100.0, wall=1_700_000_000.0)
    assert paused.grants == []
    # two tools sharing provider "a" both wait: one bucket per (org, provider)
    tool_one, tool_two = object(), object()
    assert gov.acquire(ORG, "a", 1, tool_one, now=101.0).grants == []
    waiting = gov.acquire(ORG, "a", 1, tool_two, now=101.0)
    assert waiting.grants == []
    assert waiting.wake_at == pytest.approx(130.0)
    # provider "b" and provider "a" of another org are untouched
    other_provider, other_org = object(), object()
    assert _granted(gov.acquire(ORG, "b", 1, other_provider, now=101.0)) == {other_provider: 1}
    assert _granted(gov.acquire("globex", "a", 1, other_org, now=101.0)) == {other_org: 1}
    assert gov.bucket(ORG, "a").rate == pytest.approx(10.0 * PACE_MARGIN * AIMD_DECREASE)
    assert gov.bucket("globex", "a").rate == pytest.approx(10.0 * PACE_MARGIN)
    assert gov.bucket(ORG, "b").rate == pytest.approx(10.0 * PACE_MARGIN)
    # after the pause, releases are spread by the (cut) rate
    assert gov.wake(130.0).grants == []
    rate = gov.bucket(ORG, "a").rate
    assert rate is not None
    first = gov.wake(130.0 + 1 / rate)
    assert _granted(first) == {tool_one: 1}
    assert _granted(gov.wake(130.0 + 2 / rate)) == {tool_two: 1}


def test_governor_backpressure_uses_policy_bounds_for_retry_after() -> None:
    policy = Policy(retry_after_default_s=7.0, retry_after_max_s=60.0, retry_after_min_s=0.5)
    gov = _gov(policy)
    gov.backpressure(ORG, "p", "garbage", now=0.0, wall=1_700_000_000.0)
    assert gov.bucket(ORG, "p").gate_until == pytest.approx(7.0)
    gov.backpressure(ORG, "q", "99999", now=0.0, wall=1_700_000_000.0)
    assert gov.bucket(ORG, "q").gate_until == pytest.approx(60.0)
    gov.backpressure(ORG, "r", "0", now=0.0, wall=1_700_000_000.0)
    assert gov.bucket(ORG, "r").gate_until == pytest.approx(0.5)


def test_governor_backpressure_jitter_comes_from_rng() -> None:
    draws = iter([0.5, 0.25])
    gov = _gov(rng=lambda: next(draws))
    gov.backpressure(ORG, "p", "20", now=10.0, wall=1_700_000_000.0)
    # pause 20 s: jitter is rng() * min(1, 0.1 * 20) = 0.5 * 1
    assert gov.bucket(ORG, "p").gate_until == pytest.approx(10.0 + 20.0 + 0.5)
    gov.backpressure(ORG, "p", "2", now=40.0, wall=1_700_000_000.0)
    # pause 2 s: jitter is rng() * min(1, 0.1 * 2) = 0.25 * 0.2
    assert gov.bucket(ORG, "p").gate_until == pytest.approx(40.0 + 2.0 + 0.05)
    assert gov.bucket(ORG, "p").backpressure_events == 2


def test_governor_backpressure_http_date_is_read_against_wall_clock() -> None:
    import email.utils

    wall = 1_700_000_000.0
    gov = _gov()
    gov.backpressure(ORG, "p", email.utils.formatdate(wall + 120, usegmt=True), now=5.0, wall=wall)
    assert gov.bucket(ORG, "p").gate_until == pytest.approx(125.0, abs=1.0)


def test_governor_success_releases_add_rate_back() -> None:
    gov = _gov(p=Pacing(rps=10.0, burst=10.0))
    gov.backpressure(ORG, "p", "1", now=0.0, wall=1_700_000_000.0)
    cut = gov.bucket(ORG, "p").rate
    a = object()
    assert _granted(gov.acquire(ORG, "p", 10, a, now=5.0)) == {a: 10}  # the rate is in use
    gov.release(ORG, "p", count=10, successes=0, now=5.1)
    assert gov.bucket(ORG, "p").rate == cut  # failures add nothing
    b = object()
    assert _granted(gov.acquire(ORG, "p", 5, b, now=6.0)) == {b: 5}
    grown = gov.release(ORG, "p", count=5, successes=1, now=6.1)
    rate = gov.bucket(ORG, "p").rate
    assert rate is not None and cut is not None and rate > cut
    assert grown.gates == {(ORG, "p"): (rate, None)}  # the send gate follows the new rate


def test_governor_decisions_keep_the_send_gates_in_step() -> None:
    gov = _gov(p=Pacing(rps=10.0, burst=1.0))
    first = gov.acquire(ORG, "p", 1, object(), now=0.0)
    assert first.gates == {(ORG, "p"): (pytest.approx(10.0 * PACE_MARGIN), None)}  # a new bucket
    assert gov.acquire(ORG, "p", 1, object(), now=0.0).gates == {}  # nothing changed
    paused = gov.backpressure(ORG, "p", "2", now=1.0, wall=1_700_000_000.0)
    bucket = gov.bucket(ORG, "p")
    assert paused.gates == {(ORG, "p"): (bucket.rate, bucket.gate_until)}
    assert bucket.gate_until == pytest.approx(3.0)
    unpaced = gov.acquire(ORG, "local", 1, object(), now=0.0)
    assert unpaced.gates == {(ORG, "local"): (None, None)}  # no rate: sends are not spaced


# -- budgets --------------------------------------------------------------------------


def test_governor_provider_call_budget_refuses_after_the_limit() -> None:
    gov = _gov(Policy(max_provider_calls=3))
    tokens = [object() for _ in range(4)]
    for token in tokens[:3]:
        assert _granted(gov.acquire(ORG, "p", 1, token, now=0.0)) == {token: 1}
    last = gov.acquire(ORG, "p", 1, tokens[3], now=0.0)
    assert last.grants == []
    assert isinstance(_refused(last)[tokens[3]], BudgetExceededError)
    assert gov.spent["provider_calls"] == 3
    assert gov.in_flight == 3  # a refusal takes no slot


def test_governor_provider_call_budget_grants_partially_when_fewer_remain() -> None:
    gov = _gov(Policy(max_provider_calls=5))
    a, b, c = object(), object(), object()
    assert _granted(gov.acquire(ORG, "p", 3, a, now=0.0)) == {a: 3}
    assert _granted(gov.acquire(ORG, "p", 3, b, now=0.0)) == {b: 2}
    assert isinstance(_refused(gov.acquire(ORG, "p", 1, c, now=0.0))[c], BudgetExceededError)
    assert gov.spent["provider_calls"] == 5


def test_governor_budget_refusal_does_not_block_later_grants_of_other_budgets() -> None:
    gov = _gov(Policy(max_provider_calls=1, max_concurrency=1))
    a, b = object(), object()
    gov.acquire(ORG, "p", 1, a, now=0.0)
    gov.acquire(ORG, "p", 1, b, now=0.0)  # waits at the ceiling
    released = gov.release(ORG, "p", count=1, successes=1, now=1.0)
    assert isinstance(_refused(released)[b], BudgetExceededError)
    assert not gov.waiters[(ORG, "p", False)]  # nobody left waiting


def test_governor_charge_retries_raises_past_the_limit_and_charges_nothing() -> None:
    gov = _gov(Policy(max_retries=2))
    gov.charge("retries", 1)
    with pytest.raises(BudgetExceededError, match="retries"):
        gov.charge("retries", 2)
    assert gov.spent["retries"] == 1
    gov.charge("retries", 1)
    with pytest.raises(BudgetExceededError):
        gov.charge("retries", 1)
    assert gov.spent["retries"] == 2


def test_governor_refund_gives_a_charge_back_never_below_nothing_spent() -> None:
    gov = _gov(Policy(max_retries=1))
    gov.charge("retries", 1)
    gov.refund("retries", 1)  # that retry never went
    gov.charge("retries", 1)  # so another may go
    gov.refund("retries", 5)
    assert gov.spent["retries"] == 0


def test_governor_unlimited_budget_never_refuses() -> None:
    gov = _gov(Policy(max_retries=None))
    for _ in range(1000):
        gov.charge("retries", 5)
    assert gov.spent["retries"] == 5000


# -- stop -----------------------------------------------------------------------------


def test_governor_stop_refuses_waiters_and_later_acquires() -> None:
    gov = _gov(Policy(max_concurrency=1), slow=Pacing(rps=1.0, burst=1.0))
    a, b, c, d = object(), object(), object(), object()
    gov.acquire(ORG, "slow", 1, a, now=0.0)
    gov.acquire(ORG, "slow", 1, b, now=0.0)
    gov.acquire(ORG, "other", 1, c, now=0.0)  # waits at the ceiling
    stopped = gov.stop()
    refused = _refused(stopped)
    assert set(refused) == {b, c}
    assert all(isinstance(exc, CallCancelledError) for exc in refused.values())
    late = gov.acquire(ORG, "slow", 1, d, now=5.0)
    assert late.grants == [] and isinstance(_refused(late)[d], CallCancelledError)
    assert gov.wake(100.0).grants == []


# -- suggested parallelism ------------------------------------------------------------


@pytest.mark.parametrize(
    ("pacing", "ceiling", "expected"),
    [
        pytest.param(Pacing(max_concurrency=4, rps=100.0), 64, 4, id="max-concurrency-wins"),
        pytest.param(Pacing(rps=2.5), 64, 3, id="ceil-of-rps"),
        pytest.param(Pacing(rps=0.2), 64, 1, id="floored-at-one"),
        pytest.param(Pacing(), 16, 16, id="unknown-is-ceiling"),
        pytest.param(Pacing(rps=1000.0), 8, 8, id="capped-by-ceiling"),
        pytest.param(Pacing(max_concurrency=100), 8, 8, id="concurrency-capped-by-ceiling"),
    ],
)
def test_suggested_parallelism_table(pacing: Pacing, ceiling: int, expected: int) -> None:
    assert suggested_parallelism(pacing, ceiling) == expected


def test_governor_grants_never_exceed_ceiling_under_churn() -> None:
    gov = _gov(Policy(max_concurrency=3), p=Pacing(rps=5.0, burst=2.0), q=Pacing(max_concurrency=2))
    provider_of: dict[object, str] = {}
    outstanding: list[tuple[str, int]] = []
    granted_total = 0
    for step in range(200):
        now = step * 0.05
        provider = "p" if step % 2 else "q"
        token = object()
        provider_of[token] = provider
        decisions = gov.acquire(ORG, provider, 1 + step % 3, token, now=now)
        if step % 3 == 0 and outstanding:
            done, n = outstanding.pop(0)
            decisions.grants += gov.release(ORG, done, count=n, successes=n, now=now).grants
        for reply, n in decisions.grants:
            outstanding.append((provider_of[reply], n))
            granted_total += n
        assert gov.in_flight == sum(n for _, n in outstanding) <= 3
        assert gov.bucket(ORG, "q").in_flight <= 2
    assert granted_total > 20  # the churn did make progress


def test_governor_ceiling_grants_oldest_waiter_across_providers() -> None:
    # A provider whose waiters keep arriving must not starve an older waiter of another
    # provider at the global ceiling.
    gov = _gov(Policy(max_concurrency=1))
    first, b_waiter = object(), object()
    gov.acquire(ORG, "a", 1, first, now=0.0)
    gov.acquire(ORG, "b", 1, b_waiter, now=0.0)
    gov.acquire(ORG, "a", 1, object(), now=0.1)  # arrives after b's waiter
    released = gov.release(ORG, "a", count=1, successes=1, now=0.2)
    assert _granted(released) == {b_waiter: 1}


def test_governor_ceiling_skips_a_paced_provider_for_a_younger_ready_one() -> None:
    gov = _gov(Policy(max_concurrency=1), slow=Pacing(rps=1.0, burst=1.0))
    held, slow_waiter, fast_waiter = object(), object(), object()
    gov.acquire(ORG, "slow", 1, held, now=0.0)  # takes the slot and the only token
    gov.acquire(ORG, "slow", 1, slow_waiter, now=0.0)
    gov.acquire(ORG, "fast", 1, fast_waiter, now=0.0)
    released = gov.release(ORG, "slow", count=1, successes=1, now=0.1)
    assert _granted(released) == {fast_waiter: 1}  # the older waiter waits for pacing only
    assert released.wake_at is not None


# -- provider circuit -----------------------------------------------------------------


def test_governor_open_circuit_refuses_waiters_and_new_calls_then_probes() -> None:
    from actors.errors import ProviderUnavailableError

    gov = _gov(Policy(max_concurrency=2, circuit_failures=2, circuit_open_s=5.0), p=Pacing())
    a, b, queued = object(), object(), object()
    assert _granted(gov.acquire(ORG, "p", 2, a, now=0.0)) == {a: 2}
    assert gov.acquire(ORG, "p", 1, queued, now=0.0).grants == []  # at the ceiling
    opened = gov.release(ORG, "p", count=2, successes=0, now=1.0, unavailable=2, answered=0)
    assert isinstance(_refused(opened)[queued], ProviderUnavailableError)
    assert opened.closed == {(ORG, "p"): pytest.approx(6.0)}  # the send gate closes too
    assert isinstance(_refused(gov.acquire(ORG, "p", 1, b, now=2.0))[b], ProviderUnavailableError)
    assert gov.acquire(ORG, "other", 1, object(), now=2.0).grants  # another provider is not affected
    probe, held = object(), object()
    assert _granted(gov.acquire(ORG, "p", 3, probe, now=6.0)) == {probe: 1}  # one probe call
    assert gov.acquire(ORG, "p", 1, held, now=6.0).grants == []  # waits for the probe
    closed = gov.release(ORG, "p", count=1, successes=1, now=6.5)
    assert _granted(closed) == {held: 1}


def test_governor_open_circuit_refuses_a_call_at_once_even_at_the_ceiling() -> None:
    from actors.errors import ProviderUnavailableError

    gov = _gov(Policy(max_concurrency=1, circuit_failures=1, circuit_open_s=5.0))
    gov.acquire(ORG, "p", 1, object(), now=0.0)
    gov.release(ORG, "p", 1, 0, now=0.1, unavailable=1)  # the circuit opens
    assert gov.acquire(ORG, "other", 1, object(), now=0.2).grants  # the only slot is taken
    late = object()
    assert isinstance(_refused(gov.acquire(ORG, "p", 1, late, now=1.0))[late], ProviderUnavailableError)
    assert not gov.waiters.get((ORG, "p", False))  # failed fast, not left waiting for a slot


def test_governor_answers_that_are_not_successes_keep_the_circuit_closed() -> None:
    gov = _gov(Policy(circuit_failures=2), p=Pacing())
    for i in range(5):
        gov.acquire(ORG, "p", 1, object(), now=float(i))
        gov.release(
            ORG, "p", count=1, successes=0, now=float(i), unavailable=1 if i % 2 else 0, answered=1 - i % 2
        )
    assert gov.bucket(ORG, "p").circuit(5.0) == "closed"
    assert gov.acquire(ORG, "p", 1, object(), now=5.0).grants  # calls go


# -- immediate grants (slots asked for before a claim) -----------------------------------


def test_governor_immediate_grants_now_what_there_is_room_for() -> None:
    gov = _gov(Policy(max_concurrency=3))
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "p", 2, a, now=0.0, immediate=True)) == {a: 2}
    assert _granted(gov.acquire(ORG, "p", 2, b, now=0.0, immediate=True)) == {b: 1}
    assert gov.in_flight == 3 and gov.spent["provider_calls"] == 3


def test_governor_immediate_without_room_answers_zero_and_leaves_no_waiter() -> None:
    gov = _gov(Policy(max_concurrency=1))
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, a, now=0.0)) == {a: 1}
    assert _granted(gov.acquire(ORG, "p", 1, b, now=0.0, immediate=True)) == {b: 0}
    assert not any(gov.waiters.values())
    assert gov.release(ORG, "p", count=1, successes=1, now=1.0).grants == []  # nobody to wake
    assert gov.in_flight == 0 and gov.spent["provider_calls"] == 1


def test_governor_immediate_behind_a_waiter_is_sent_the_usual_way() -> None:
    gov = _gov(Policy(max_concurrency=1))
    a, b, c = object(), object(), object()
    gov.acquire(ORG, "p", 1, a, now=0.0)
    gov.acquire(ORG, "p", 1, b, now=0.0)  # waits
    assert _granted(gov.acquire(ORG, "p", 1, c, now=0.0, immediate=True)) == {c: -1}
    assert _granted(gov.release(ORG, "p", count=1, successes=1, now=1.0)) == {b: 1}  # b first


@pytest.mark.parametrize("pacing", [Pacing(rps=50.0), Pacing(start_rps=5.0)], ids=["stated", "start"])
def test_governor_immediate_for_a_paced_provider_is_sent_the_usual_way(pacing: Pacing) -> None:
    gov = _gov(p=pacing)
    a, b = object(), object()
    decided = gov.acquire(ORG, "p", 1, a, now=0.0, immediate=True)
    assert _granted(decided) == {a: -1}
    assert gov.in_flight == 0 and gov.spent["provider_calls"] == 0  # no token, no charge
    assert ("acme", "p") in decided.gates  # the new bucket's send gate is still set up
    assert _granted(gov.acquire(ORG, "p", 1, b, now=0.0)) == {b: 1}


def test_governor_immediate_after_a_429_made_the_provider_paced_is_sent_the_usual_way() -> None:
    gov = _gov()
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, a, now=0.0, immediate=True)) == {a: 1}
    gov.backpressure(ORG, "p", retry_after=None, now=0.1, wall=0.1)
    assert _granted(gov.acquire(ORG, "p", 1, b, now=5.0, immediate=True)) == {b: -1}


def test_governor_immediate_while_the_circuit_probes_is_sent_the_usual_way() -> None:
    gov = _gov(Policy(circuit_failures=1, circuit_open_s=1.0))
    a, b = object(), object()
    gov.acquire(ORG, "p", 1, a, now=0.0)
    gov.release(ORG, "p", count=1, successes=0, now=0.1, unavailable=1)  # opens
    decided = gov.acquire(ORG, "p", 1, b, now=2.0, immediate=True)  # half-open: probe
    assert _granted(decided) == {b: -1}
    probe = object()  # the probe was not spent on a claim: the next call is it
    assert _granted(gov.acquire(ORG, "p", 3, probe, now=2.0)) == {probe: 1}
    assert gov.acquire(ORG, "p", 1, object(), now=2.0).grants == []  # the others wait for it


def test_governor_immediate_under_a_provider_calls_budget_is_sent_the_usual_way() -> None:
    # a charge held for a claim that may reuse its receipt would refuse a call needing it
    gov = _gov(Policy(max_provider_calls=1))
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, a, now=0.0, immediate=True)) == {a: -1}
    assert gov.in_flight == 0 and gov.spent["provider_calls"] == 0
    assert _granted(gov.acquire(ORG, "q", 1, b, now=0.0)) == {b: 1}


def test_governor_a_nested_call_waiting_for_a_token_is_woken_by_the_refill_at_max_concurrency() -> None:
    """A nested call borrows its parent's slot, so a provider at max_concurrency holds it
    back by its rate alone: the wake-up is the token's refill, not a release that may
    never come (the parent holding the provider's only slot waits on it)."""
    gov = _gov(slow=Pacing(rps=2.0, burst=1.0, max_concurrency=1))
    parent, nested = object(), object()
    assert _granted(gov.acquire(ORG, "slow", 1, parent, now=0.0)) == {parent: 1}  # the only slot
    waiting = gov.acquire(ORG, "slow", 1, nested, now=0.0, exempt=True)
    assert waiting.grants == [] and waiting.wake_at == pytest.approx(0.5, rel=0.05)  # the next token
    assert _granted(gov.wake(now=waiting.wake_at)) == {nested: 1}
    assert gov.in_flight == 1  # its grant took no slot


def test_governor_a_nested_call_is_not_held_by_a_half_open_probe() -> None:
    """The probe out may be the nested call's own parent, waiting on it: a nested call goes
    (by the rate alone); an ordinary call waits for the probe to settle."""
    gov = _gov(Policy(circuit_failures=1, circuit_open_s=1.0))
    first = object()
    assert _granted(gov.acquire(ORG, "p", 1, first, now=0.0)) == {first: 1}
    gov.release(ORG, "p", 1, 0, now=0.1, unavailable=1)  # the circuit opens
    probe, ordinary, nested = object(), object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, probe, now=1.5)) == {probe: 1}  # half-open: the probe
    assert gov.acquire(ORG, "p", 1, ordinary, now=1.6).grants == []
    assert _granted(gov.acquire(ORG, "p", 1, nested, now=1.6, exempt=True)) == {nested: 1}


@pytest.mark.parametrize("nested", [False, True], ids=["ordinary-probe", "nested-probe"])
def test_governor_a_call_granted_before_the_circuit_opened_ending_with_no_verdict_keeps_the_probe(
    nested: bool,
) -> None:
    """Two calls were out when the circuit opened; at half-open one probe goes. One of the
    two earlier calls then ends with no verdict (its outcome says nothing of the provider):
    that is not the probe, which is still out, so no second probe goes (breaker round 3:
    any verdict-less release ended the probe). Once nothing of the probe's kind is out,
    the next call probes."""
    gov = _gov(Policy(max_concurrency=3, circuit_failures=1, circuit_open_s=1.0))
    assert _granted(gov.acquire(ORG, "p", 3, object(), now=0.0)) != {}
    gov.release(ORG, "p", 1, 0, now=0.1, unavailable=1)  # opens; two calls still out
    probe, second = object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, probe, now=1.5, exempt=nested)) == {probe: 1}
    gov.release(ORG, "p", 1, 0, now=1.6, answered=0)  # an earlier call, no verdict
    assert gov.acquire(ORG, "p", 1, second, now=1.7).grants == []  # the probe is still out
    if nested:  # the probe (a nested call's) ends with no verdict: the next call probes
        assert _granted(gov.release(ORG, "p", 1, 0, now=1.8, answered=0, exempt=True)) == {second: 1}
    else:
        gov.release(ORG, "p", 1, 0, now=1.8, answered=0)  # the probe or the other: one still out
        assert gov.acquire(ORG, "p", 1, object(), now=1.85).grants == []
        assert _granted(gov.release(ORG, "p", 1, 0, now=1.9, answered=0)) == {second: 1}  # none out
    assert gov.acquire(ORG, "p", 1, object(), now=2.0).grants == []  # ``second`` is the probe now
