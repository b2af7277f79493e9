"""Integrity of what flows through a call (issue 9): isolation, modes, budgets, uncertain
outcomes, purges seen by the memo, execution metadata. Real SQLite files; both runtimes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import (
    BudgetExceededError,
    InvalidInputError,
    Policy,
    ProviderError,
    Tool,
    ToolTimeoutError,
    UncertainOutcomeError,
)
from actors.tool import NOT_DONE, BatchStrategy
from stores import ReceiptStatus

WAIT_S = 15.0


def test_call_input_is_snapshot_at_execute(make_system: Any, recorder: Any) -> None:
    # a host reusing one dict within a batch window: each call runs on its own value
    def verify(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [{"email": item["email"]} for item in payload]

    tool = Tool(tool_id="verify", fn=lambda i, c: i, batch=BatchStrategy(batch_fn=verify, max_batch_size=10))
    system = make_system([tool], policy=Policy(batch_grace_s=0.2))
    payload: dict[str, Any] = {}
    futures = []
    for email in ("a@x.io", "b@x.io", "c@x.io"):
        payload["email"] = email
        futures.append(system.proxy().execute("verify", payload))
    values = [f.get(timeout=WAIT_S).value for f in futures]
    assert values == [{"email": "a@x.io"}, {"email": "b@x.io"}, {"email": "c@x.io"}]
    again = system.proxy().execute("verify", {"email": "a@x.io"}).get(timeout=WAIT_S)
    assert (again.execution, again.value) == ("cached", {"email": "a@x.io"})


def test_call_results_handed_out_are_never_shared(make_system: Any) -> None:
    tool = Tool(tool_id="t", fn=lambda i, c: {"tags": ["a"]})
    system = make_system([tool])
    first, follower = [system.proxy().execute("t", {"n": 1}) for _ in range(2)]
    a, b = first.get(timeout=WAIT_S), follower.get(timeout=WAIT_S)
    a.value["tags"].append("mutated by the first caller")
    assert b.value == {"tags": ["a"]}
    cached = system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S)
    assert cached.execution == "cached" and cached.value == {"tags": ["a"]}
    cached.value["tags"].clear()
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"tags": ["a"]}


def test_call_followers_are_in_flight_and_live_counts_executions(make_system: Any, recorder: Any) -> None:
    gate = threading.Event()

    def slow(i: Any, c: Any) -> Any:
        recorder.record("slow", i, c)
        gate.wait(WAIT_S)
        return {"ok": True}

    system = make_system([Tool(tool_id="t", fn=slow)])
    futures = [system.proxy().execute("t", {"n": 1}) for _ in range(3)]
    gate.set()
    kinds = sorted(f.get(timeout=WAIT_S).execution for f in futures)
    assert kinds == ["in_flight", "in_flight", "live"]
    assert recorder.count("slow") == 1
    assert system.stats()["live"] == 1


def test_call_force_refresh_never_takes_a_normal_call_in_flight(make_system: Any, recorder: Any) -> None:
    started, gate = threading.Event(), threading.Event()
    n = [0]

    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        n[0] += 1
        if n[0] == 1:
            started.set()
            gate.wait(WAIT_S)
        return {"run": n[0]}

    system = make_system([Tool(tool_id="t", fn=fn)])
    normal = system.proxy().execute("t", {"k": 1})
    assert started.wait(WAIT_S)
    forced = system.proxy().execute("t", {"k": 1}, force_refresh=True)
    gate.set()
    assert normal.get(timeout=WAIT_S).value == {"run": 1}
    refreshed = forced.get(timeout=WAIT_S)
    assert (refreshed.execution, refreshed.value) == ("live", {"run": 2})


@pytest.mark.parametrize("budget", ["provider_calls", "retries"])
def test_call_budget_refusal_is_not_recorded_as_a_failure(
    make_system: Any, read_receipts: Any, key_of: Any, budget: str
) -> None:
    def fn(i: Any, c: Any) -> Any:
        if budget == "retries" and c.attempt == 1:
            raise ConnectionResetError("connection reset by peer")  # retried in-call...
        return {"ok": i["n"]}

    tool = Tool(tool_id="t", fn=fn, retry_safe=True)
    policy = Policy(max_provider_calls=1) if budget == "provider_calls" else Policy(max_retries=0)
    system = make_system([tool], policy=policy)
    if budget == "provider_calls":
        assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"ok": 1}
    with pytest.raises(BudgetExceededError):  # ... but the retry budget is spent
        system.proxy().execute("t", {"n": 2}).get(timeout=WAIT_S)
    (receipt,) = read_receipts([key_of(tool, {"n": 2})])
    assert receipt is None or receipt.status is ReceiptStatus.PENDING  # a later run may pay


@pytest.mark.parametrize("ends", ["deadline", "cancel"])
@pytest.mark.waits
def test_call_a_retry_never_sent_gives_its_budget_charge_back(make_system: Any, ends: str) -> None:
    # the one retry the budget allows is charged while the first call backs off; that call
    # ends there (its deadline passes, or its caller cancels), so the retry never goes: the
    # charge comes back and the next call may still retry (it was refused as spent before)
    sent: list[tuple[int, int]] = []

    def fn(i: Any, c: Any) -> Any:
        sent.append((i["n"], c.attempt))
        if c.attempt == 1:
            raise ConnectionResetError("connection reset by peer")  # transient: retried in-call
        return {"ok": i["n"]}

    tool = Tool(tool_id="t", fn=fn, retry_safe=True)
    system = make_system([tool], policy=Policy(max_retries=1, retry_backoff_s=1.0))
    if ends == "deadline":
        first = system.proxy().execute("t", {"n": 1}, timeout_s=0.3)
        with pytest.raises(ConnectionResetError):
            first.get(timeout=WAIT_S)
    else:
        first = system.proxy().execute("t", {"n": 1})
        deadline = time.monotonic() + WAIT_S
        while system.stats().get("retries", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # charged: backing off
        assert first.cancel()
    second = system.proxy().execute("t", {"n": 2})
    assert second.get(timeout=WAIT_S).value == {"ok": 2}
    assert sent == [(1, 1), (2, 1), (2, 2)]


def test_call_batch_member_error_matched_by_id_fails_that_member_alone(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        out: list[Any] = []
        for item in payload:
            if item["id"] == 2:
                error = ProviderError("upstream hiccup", failure_kind=None)
                error.input_id = 2  # type: ignore[attr-defined]
                out.append(error)
            else:
                out.append({"id": item["id"], "ok": True})
        return out[::-1]  # answered in another order

    batch = BatchStrategy(
        batch_fn=batch_fn, max_batch_size=10, input_id=lambda i: i["id"], result_id=lambda r: r["id"]
    )
    tool = Tool(tool_id="t", fn=lambda i, c: i, batch=batch)
    system = make_system([tool], policy=Policy(batch_grace_s=0.1))
    futures = [system.proxy().execute("t", {"id": n}) for n in (1, 2, 3)]
    assert futures[0].get(timeout=WAIT_S).value == {"id": 1, "ok": True}
    with pytest.raises(ProviderError, match="hiccup"):
        futures[1].get(timeout=WAIT_S)
    assert futures[2].get(timeout=WAIT_S).value == {"id": 3, "ok": True}
    (bad,) = read_receipts([key_of(tool, {"id": 2})])
    assert bad is not None and bad.status is ReceiptStatus.FAILED  # never a cached no_result


def test_call_timeout_after_sending_of_a_tool_not_retry_safe_is_uncertain(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any
) -> None:
    def charge(i: Any, c: Any) -> Any:
        recorder.record("charge", i, c)
        raise ToolTimeoutError("read timed out after the request was sent")

    tool = Tool(tool_id="charge", fn=charge)  # not retry-safe
    system = make_system([tool])
    with pytest.raises(ToolTimeoutError):
        system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    (receipt,) = read_receipts([key_of(tool, {"card": 1})])
    assert receipt is not None and receipt.status.value == "uncertain"
    with pytest.raises(UncertainOutcomeError, match="receipts resolve"):
        system.proxy().execute("charge", {"card": 1}, retry_failed=True).get(timeout=WAIT_S)
    assert recorder.count("charge") == 1  # never re-run silently


@pytest.mark.parametrize("answer", ["done", "not-done"])
def test_call_uncertain_outcome_is_reconciled_by_the_tools_hook(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any, answer: str
) -> None:
    attempts = [0]
    keys: list[str] = []

    def charge(i: Any, c: Any) -> Any:
        recorder.record("charge", i, c)
        keys.append(c.idempotency_key)
        attempts[0] += 1
        if attempts[0] == 1:
            raise ToolTimeoutError("timed out after sending")
        return {"charged": True, "attempt": attempts[0]}

    def reconcile(i: Any, c: Any) -> Any:
        keys.append(c.idempotency_key)
        return {"charged": True, "attempt": "reconciled"} if answer == "done" else NOT_DONE

    tool = Tool(tool_id="charge", fn=charge, reconcile=reconcile)
    system = make_system([tool])
    with pytest.raises(ToolTimeoutError):
        system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    result = system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    assert len(set(keys)) == 1  # the hook (and a rerun) use the uncertain attempt's key
    if answer == "done":
        assert (result.execution, result.value) == ("cached", {"charged": True, "attempt": "reconciled"})
        assert recorder.count("charge") == 1
    else:
        assert (result.execution, result.value) == ("live", {"charged": True, "attempt": 2})
    (receipt,) = read_receipts([key_of(tool, {"card": 1})])
    assert receipt is not None and receipt.status is ReceiptStatus.COMPLETED


def test_call_memo_notices_a_purge_made_while_the_system_runs(
    make_system: Any, open_store: Any, recorder: Any
) -> None:
    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        return {"n": i["n"]}

    system = make_system([Tool(tool_id="t", fn=fn)])
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).execution == "live"
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).execution == "cached"
    assert open_store().purge(older_than_s=0.0) == 1  # another process purges
    deadline = time.monotonic() + WAIT_S
    while True:  # the memo is dropped within its poll interval; then the call runs again
        result = system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S)
        if result.execution == "live":
            break
        assert time.monotonic() < deadline, "the memo kept answering a purged receipt"
        threading.Event().wait(0.05)
    assert recorder.count("fn") == 2


def test_call_receipt_ops_budget_refuses_new_claims_never_a_paid_write(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    tool = Tool(tool_id="t", fn=lambda i, c: {"ok": i["n"]})
    # claim, mark running, complete; or two, when a slot was granted before the claim and
    # the claim wrote the receipt running (timing): the next call may then still fit
    system = make_system([tool], policy=Policy(max_receipt_ops=3))
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"ok": 1}
    refused = None
    for n in (2, 3):
        try:
            assert system.proxy().execute("t", {"n": n}).get(timeout=WAIT_S).value == {"ok": n}
        except BudgetExceededError as exc:
            assert "receipt_ops" in str(exc)
            refused = n
            break
    assert refused is not None, "the budget of 3 receipt ops let three calls through"
    receipts = read_receipts([key_of(tool, {"n": n}) for n in range(1, refused + 1)])
    assert all(r is not None and r.status is ReceiptStatus.COMPLETED for r in receipts[:-1])
    assert receipts[-1] is None  # refused before anything was claimed


def test_call_provider_calls_charged_for_a_call_never_sent_are_refunded() -> None:
    from actors.governor.decisions import Governor
    from actors.tool import Pacing

    gov = Governor(Policy(max_provider_calls=1), {"p": Pacing()})
    granted = gov.acquire("acme", "p", 1, "first", now=0.0)
    assert granted.grants == [("first", 1)]
    gov.release("acme", "p", count=1, successes=0, now=0.1, refunds=1)  # never sent
    again = gov.acquire("acme", "p", 1, "second", now=0.2)
    assert again.grants == [("second", 1)] and gov.spent["provider_calls"] == 1


@pytest.mark.parametrize(
    ("option", "value"),
    [("timeout_s", "5"), ("timeout_s", True), ("timeout_s", float("nan")), ("stale_after_s", -1)],
)
def test_call_a_bad_duration_option_fails_that_call_alone(make_system: Any, option: str, value: Any) -> None:
    from actors import InvalidInputError

    system = make_system([Tool(tool_id="t", fn=lambda i, c: i)])
    with pytest.raises(InvalidInputError, match=option):
        system.proxy().execute("t", {"n": 1}, **{option: value}).get(timeout=WAIT_S)
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"n": 1}


class _NoCopyFloat(float):
    """Keys as a number (RFC 8785 takes a float subclass) but cannot be copied."""

    def __deepcopy__(self, memo: Any) -> Any:
        raise RuntimeError("no deepcopy")


def _self_list() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _self_dict() -> Any:
    loop: dict[str, Any] = {}
    loop["a"] = loop
    return loop


@pytest.mark.parametrize(
    "bad",
    [_self_list, _self_dict, lambda: {"x": _NoCopyFloat(1.5)}],
    ids=["contains-itself-list", "contains-itself-dict", "cannot-be-copied"],
)
def test_call_an_input_that_cannot_be_used_fails_alone_with_invalid_input(make_system: Any, bad: Any) -> None:
    ran: list[Any] = []
    tool = Tool(tool_id="t", fn=lambda i, c: ran.append(i) or {"ok": i["i"]})
    system = make_system([tool])
    futures = system.proxy().execute_many("t", [{"i": 1}, bad(), {"i": 2}])  # never raises, never hangs
    with pytest.raises(InvalidInputError):
        futures[1].get(timeout=WAIT_S)
    assert [f.get(timeout=WAIT_S).value for f in (futures[0], futures[2])] == [{"ok": 1}, {"ok": 2}]
    with pytest.raises(InvalidInputError):
        system.proxy().execute("t", bad()).get(timeout=WAIT_S)
    assert sorted(r["i"] for r in ran) == [1, 2]
