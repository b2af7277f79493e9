"""A priced tool's receipts keep what each answer cost when it was paid, and the system
counts what it spent; a rerun answered from receipts spends nothing; a price that cannot
be worked out loses no answer. Real SQLite files."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

from actors import BatchStrategy, Policy, Tool
from stores.money import Money

from ..conftest import WAIT_S

USD = "USD"


def _echo(input: Any, ctx: Any) -> Any:
    return {"echo": input["i"], "usage": {"tokens": 10 * (input["i"] + 1)}}


def test_each_receipt_keeps_its_price_and_the_run_counts_what_it_spent(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    tool = Tool(tool_id="verify", fn=_echo, price=Money("0.002", USD))
    inputs = [{"i": i} for i in range(5)]
    system = make_system([tool])
    results = [f.get(timeout=WAIT_S) for f in system.proxy().execute_many("verify", inputs)]
    assert [r.execution for r in results] == ["live"] * 5
    spent = system.stats()["spent"]
    assert spent["total"] == {USD: Money("0.010", USD)}
    assert spent["tools"] == {"verify": {USD: Money("0.010", USD)}}
    receipts = read_receipts([key_of(tool, i) for i in inputs])
    assert [r.cost for r in receipts] == [Money("0.002", USD)] * 5
    system.stop(timeout_s=WAIT_S)

    again = make_system([tool], run_id="r2")
    results = [f.get(timeout=WAIT_S) for f in again.proxy().execute_many("verify", inputs)]
    assert [r.execution for r in results] == ["cached"] * 5
    assert again.stats()["spent"]["total"] == {}  # a rerun pays nothing


def test_a_price_from_the_answer_is_kept_per_call(make_system: Any, read_receipts: Any, key_of: Any) -> None:
    def per_token(input: Any, output: Any) -> Money:
        return Money(Decimal("0.0001") * output["usage"]["tokens"], USD)

    tool = Tool(tool_id="llm", fn=_echo, price=per_token)
    inputs = [{"i": i} for i in range(3)]
    system = make_system([tool])
    [f.get(timeout=WAIT_S) for f in system.proxy().execute_many("llm", inputs)]
    receipts = read_receipts([key_of(tool, i) for i in inputs])
    assert [r.cost for r in receipts] == [Money("0.001", USD), Money("0.002", USD), Money("0.003", USD)]
    assert system.stats()["spent"]["total"] == {USD: Money("0.006", USD)}


def test_a_batch_request_price_is_shared_by_its_members(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    gate = threading.Event()
    sent: list[int] = []

    def batch_fn(payload: Any, ctx: Any) -> Any:
        gate.wait(WAIT_S)
        sent.append(len(payload))
        return [{"echo": p["i"]} for p in payload]

    batch = BatchStrategy(batch_fn=batch_fn, max_batch_size=10, request_price=Money("1", USD))
    tool = Tool(tool_id="enrich", fn=_echo, batch=batch, price=Money("0.01", USD))
    inputs = [{"i": i} for i in range(4)]
    system = make_system([tool], policy=Policy(batch_grace_s=0.2))
    futures = system.proxy().execute_many("enrich", inputs)
    gate.set()
    [f.get(timeout=WAIT_S) for f in futures]
    assert sent == [4]  # one request
    receipts = read_receipts([key_of(tool, i) for i in inputs])
    assert sum((r.cost.amount for r in receipts), Decimal(0)) == Decimal("1.04")
    assert system.stats()["spent"]["total"] == {USD: Money("1.04", USD)}


def test_a_price_that_raises_keeps_the_answer_and_leaves_its_cost_unknown(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    def broken(input: Any, output: Any) -> Money:
        raise KeyError("usage")

    tool = Tool(tool_id="llm", fn=_echo, price=broken)
    system = make_system([tool])
    result = system.proxy().execute("llm", {"i": 1}).get(timeout=WAIT_S)
    assert result.value["echo"] == 1 and result.execution == "live"
    (receipt,) = read_receipts([key_of(tool, {"i": 1})])
    assert receipt.output == result.value and receipt.cost is None
    assert system.stats()["spent"]["total"] == {}


def test_spend_past_what_a_sum_holds_loses_no_answer(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    big = Money("999999999999999", USD)
    tool = Tool(tool_id="dear", fn=_echo, price=big)
    inputs = [{"i": i} for i in range(3)]
    system = make_system([tool])
    results = [f.get(timeout=WAIT_S) for f in system.proxy().execute_many("dear", inputs)]
    assert [r.execution for r in results] == ["live"] * 3
    assert [r.cost for r in read_receipts([key_of(tool, i) for i in inputs])] == [big] * 3
    assert system.stats()["spent"]["total"] == {USD: big}  # the sums past the bound are left out
