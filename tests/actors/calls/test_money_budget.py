"""Budgets in money: a call that would pass the run's budget is refused before it is sent
(its receipt left pending), never after it was paid; a later run with more budget pays
it. Real systems over real SQLite files; the tools count what they were paid for."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest

from actors import BatchStrategy, BudgetExceededError, Policy, Tool
from stores.money import Money
from stores.types import ReceiptStatus

from ..conftest import WAIT_S

USD = "USD"


class _Paid:
    """A plain tool function that counts the calls it answered (what it was paid for)."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, input: Any, ctx: Any) -> Any:
        with self.lock:
            self.inputs.append(input)
        return {"echo": input["i"], "usage": {"tokens": 10}}


def _outcomes(futures: list[Any]) -> list[Any]:
    out = []
    for future in futures:
        try:
            out.append(future.get(timeout=WAIT_S).execution)
        except BudgetExceededError as exc:
            out.append(exc)
    return out


def test_money_budget_pays_up_to_it_and_a_later_run_with_more_pays_the_rest(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    paid = _Paid()
    price = Money("10", USD)
    tool = Tool(tool_id="verify", fn=paid, price=price)
    inputs = [{"i": i} for i in range(5)]
    budget = Money.parse("25USD")
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, max_spend=budget))
    outcomes = _outcomes(system.proxy().execute_many("verify", inputs))
    assert [o for o in outcomes if isinstance(o, str)] == ["live", "live"]
    refused = [o for o in outcomes if isinstance(o, BudgetExceededError)]
    assert len(refused) == 3
    assert "25 USD" in str(refused[0]) and "20 USD" in str(refused[0]) and "costs 10 USD" in str(refused[0])
    assert len(paid.inputs) == 2  # refused before the tool ran
    assert price * len(paid.inputs) == Money("20", USD)
    assert price.amount * len(paid.inputs) <= budget.amount
    assert system.stats()["spent"]["total"] == {USD: Money("20", USD)}
    receipts = read_receipts([key_of(tool, i) for i in inputs])
    statuses = [r.status for r in receipts]
    assert statuses.count(ReceiptStatus.COMPLETED) == 2
    assert statuses.count(ReceiptStatus.PENDING) == 3  # released, not failed
    system.stop(timeout_s=WAIT_S)

    more = make_system([tool], run_id="r2", policy=Policy(batch_grace_s=0.05, max_spend=Money("100", USD)))
    outcomes = _outcomes(more.proxy().execute_many("verify", inputs))
    assert sorted(outcomes) == ["cached", "cached", "live", "live", "live"]
    assert len(paid.inputs) == 5  # every call paid once, in all
    assert {i["i"] for i in paid.inputs} == {0, 1, 2, 3, 4}
    assert more.stats()["spent"]["total"] == {USD: Money("30", USD)}
    assert [r.status for r in read_receipts([key_of(tool, i) for i in inputs])] == [
        ReceiptStatus.COMPLETED
    ] * 5


def test_money_budget_counts_a_batch_requests_price_before_it_is_sent(make_system: Any) -> None:
    batches: list[int] = []

    def batch_fn(payload: Any, ctx: Any) -> Any:
        batches.append(len(payload))
        return [{"echo": p["i"]} for p in payload]

    batch = BatchStrategy(batch_fn=batch_fn, max_batch_size=4, request_price=Money("1", USD))
    tool = Tool(tool_id="enrich", fn=_Paid(), batch=batch, price=Money("0.5", USD))
    system = make_system([tool], policy=Policy(batch_grace_s=0.2, max_spend=Money("5", USD)))
    outcomes = _outcomes(system.proxy().execute_many("enrich", [{"i": i} for i in range(8)]))
    # each request of 4 costs 1 + 4 x 0.5 = 3: the second would pass 5, so it is halved,
    # and a request of 2 (1 + 2 x 0.5 = 2) fits what is left exactly
    assert batches == [4, 2]
    assert outcomes.count("live") == 6
    assert sum(isinstance(o, BudgetExceededError) for o in outcomes) == 2
    assert system.stats()["spent"]["total"] == {USD: Money("5", USD)}


