"""State-machine tests of the governor's budgets in money: charged at the grant, refused
before a slot when the first price does not fit, given back and settled on release.

The plain :class:`Governor` with time passed in as values; reply tokens are plain objects.
"""

from __future__ import annotations

from decimal import Decimal

from actors.errors import BudgetExceededError
from actors.governor.decisions import Decisions, Governor
from actors.tool import Pacing, Policy
from stores.money import Money

ORG = "acme"
D = Decimal


def _granted(decisions: Decisions) -> dict[object, int]:
    return dict(decisions.grants)


def _refused(decisions: Decisions) -> dict[object, BaseException]:
    return dict(decisions.refusals)


def _gov(policy: Policy, **pacings: Pacing) -> Governor:
    return Governor(policy, dict(pacings), rng=lambda: 0.0)


def test_money_budget_grant_charges_the_prices_that_fit() -> None:
    gov = _gov(Policy(max_spend=Money("25", "USD")))
    a = object()
    out = gov.acquire(ORG, "p", 3, a, now=0.0, prices=(D(10), D(10), D(10)))
    assert _granted(out) == {a: 2}  # the third would pass 25
    assert gov.money.spent == D(20)
    assert gov.in_flight == 2


def test_money_budget_refuses_when_the_first_price_does_not_fit() -> None:
    gov = _gov(Policy(max_spend=Money("25", "USD")), p=Pacing(rps=1.0, burst=1.0))
    a, b = object(), object()
    assert _granted(gov.acquire(ORG, "p", 1, a, now=0.0, prices=(D(20),))) == {a: 1}
    out = gov.acquire(ORG, "p", 1, b, now=0.0, prices=(D("5.01"),))
    error = _refused(out)[b]
    assert isinstance(error, BudgetExceededError)
    text = str(error)
    assert "money budget (25 USD)" in text and "20 USD is spent" in text and "costs 5.01 USD" in text
    assert out.wake_at is None  # refused at once: it waits for no rate token
    assert gov.money.spent == D(20) and gov.in_flight == 1


def test_money_budget_release_gives_back_what_was_not_spent() -> None:
    gov = _gov(Policy(max_spend=Money("25", "USD")))
    a, b = object(), object()
    gov.acquire(ORG, "p", 2, a, now=0.0, prices=(D(10), D(10)))
    # one never sent (its whole charge), one answered for 4 of its 10 estimated
    gov.release(ORG, "p", count=2, successes=1, now=1.0, refunds=1, unspent=D(16))
    assert gov.money.spent == D(4)
    assert _granted(gov.acquire(ORG, "p", 2, b, now=1.0, prices=(D(10), D(10)))) == {b: 2}
    assert gov.money.spent == D(24)


def test_money_budget_settles_a_cost_above_its_estimate_even_past_the_budget() -> None:
    gov = _gov(Policy(max_spend=Money("10", "USD")))
    a, b = object(), object()
    gov.acquire(ORG, "p", 1, a, now=0.0, prices=(D(8),))
    gov.release(ORG, "p", count=1, successes=1, now=1.0, unspent=D(-4))  # it cost 12: paid
    assert gov.money.spent == D(12)
    assert isinstance(_refused(gov.acquire(ORG, "p", 1, b, now=1.0, prices=(D(0),)))[b], BudgetExceededError)


def test_money_budget_give_back_never_goes_below_nothing_spent() -> None:
    gov = _gov(Policy(max_spend=Money("10", "USD")))
    gov.release(ORG, "p", count=0, successes=0, now=0.0, unspent=D(5))
    assert gov.money.spent == D(0)


def test_money_budget_of_a_provider_leaves_other_providers_alone() -> None:
    gov = _gov(Policy(max_spend_by_provider={"dear": Money("1", "USD")}))
    a, b, c = object(), object(), object()
    assert _granted(gov.acquire(ORG, "dear", 2, a, now=0.0, prices=(D(1), D(1)))) == {a: 1}
    assert gov.money.spent_by_provider == {"dear": D(1)}
    assert isinstance(
        _refused(gov.acquire(ORG, "dear", 1, b, now=0.0, prices=(D(1),)))[b], BudgetExceededError
    )
    assert _granted(gov.acquire(ORG, "cheap", 5, c, now=0.0)) == {c: 5}  # no budget: no prices


def test_money_budget_and_run_budget_both_hold() -> None:
    gov = _gov(Policy(max_spend=Money("3", "USD"), max_spend_by_provider={"p": Money("5", "USD")}))
    a = object()
    assert _granted(gov.acquire(ORG, "p", 4, a, now=0.0, prices=(D(1),) * 4)) == {a: 3}  # the run's 3
    assert gov.money.spent == D(3) and gov.money.spent_by_provider == {"p": D(3)}


def test_money_budget_slots_before_a_claim_are_asked_the_usual_way() -> None:
    gov = _gov(Policy(max_spend=Money("3", "USD")))
    a = object()
    assert _granted(gov.acquire(ORG, "p", 1, a, now=0.0, immediate=True)) == {a: -1}
    assert gov.in_flight == 0
