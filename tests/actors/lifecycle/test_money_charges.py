"""Under a money budget: each slot is asked with its request's known price; a grant's
charge is spent on the units it admits, comes back when nothing was sent, and is
settled to what the answer cost.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects)."""

from __future__ import annotations

from decimal import Decimal

from actors.errors import BudgetExceededError
from actors.messages import UnitFinished
from actors.tool import BatchStrategy, Policy, Tool
from stores.codec import encode_output
from stores.errors import StoreUnavailableError
from stores.money import Money

from .conftest import TIMEOUT_S, Driver

USD = "USD"
BUDGET = Policy(timeout_s=TIMEOUT_S, max_spend=Money("100", USD))


def _echo(input: object, ctx: object) -> object:
    return input


FIXED = Tool(tool_id="t", fn=_echo, price=Money("2", USD))


def test_money_charge_slots_are_asked_with_their_prices_and_a_fixed_price_settles_to_itself() -> None:
    d = Driver(FIXED, BUDGET)
    d.drain("a", "b")
    d.answer_claim()
    assert d.fx.prices == [(Decimal(2), Decimal(2))]
    d.grant()
    d.mark()
    for spec in list(d.fx.starts):
        d.finish(spec=spec)
        d.persisted()
    assert d.fx.unspent == 0  # paid what it was charged
    d.assert_nothing_held()


def test_money_charge_comes_back_when_nothing_was_sent() -> None:
    d = Driver(FIXED, BUDGET)
    d.drain("a")
    d.answer_claim()
    d.grant()
    d.mark(error=StoreUnavailableError("down"))  # never sent: receipts given back
    assert d.fx.unspent == Decimal(2)
    assert d.fx.refunds == 1
    d.assert_nothing_held()


def test_money_charge_of_a_unit_gone_before_its_grant_comes_back() -> None:
    d = Driver(FIXED, BUDGET)
    gone, _ = d.drain("a", "b")
    d.answer_claim()
    assert d.cancel(gone)
    d.grant()  # charged for 2 units; one is gone
    assert d.fx.unspent == Decimal(2) and d.fx.refunds == 1
    d.mark()
    d.finish()
    d.persisted()
    d.assert_nothing_held()


def test_money_charge_refused_leaves_the_receipts_pending() -> None:
    d = Driver(FIXED, BUDGET)
    d.drain("a")
    d.answer_claim()
    d.refuse(BudgetExceededError("the run's money budget of 1 USD would be passed"))
    assert [lease.key for lease in d.fx.released] == ["a"]  # released, not failed
    assert not d.fx.failures
    d.assert_nothing_held()


def test_money_charge_of_an_estimate_settles_to_the_answers_cost() -> None:
    tool = Tool(
        tool_id="llm", fn=_echo, price=lambda i, o: Money("0.25", USD), price_estimate=Money("1", USD)
    )
    d = Driver(tool, BUDGET)
    d.drain("a")
    d.answer_claim()
    assert d.fx.prices == [(Decimal(1),)]
    d.grant()
    d.mark()
    spec = d.fx.starts[-1]
    d.life.handle(
        UnitFinished(
            unit=spec.unit, attempt=spec.attempt, members=[(encode_output({"v": 1}), None)], error=None,
            sent_at=d.now, costs=(Money("0.25", USD),),
        ),
        d.now,
    )  # fmt: skip
    d.pump()
    assert d.fx.unspent == Decimal("0.75")
    d.persisted()
    d.assert_nothing_held()


def test_money_charge_of_a_batch_request_adds_its_request_price() -> None:
    batch = BatchStrategy(batch_fn=_echo, max_batch_size=5, request_price=Money("3", USD))
    d = Driver(Tool(tool_id="b", fn=_echo, batch=batch, price=Money("1", USD)), BUDGET)
    d.drain("a", "b")
    d.answer_claim()
    assert d.fx.prices == [(Decimal(5),)]  # one request: 2 x 1 + 3


def test_money_charge_none_without_a_budget() -> None:
    d = Driver(FIXED)
    d.drain("a")
    d.answer_claim()
    assert d.fx.prices == [()]