def test_money_budget_halves_a_batch_it_has_no_room_for_and_a_later_run_pays_the_rest(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    batches: list[int] = []

    def batch_fn(payload: Any, ctx: Any) -> Any:
        batches.append(len(payload))
        return [{"echo": p["i"]} for p in payload]

    batch = BatchStrategy(batch_fn=batch_fn, max_batch_size=10, request_price=Money("0.5", USD))
    alone = _Paid()  # a lone call goes through fn, at its price alone
    tool = Tool(tool_id="enrich", fn=alone, batch=batch, price=Money("1", USD))
    inputs = [{"i": i} for i in range(20)]
    system = make_system([tool], policy=Policy(batch_grace_s=0.2, max_spend=Money("5.2", USD)))
    outcomes = _outcomes(system.proxy().execute_many("enrich", inputs))
    # no room for 10 (10.5) nor 5 (5.5): halves go while they fit, the rest is refused unsent
    paid = outcomes.count("live")
    assert paid >= 3 and sum(batches) + len(alone.inputs) == paid
    spent = system.stats()["spent"]["total"][USD].amount
    assert spent == paid + Decimal("0.5") * len(batches) <= Decimal("5.2")
    refused = [i for i, o in zip(inputs, outcomes, strict=True) if isinstance(o, BudgetExceededError)]
    assert len(refused) == 20 - paid
    receipts = read_receipts([key_of(tool, i) for i in refused])
    assert {r.status for r in receipts} == {ReceiptStatus.PENDING}
    system.stop(timeout_s=WAIT_S)

    more = make_system([tool], run_id="more", policy=Policy(batch_grace_s=0.2, max_spend=Money("100", USD)))
    again = _outcomes(more.proxy().execute_many("enrich", inputs))
    assert again.count("cached") == paid and again.count("live") == 20 - paid
    assert sum(batches) + len(alone.inputs) == 20  # each input paid once in all


def test_money_budget_counts_an_answer_priced_call_at_its_estimate_until_it_is_paid(
    make_system: Any,
) -> None:
    paid = _Paid()

    def per_token(input: Any, output: Any) -> Money:
        return Money(Decimal("0.001") * output["usage"]["tokens"], USD)  # 0.01 a call

    tool = Tool(tool_id="llm", fn=paid, price=per_token, price_estimate=Money("1", USD))
    system = make_system([tool], policy=Policy(batch_grace_s=0.0, max_spend=Money("2", USD)))
    for i in range(10):  # one at a time: each estimate is settled to 0.01 once answered
        assert system.proxy().execute("llm", {"i": i}).get(timeout=WAIT_S).execution == "live"
    assert system.stats()["spent"]["total"] == {USD: Money("0.10", USD)}
    # 1.90 left: three at once are each counted at 1 until paid, so one goes
    outcomes = _outcomes(system.proxy().execute_many("llm", [{"i": i} for i in range(10, 13)]))
    assert outcomes.count("live") == 1
    assert sum(isinstance(o, BudgetExceededError) for o in outcomes) == 2
    assert len(paid.inputs) == 11


def test_money_budget_of_a_provider_refuses_its_calls_alone(make_system: Any) -> None:
    cheap, dear = _Paid(), _Paid()
    tools = [
        Tool(tool_id="cheap", fn=cheap, price=Money("1", USD)),
        Tool(tool_id="dear", fn=dear, price=Money("1", USD)),
    ]
    policy = Policy(batch_grace_s=0.05, max_spend_by_provider={"dear": Money("1", USD)})
    system = make_system(tools, policy=policy)
    proxy = system.proxy()
    assert _outcomes(proxy.execute_many("cheap", [{"i": i} for i in range(3)])) == ["live"] * 3
    outcomes = _outcomes(proxy.execute_many("dear", [{"i": i} for i in range(3)]))
    assert outcomes.count("live") == 1
    assert "provider 'dear'" in str(next(o for o in outcomes if isinstance(o, BudgetExceededError)))
    assert len(dear.inputs) == 1


@pytest.mark.parametrize(
    ("tool", "policy", "match"),
    [
        (
            Tool(tool_id="llm", fn=_Paid(), price=lambda i, o: Money("1", USD)),
            Policy(max_spend=Money("5", USD)),
            "tool 'llm' is priced from its answer.*price_estimate",
        ),
        (
            Tool(tool_id="verify", fn=_Paid(), price=Money("1", "EUR")),
            Policy(max_spend=Money("5", USD)),
            "tool 'verify': its price is in EUR and its money budget in USD",
        ),
        (
            Tool(tool_id="verify", fn=_Paid(), price=Money("1", USD)),
            Policy(max_spend_by_provider={"nobody": Money("5", USD)}),
            "provider 'nobody', which no tool uses",
        ),
    ],
)
def test_money_budget_that_cannot_be_kept_is_refused_at_start(
    make_system: Any, tool: Tool, policy: Policy, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        make_system([tool], policy=policy)


def test_money_budget_must_be_money() -> None:
    with pytest.raises(ValueError, match=r"Policy\.max_spend must be a stores\.Money"):
        Policy(max_spend=25)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"max_spend_by_provider\['p'\] must be a stores.Money"):
        Policy(max_spend_by_provider={"p": "25USD"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at least 0"):
        Policy(max_spend=Money("-1", USD))
    with pytest.raises(ValueError, match=r"price_estimate must be a stores\.Money"):
        Tool(tool_id="t", fn=_Paid(), price=lambda i, o: Money("1", USD), price_estimate="1USD")  # type: ignore[arg-type]


def test_money_budget_counts_a_cost_in_another_currency_at_its_estimate(
    make_system: Any, caplog: pytest.LogCaptureFixture
) -> None:
    paid = _Paid()
    tool = Tool(
        tool_id="llm_eur", fn=paid, price=lambda i, o: Money("0.01", "EUR"), price_estimate=Money("1", USD)
    )
    system = make_system([tool], policy=Policy(batch_grace_s=0.0, max_spend=Money("2", USD)))
    with caplog.at_level("WARNING", logger="tooldispatch"):
        for i in range(2):
            assert system.proxy().execute("llm_eur", {"i": i}).get(timeout=WAIT_S).execution == "live"
    assert any("not in its money budget's currency (USD)" in r.getMessage() for r in caplog.records)
    with pytest.raises(BudgetExceededError):  # each counted at its 1 USD estimate
        system.proxy().execute("llm_eur", {"i": 2}).get(timeout=WAIT_S)
    assert len(paid.inputs) == 2


def test_money_budget_learns_from_an_estimate_set_too_low(make_system: Any) -> None:
    """A price function whose calls cost 1 against an estimate of 0.01: once one answer
    says so, later calls are counted at what it really cost, so many calls in flight pass
    the budget by at most those already out, not by every call of the run."""
    paid = _Paid()
    tool = Tool(tool_id="llm", fn=paid, price=lambda i, o: Money("1", USD), price_estimate=Money("0.01", USD))
    system = make_system([tool], policy=Policy(batch_grace_s=0.0, max_spend=Money("10", USD)))
    assert system.proxy().execute("llm", {"i": 0}).get(timeout=WAIT_S).execution == "live"  # learns
    outcomes = _outcomes(system.proxy().execute_many("llm", [{"i": i} for i in range(1, 60)]))
    assert outcomes.count("live") == 9  # 1 + 9 at 1 each: the budget, not 10 + 59 x 0.01
    assert system.stats()["spent"]["total"] == {USD: Money("10", USD)}
    assert len(paid.inputs) == 10
