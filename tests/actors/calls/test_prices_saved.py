"""What calls answered from receipts saved: each ``cached`` answer counts what its receipt
cost when it was paid (``Receipt.cost``), on every path a cached answer takes: the store's
plain read of a cold rerun, the memo on a caller's thread, and a claim that finds the
receipt completed. Real SQLite files."""

from __future__ import annotations

import threading
from typing import Any

from actors import Policy, Tool
from stores.money import Money

from ..conftest import WAIT_S, until

USD = "USD"
PAID = Money("0.002", USD)


def _echo(input: Any, ctx: Any) -> Any:
    return {"echo": input["i"]}


def _paid(make_system: Any, tool: Tool, inputs: list[Any]) -> None:
    """A first run pays for ``inputs`` at ``tool``'s price."""
    system = make_system([tool], run_id="paid")
    results = [f.get(timeout=WAIT_S) for f in system.proxy().execute_many(tool.tool_id, inputs)]
    assert [r.execution for r in results] == ["live"] * len(inputs)
    system.stop(timeout_s=WAIT_S)


def _executions(system: Any, tool_id: str, inputs: list[Any], **options: Any) -> list[str]:
    futures = system.proxy().execute_many(tool_id, inputs, **options)
    return [f.get(timeout=WAIT_S).execution for f in futures]


def test_a_cold_rerun_saves_what_its_receipts_cost_when_paid(make_system: Any) -> None:
    inputs = [{"i": i} for i in range(5)]
    _paid(make_system, Tool(tool_id="verify", fn=_echo, price=PAID), inputs)
    # the price has gone up since: what was saved is what the receipts cost when paid
    rerun = make_system([Tool(tool_id="verify", fn=_echo, price=Money("0.005", USD))], run_id="rerun")
    assert _executions(rerun, "verify", inputs) == ["cached"] * 5
    stats = rerun.stats()
    assert stats["saved"] == {"total": {USD: PAID * 5}, "tools": {"verify": {USD: PAID * 5}}}
    assert stats["spent"]["total"] == {}


def test_answers_from_the_memo_save_what_the_call_cost(make_system: Any) -> None:
    tool = Tool(tool_id="verify", fn=_echo, price=PAID)
    inputs = [{"i": i} for i in range(3)]
    system = make_system([tool])
    assert _executions(system, "verify", inputs) == ["live"] * 3
    assert system.stats()["saved"]["total"] == {}
    assert _executions(system, "verify", inputs) == ["cached"] * 3  # the memo, on this thread
    # retry_failed is not answered by the memo: the store's plain read answers it
    assert _executions(system, "verify", inputs, retry_failed=True) == ["cached"] * 3
    assert system.stats()["saved"]["total"] == {USD: PAID * 6}
    assert system.stats()["spent"]["total"] == {USD: PAID * 3}


def test_a_claim_that_finds_the_receipt_completed_saves_its_cost(make_system: Any) -> None:
    inputs = [{"i": i} for i in range(4)]
    tool = Tool(tool_id="verify", fn=_echo, price=PAID)
    _paid(make_system, tool, inputs)
    # a receipt-op budget: no plain read, every call is claimed by the store actor
    rerun = make_system([tool], run_id="rerun", policy=Policy(max_receipt_ops=1000, memo_max_bytes=0))
    assert _executions(rerun, "verify", inputs) == ["cached"] * 4
    assert rerun.stats()["saved"]["total"] == {USD: PAID * 4}


def test_receipts_paid_before_they_kept_a_price_save_nothing(make_system: Any) -> None:
    inputs = [{"i": i} for i in range(3)]
    _paid(make_system, Tool(tool_id="verify", fn=_echo), inputs)  # unpriced then
    rerun = make_system([Tool(tool_id="verify", fn=_echo, price=PAID)], run_id="rerun")
    assert _executions(rerun, "verify", inputs) == ["cached"] * 3
    assert rerun.stats()["saved"]["total"] == {}


def test_each_currency_is_saved_apart(make_system: Any) -> None:
    usd = Tool(tool_id="us", fn=_echo, price=PAID)
    eur = Tool(tool_id="eu", fn=_echo, price=Money("0.01", "EUR"))
    inputs = [{"i": i} for i in range(2)]
    first = make_system([usd, eur], run_id="paid")
    for tool_id in ("us", "eu"):
        assert _executions(first, tool_id, inputs) == ["live"] * 2
    first.stop(timeout_s=WAIT_S)
    rerun = make_system([usd, eur], run_id="rerun")
    for tool_id in ("us", "eu"):
        assert _executions(rerun, tool_id, inputs) == ["cached"] * 2
    saved = rerun.stats()["saved"]
    assert saved["total"] == {USD: PAID * 2, "EUR": Money("0.02", "EUR")}
    assert saved["tools"] == {"us": {USD: PAID * 2}, "eu": {"EUR": Money("0.02", "EUR")}}


def test_a_call_that_waited_for_another_runs_execution_saves_what_that_run_paid(make_system: Any) -> None:
    gate = threading.Event()

    def slow(input: Any, ctx: Any) -> Any:
        gate.wait(WAIT_S)
        return {"echo": input["i"]}

    tool = Tool(tool_id="verify", fn=slow, price=PAID)
    payer, waiter = make_system([tool], run_id="payer"), make_system([tool], run_id="waiter")
    paying = payer.proxy().execute("verify", {"i": 1})
    until(lambda: payer.stats()["tools"].get("verify", {}).get("requests", 0) == 1, "the payer's call sent")
    waiting = waiter.proxy().execute("verify", {"i": 1})
    until(lambda: waiter.stats()["owner_waits"] == 1, "the waiter waiting on the payer's receipt")
    gate.set()
    assert paying.get(timeout=WAIT_S).execution == "live"
    assert waiting.get(timeout=WAIT_S).execution == "in_flight"
    assert payer.stats()["spent"]["total"] == {USD: PAID} and payer.stats()["saved"]["total"] == {}
    assert waiter.stats()["saved"]["total"] == {USD: PAID} and waiter.stats()["spent"]["total"] == {}


def test_calls_joined_to_this_systems_own_execution_save_nothing(make_system: Any) -> None:
    gate = threading.Event()

    def slow(input: Any, ctx: Any) -> Any:
        gate.wait(WAIT_S)
        return {"echo": input["i"]}

    system = make_system([Tool(tool_id="verify", fn=slow, price=PAID)])
    first = system.proxy().execute("verify", {"i": 1})
    until(lambda: system.stats()["tools"].get("verify", {}).get("requests", 0) == 1, "the call sent")
    joined = system.proxy().execute("verify", {"i": 1})
    gate.set()
    assert {first.get(timeout=WAIT_S).execution, joined.get(timeout=WAIT_S).execution} == {
        "live",
        "in_flight",
    }
    assert system.stats()["saved"]["total"] == {} and system.stats()["spent"]["total"] == {USD: PAID}
