"""What an answered call cost: a tool's price (a Money, or a function of the input and the
answer) and a batch's request price split over its members; a price that cannot be worked
out leaves the cost unknown and never the answer."""

from __future__ import annotations

import logging
import sys
from decimal import Decimal
from typing import Any

import pytest

from actors import BatchStrategy, Tool
from actors.worker.prices import member_costs
from stores.money import Money

USD = "USD"


def _fn(input: Any, ctx: Any) -> Any:
    return input


def _batch(request_price: Money | None = None) -> BatchStrategy:
    return BatchStrategy(batch_fn=_fn, max_batch_size=10, request_price=request_price)


def test_an_unpriced_tool_costs_nothing_known() -> None:
    assert member_costs(Tool(tool_id="t", fn=_fn), [1], [1], batched=False) == ()


def test_a_fixed_price_per_call() -> None:
    tool = Tool(tool_id="t", fn=_fn, price=Money("0.002", USD))
    assert member_costs(tool, [{"a": 1}], [{"ok": True}], batched=False) == (Money("0.002", USD),)


def test_a_price_from_the_answer() -> None:
    def per_token(input: Any, output: Any) -> Money:
        return Money(Decimal("0.000001") * output["usage"]["total_tokens"], USD)

    tool = Tool(tool_id="llm", fn=_fn, price=per_token)
    answer = {"text": "hi", "usage": {"total_tokens": 1500}}
    assert member_costs(tool, [{"prompt": "x"}], [answer], batched=False) == (Money("0.0015", USD),)


def test_a_batch_request_price_is_split_over_its_members_and_added_to_each_price() -> None:
    tool = Tool(tool_id="t", fn=_fn, price=Money("0.01", USD), batch=_batch(Money("1", USD)))
    costs = member_costs(tool, [1, 2, 3], ["a", "b", "c"], batched=True)
    assert len(costs) == 3
    assert sum((c.amount for c in costs if c is not None), Decimal(0)) == Decimal("1.03")
    assert all(c is not None and c.currency == USD for c in costs)


def test_a_failed_member_costs_its_share_of_the_request_alone() -> None:
    tool = Tool(tool_id="t", fn=_fn, price=Money("0.01", USD), batch=_batch(Money("0.5", USD)))
    costs = member_costs(tool, [1, 2], ["a", ValueError("no such address")], batched=True)
    assert costs == (Money("0.26", USD), Money("0.25", USD))


def _interrupt() -> Any:
    raise KeyboardInterrupt


def test_a_batch_tool_sent_alone_costs_its_price() -> None:
    tool = Tool(tool_id="t", fn=_fn, price=Money("0.01", USD), batch=_batch(Money("0.5", USD)))
    assert member_costs(tool, [1], ["a"], batched=False) == (Money("0.01", USD),)


@pytest.mark.parametrize(
    "price",
    [
        lambda i, o: 1 / 0,
        lambda i, o: 0.25,
        lambda i, o: None,
        lambda i, o: Money(1, "EUR"),
        lambda i, o: sys.exit(3),
        lambda i, o: _interrupt(),
    ],
    ids=["raises", "float", "none", "other-currency", "exits", "interrupted"],
)
def test_a_price_that_cannot_be_worked_out_leaves_the_cost_unknown(
    price: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tool = Tool(tool_id="priced", fn=_fn, price=price, batch=_batch(Money("1", USD)))
    with caplog.at_level(logging.DEBUG, logger="actors.worker.prices"):
        costs = member_costs(tool, [1, 2], ["a", "b"], batched=True)
    assert costs == (None, None)  # not its share alone: that would understate it
    assert "priced" in caplog.text and "cost is unknown" in caplog.text


@pytest.mark.parametrize("price", [0.25, "0.25 USD", 1])
def test_a_price_that_is_neither_money_nor_a_function_is_refused_at_once(price: Any) -> None:
    with pytest.raises(ValueError, match=r"Tool\.price"):
        Tool(tool_id="t", fn=_fn, price=price)
    with pytest.raises(ValueError, match="request_price"):
        BatchStrategy(batch_fn=_fn, max_batch_size=2, request_price=price)


def test_a_price_on_a_tool_without_receipts_is_refused() -> None:
    with pytest.raises(ValueError, match="durable=False"):
        Tool(tool_id="local", fn=_fn, durable=False, price=Money("7", USD))


def test_a_sum_past_the_bound_leaves_the_cost_unknown(caplog: pytest.LogCaptureFixture) -> None:
    big = Money("999999999999999", USD)
    tool = Tool(tool_id="huge", fn=_fn, price=big, batch=_batch(big))
    with caplog.at_level(logging.DEBUG, logger="actors.worker.prices"):
        assert member_costs(tool, [1], ["a"], batched=True) == (None,)
    assert "do not add up" in caplog.text
