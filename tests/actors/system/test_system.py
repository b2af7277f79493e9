"""System tests of :class:`actors.DispatchSystem` on real SQLite files (both runtimes).

Every test starts real systems (``make_system``) on a receipt file in ``tmp_path`` and
waits on futures and events with timeouts, never on a sleep. Provider calls are logged
by the thread-safe ``recorder``. Behaviour references: ``../shared/SEMANTICS.md`` and
issue 3 ("Tests").
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import (
    AuthScopeChangedError,
    BatchStrategy,
    BudgetExceededError,
    CallCancelledError,
    DispatchSystem,
    FailureKind,
    InvalidInputError,
    InvalidOutputError,
    Pacing,
    Policy,
    ProviderError,
    RecordedFailureError,
    RunInfo,
    SuspendedError,
    Tool,
    UnknownToolError,
)
from stores import ClaimDisposition, ReceiptStatus, SqliteReceiptStore

WAIT_S = 10.0
"""Longest a test waits for a future or an event (far above any expected time)."""


def wait_event(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_S), f"timed out waiting for {what}"


def outcome(future: Any) -> Any:
    """The future's result, or the exception it failed with."""
    try:
        return future.get(timeout=WAIT_S)
    except Exception as exc:
        return exc


def batch_tool(
    recorder: Any, batch_fn: Any, *, max_batch_size: int = 3, tool_id: str = "verify", **strategy: Any
) -> Tool:
    """A batchable tool whose single operation must never be called (it is recorded as "single")."""

    def single(input: Any, ctx: Any) -> Any:
        recorder.record("single", input, ctx)
        return {"single": input}

    return Tool(
        tool_id=tool_id,
        fn=single,
        batch=BatchStrategy(
            batch_fn=batch_fn, max_batch_size=max_batch_size, batch_operation="bulk_verify", **strategy
        ),
    )


# -- batching ---------------------------------------------------------------------------


def test_batch_seven_calls_over_three_keys_make_one_provider_call(make_system: Any, recorder: Any) -> None:
    started, release = threading.Event(), threading.Event()

    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        started.set()
        assert release.wait(WAIT_S)  # keep the batch in flight until every call is submitted
        return [{"double": item["x"] * 2} for item in payload]

    grace_s = 5.0
    system = make_system([batch_tool(recorder, batch_fn)], policy=Policy(batch_grace_s=grace_s))
    proxy = system.proxy()
    begin = time.monotonic()
    futures = [proxy.execute("verify", {"x": 1})]
    threading.Event().wait(0.02)  # the first call sits alone in its grace window for a moment
    futures += [proxy.execute("verify", {"x": x}) for x in (2, 3)]  # 3 unique keys: drains at once
    wait_event(started, "the batch call")
    assert time.monotonic() - begin < grace_s / 2, "the queue waited for the grace window, not max_batch_size"
    futures += [proxy.execute("verify", {"x": x}) for x in (1, 2, 3, 1)]  # attach to the running batch
    release.set()
    results = [f.get(timeout=WAIT_S) for f in futures]

    xs = [1, 2, 3, 1, 2, 3, 1]
    assert [r.value for r in results] == [{"double": 2 * x} for x in xs]
    assert [r.execution for r in results] == ["live"] * 3 + ["in_flight"] * 4
    assert recorder.count() == 1
    assert sorted(item["x"] for item in recorder.of("batch")[0].input) == [1, 2, 3]
    assert [r.receipt_key for r in results[3:]] == [results[x - 1].receipt_key for x in xs[3:]]
    assert len({r.receipt_key for r in results}) == 3
    stats = system.stats()
    assert stats["deduped"] == 4
    assert stats["provider_calls"] == 1 and stats["batches"] == 1 and stats["calls"] == 7


@pytest.mark.waits
def test_batch_grace_window_collects_calls_into_one_batch(make_system: Any, recorder: Any) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [{"ok": item["x"]} for item in payload]

    system = make_system(
        [batch_tool(recorder, batch_fn, max_batch_size=10)], policy=Policy(batch_grace_s=1.0)
    )
    futures = [system.proxy().execute("verify", {"x": 1})]
    threading.Event().wait(0.05)  # well inside the window
    futures.append(system.proxy().execute("verify", {"x": 2}))
    results = [f.get(timeout=WAIT_S) for f in futures]

    assert [r.value for r in results] == [{"ok": 1}, {"ok": 2}]
    assert recorder.count() == 1 and len(recorder.of("batch")[0].input) == 2


def test_batch_results_in_another_order_matched_by_id(make_system: Any, recorder: Any) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [{"id": item["id"], "score": item["id"] * 10} for item in reversed(payload)]

    tool = batch_tool(recorder, batch_fn, input_id=lambda inp: inp["id"], result_id=lambda item: item["id"])
    system = make_system([tool])
    futures = {i: system.proxy().execute("verify", {"id": i}) for i in (1, 2, 3)}
    results = {i: f.get(timeout=WAIT_S) for i, f in futures.items()}

    assert recorder.count("batch") == 1 and len(recorder.of("batch")[0].input) == 3
    assert {i: r.value for i, r in results.items()} == {i: {"id": i, "score": i * 10} for i in (1, 2, 3)}


def test_batch_member_exception_fails_only_that_member(make_system: Any, recorder: Any) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [ValueError(f"member {i['x']} rejected") if i["x"] == 2 else {"ok": i["x"]} for i in payload]

    tool = batch_tool(recorder, batch_fn)
    first = make_system([tool], run_id="r1")
    futures = {x: first.proxy().execute("verify", {"x": x}) for x in (1, 2, 3)}
    assert futures[1].get(timeout=WAIT_S).value == {"ok": 1}
    assert futures[3].get(timeout=WAIT_S).value == {"ok": 3}
    with pytest.raises(ValueError, match="member 2 rejected"):
        futures[2].get(timeout=WAIT_S)
    assert recorder.count() == 1
    first.stop()

    second = make_system([tool], run_id="r2")
    again = {x: second.proxy().execute("verify", {"x": x}) for x in (1, 3)}
    results = {x: f.get(timeout=WAIT_S) for x, f in again.items()}
    assert {x: (r.execution, r.value) for x, r in results.items()} == {
        1: ("cached", {"ok": 1}),
        3: ("cached", {"ok": 3}),
    }
    assert recorder.count() == 1


def test_batch_member_none_gives_no_result_status(make_system: Any, recorder: Any, key_of: Any) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [None if i["x"] == 2 else {"ok": i["x"]} for i in payload]

    tool = batch_tool(recorder, batch_fn)
    first = make_system([tool], run_id="r1")
    futures = {x: first.proxy().execute("verify", {"x": x}) for x in (1, 2, 3)}
    results = {x: f.get(timeout=WAIT_S) for x, f in futures.items()}
    assert {x: (r.status, r.value) for x, r in results.items()} == {
        1: ("ok", {"ok": 1}),
        2: ("no_result", None),
        3: ("ok", {"ok": 3}),
    }
    assert first.stats()["errors"] == 0
    first.stop()

    rerun = make_system([tool], run_id="r2").proxy().execute("verify", {"x": 2}).get(timeout=WAIT_S)
    assert (rerun.execution, rerun.status, rerun.value) == ("cached", "no_result", None)
    assert recorder.count() == 1


def test_batch_wrong_length_result_fails_every_member(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [{"ok": 1}, {"ok": 2}]

    tool = batch_tool(recorder, batch_fn)
    system = make_system([tool])
    inputs = [{"x": x} for x in (1, 2, 3)]
    futures = [system.proxy().execute("verify", i) for i in inputs]
    errors = [outcome(f) for f in futures]

    assert recorder.count() == 1
    for error in errors:
        assert isinstance(error, ProviderError), error
        assert "bulk_verify returned 2 results for 3 members" in str(error)
    system.stop()
    receipts = read_receipts([key_of(tool, i) for i in inputs])
    assert [r.status for r in receipts] == [ReceiptStatus.FAILED] * 3
    assert all("returned 2 results for 3 members" in r.error for r in receipts)


def test_completion_output_without_json_form_fails_that_call_alone(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("parse", input, ctx)
        return {"parsed": object()} if input["n"] == 1 else {"parsed": input["n"]}

    tool = Tool(tool_id="parse", fn=fn)
    system = make_system([tool])
    with pytest.raises(InvalidOutputError, match=r"builtins\.object"):
        system.proxy().execute("parse", {"n": 1}).get(timeout=WAIT_S)
    assert system.proxy().execute("parse", {"n": 2}).get(timeout=WAIT_S).value == {"parsed": 2}
    system.stop(timeout_s=WAIT_S)

    bad, good = read_receipts([key_of(tool, {"n": 1}), key_of(tool, {"n": 2})])
    assert bad.status is ReceiptStatus.FAILED and "builtins.object" in bad.error  # not left held
    assert good.status is ReceiptStatus.COMPLETED


@pytest.mark.parametrize("second_run_id", ["r1", "r2"], ids=["same-run", "new-run"])
def test_batch_whole_batch_500_fails_retryable_and_reruns(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any, second_run_id: str
) -> None:
    down = [True]

    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        if down[0]:
            raise ProviderError("500 internal server error", failure_kind=FailureKind.TRANSIENT)
        return [{"ok": i["x"]} for i in payload]

    tool = batch_tool(recorder, batch_fn)
    inputs = [{"x": x} for x in (1, 2, 3)]
    first = make_system([tool], run_id="r1")
    futures = [first.proxy().execute("verify", i) for i in inputs]
    errors = [outcome(f) for f in futures]
    assert all(isinstance(e, ProviderError) and "500" in str(e) for e in errors), errors
    first.stop()

    receipts = read_receipts([key_of(tool, i) for i in inputs])
    assert [r.status for r in receipts] == [ReceiptStatus.FAILED] * 3
    assert all(r.failure_kind is FailureKind.TRANSIENT and r.failure_kind.retryable for r in receipts)
    assert all(r.output is None for r in receipts)

    down[0] = False
    second = make_system([tool], run_id=second_run_id)
    futures = [second.proxy().execute("verify", i) for i in inputs]
    results = [f.get(timeout=WAIT_S) for f in futures]
    assert [(r.execution, r.value) for r in results] == [("live", {"ok": x}) for x in (1, 2, 3)]
    assert recorder.count("batch") == 2
    second.stop()
    assert [r.status for r in read_receipts([key_of(tool, i) for i in inputs])] == [
        ReceiptStatus.COMPLETED
    ] * 3


# -- recorded failures, reruns, refresh ---------------------------------------------------


def test_recorded_permanent_failure_rejects_without_provider_call(make_system: Any, recorder: Any) -> None:
    broken = [True]

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("lookup", input, ctx)
        if broken[0]:
            raise ProviderError("400 bad request", failure_kind=FailureKind.PERMANENT)
        return {"found": input["q"]}

    tool = Tool(tool_id="lookup", fn=fn)
    first = make_system([tool], run_id="r1")
    with pytest.raises(ProviderError, match="400 bad request"):
        first.proxy().execute("lookup", {"q": "a"}).get(timeout=WAIT_S)
    first.stop()

    broken[0] = False
    second = make_system([tool], run_id="r2")
    with pytest.raises(RecordedFailureError, match="400 bad request") as info:
        second.proxy().execute("lookup", {"q": "a"}).get(timeout=WAIT_S)
    assert info.value.failure_kind is FailureKind.PERMANENT
    assert recorder.count() == 1

    result = second.proxy().execute("lookup", {"q": "a"}, retry_failed=True).get(timeout=WAIT_S)
    assert (result.execution, result.value) == ("live", {"found": "a"})
    assert recorder.count() == 2


def _echo_tool(recorder: Any, **kwargs: Any) -> Tool:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("echo", input, ctx)
        return {"echo": input["n"]}

    return Tool(tool_id="echo", fn=fn, **kwargs)


def test_rerun_same_calls_all_cached_without_provider_calls(make_system: Any, recorder: Any) -> None:
    tool = _echo_tool(recorder)
    first = make_system([tool], run_id="r1")
    live = [first.proxy().execute("echo", {"n": n}).get(timeout=WAIT_S) for n in range(3)]
    assert [r.execution for r in live] == ["live"] * 3
    first.stop()

    second = make_system([tool], run_id="r2")
    again = [second.proxy().execute("echo", {"n": n}).get(timeout=WAIT_S) for n in range(3)]
    assert [(r.execution, r.value, r.receipt_key) for r in again] == [
        ("cached", r.value, r.receipt_key) for r in live
    ]
    assert recorder.count() == 3
    stats = second.stats()
    assert stats["cached"] == 3 and stats["provider_calls"] == 0


def test_force_refresh_runs_live_with_new_idempotency_key(make_system: Any, recorder: Any) -> None:
    tool = _echo_tool(recorder)
    first = make_system([tool], run_id="r1")
    assert first.proxy().execute("echo", {"n": 1}).get(timeout=WAIT_S).execution == "live"
    first.stop()

    second = make_system([tool], run_id="r2")
    assert second.proxy().execute("echo", {"n": 1}).get(timeout=WAIT_S).execution == "cached"
    refreshed = second.proxy().execute("echo", {"n": 1}, force_refresh=True).get(timeout=WAIT_S)
    assert (refreshed.execution, refreshed.value) == ("live", {"echo": 1})

    calls = recorder.of("echo")
    assert len(calls) == 2
    assert calls[0].ctx.receipt_key == calls[1].ctx.receipt_key == refreshed.receipt_key
    assert calls[0].ctx.idempotency_key != calls[1].ctx.idempotency_key


def test_in_call_retry_keeps_idempotency_key(make_system: Any, recorder: Any) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("flaky", input, ctx)
        if ctx.attempt == 1:
            raise ConnectionError("connection reset by peer")
        return {"ok": True}

    tool = Tool(tool_id="flaky", fn=fn, retry_safe=True)
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, retry_backoff_s=0.01))
    result = system.proxy().execute("flaky", {"n": 1}).get(timeout=WAIT_S)

    assert (result.execution, result.value) == ("live", {"ok": True})
    calls = recorder.of("flaky")
    assert [c.ctx.attempt for c in calls] == [1, 2]
    assert calls[0].ctx.idempotency_key == calls[1].ctx.idempotency_key
    assert system.stats()["retries"] == 1 and system.stats()["provider_calls"] == 1


# -- two systems on one file ----------------------------------------------------------------


class ClaimLog:
    """Collects (store name, disposition) of every claim two stores make."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: list[tuple[str, ClaimDisposition]] = []

    def watch(self, store: SqliteReceiptStore, name: str) -> SqliteReceiptStore:
        original = store.claim_many

        def claim_many(*args: Any, **kwargs: Any) -> Any:
            claims = original(*args, **kwargs)
            with self.cond:
                self.seen.extend((name, c.disposition) for c in claims)
                self.cond.notify_all()
            return claims

        store.claim_many = claim_many  # type: ignore[method-assign]
        return store

    def wait_for(self, predicate: Any) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.seen), WAIT_S), self.seen


def test_two_systems_one_file_same_key_one_provider_call(
    make_system: Any, open_store: Any, recorder: Any
) -> None:
    started, release = threading.Event(), threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("enrich", input, ctx)
        started.set()
        assert release.wait(WAIT_S)
        return {"company": input["domain"].upper()}

    tool = Tool(tool_id="enrich", fn=fn)
    log = ClaimLog()
    policy = Policy(batch_grace_s=0.05, receipt_poll_initial_s=0.005, receipt_poll_max_s=0.05)
    systems = {
        name: make_system([tool], run_id=name, policy=policy, store=log.watch(open_store(), name))
        for name in ("a", "b")
    }
    barrier = threading.Barrier(2)
    futures: dict[str, Any] = {}

    def submit(name: str) -> None:
        barrier.wait(WAIT_S)
        futures[name] = systems[name].proxy().execute("enrich", {"domain": "acme.io"})

    submitters = [threading.Thread(target=submit, args=(name,)) for name in systems]
    for thread in submitters:
        thread.start()
    for thread in submitters:
        thread.join(WAIT_S)
    wait_event(started, "the first provider call")

    def one_owner_one_waiter(seen: list[tuple[str, ClaimDisposition]]) -> bool:
        owners = {n for n, d in seen if d is ClaimDisposition.CLAIMED}
        waiters = {
            n for n, d in seen if d in (ClaimDisposition.RUNNING, ClaimDisposition.BLOCKED_ACTIVE_LEASE)
        }
        return len(owners) == 1 and len(waiters) == 1 and owners != waiters

    log.wait_for(one_owner_one_waiter)  # the second system is waiting on the live lease
    release.set()
    results = {name: f.get(timeout=WAIT_S) for name, f in futures.items()}

    assert recorder.count() == 1
    assert [r.value for r in results.values()] == [{"company": "ACME.IO"}] * 2
    waiter = next(
        n for n, d in log.seen if d in (ClaimDisposition.RUNNING, ClaimDisposition.BLOCKED_ACTIVE_LEASE)
    )
    owner = next(n for n in systems if n != waiter)
    assert (results[owner].execution, results[waiter].execution) == ("live", "in_flight")
    assert results[owner].receipt_key == results[waiter].receipt_key


# -- errors on one future alone ---------------------------------------------------------------


def test_execute_bad_calls_fail_alone_while_valid_call_succeeds(make_system: Any, recorder: Any) -> None:
    started, release = threading.Event(), threading.Event()

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("echo", input, ctx)
        started.set()
        assert release.wait(WAIT_S)
        return {"echo": input["n"]}

    system = make_system([Tool(tool_id="echo", fn=fn)])
    proxy = system.proxy()
    valid = proxy.execute("echo", {"n": 1})
    wait_event(started, "the valid call to start")
    unknown = proxy.execute("no_such_tool", {"n": 1})
    bad_inputs = [{"n": float("nan")}, {"n": b"raw bytes"}, {"n": {1, 2}}]
    invalid = [proxy.execute("echo", bad) for bad in bad_inputs]

    with pytest.raises(UnknownToolError, match="no_such_tool"):
        unknown.get(timeout=WAIT_S)
    for future in invalid:
        with pytest.raises(InvalidInputError):
            future.get(timeout=WAIT_S)
    release.set()
    assert valid.get(timeout=WAIT_S).value == {"echo": 1}
    assert recorder.count() == 1


# -- credential change ------------------------------------------------------------------------


def test_credential_change_requeues_once_with_new_key(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    digest = ["creds-v1"]

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("crm", input, ctx)
        if digest[0] == "creds-v1":
            digest[0] = "creds-v2"  # the host rotated the credentials
            raise AuthScopeChangedError("token scope changed")
        return {"owner": input["id"], "digest": ctx.credential_scope_digest}

    tool = Tool(tool_id="crm", fn=fn, credentials=lambda: digest[0])
    system = make_system([tool])
    result = system.proxy().execute("crm", {"id": 7}).get(timeout=WAIT_S)

    assert (result.execution, result.value) == ("live", {"owner": 7, "digest": "creds-v2"})
    old_key, new_key = key_of(tool, {"id": 7}, digest="creds-v1"), key_of(tool, {"id": 7}, digest="creds-v2")
    assert old_key != new_key and result.receipt_key == new_key
    assert [c.ctx.receipt_key for c in recorder.of("crm")] == [old_key, new_key]
    assert system.stats()["requeued"] == 1
    system.stop()
    old, new = read_receipts([old_key, new_key])
    assert old.status is ReceiptStatus.PENDING and new.status is ReceiptStatus.COMPLETED


@pytest.mark.parametrize("second_s", [0.3, 3.0])
@pytest.mark.waits
def test_a_call_queued_again_after_a_credentials_change_keeps_only_its_time_left(
    make_system: Any, recorder: Any, second_s: float
) -> None:
    """The first request went out (0.6 s), then the credentials changed: the call queued
    again under its new key gets only what is left of its timeout_s, counted from the
    first send (before: a whole new timeout, so a caller waited up to twice its own)."""
    from actors import ToolTimeoutError

    digest = ["creds-v1"]

    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("crm", input, ctx)
        if digest[0] == "creds-v1":
            time.sleep(0.6)
            digest[0] = "creds-v2"
            raise AuthScopeChangedError("401: token scope changed")
        time.sleep(second_s)
        return {"owner": input["id"]}

    system = make_system([Tool(tool_id="crm", fn=fn, credentials=lambda: digest[0])])
    start = time.monotonic()
    future = system.proxy().execute("crm", {"id": 7}, timeout_s=1.2)
    if second_s < 0.6:
        assert future.get(timeout=WAIT_S).value == {"owner": 7}
    else:
        with pytest.raises(ToolTimeoutError):
            future.get(timeout=WAIT_S)
    waited = time.monotonic() - start
    assert waited < 1.2 + 0.4, f"the caller waited {waited:.2f} s on a 1.2 s timeout"
    first, second = (c.ctx.timeout_s for c in recorder.of("crm"))
    assert first == pytest.approx(1.2) and second < 0.7  # the second send has what was left


def test_credential_change_without_new_digest_fails_at_once(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("crm", input, ctx)
        raise AuthScopeChangedError("token scope changed")

    tool = Tool(tool_id="crm", fn=fn, credentials=lambda: "creds-v1")
    lease_ttl_s = 30.0
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, lease_ttl_s=lease_ttl_s))
    start = time.monotonic()
    with pytest.raises(AuthScopeChangedError, match="did not"):
        system.proxy().execute("crm", {"id": 7}).get(timeout=WAIT_S)

    assert time.monotonic() - start < lease_ttl_s / 6  # never waited on its own receipt
    assert recorder.count() == 1
    assert system.stats()["requeued"] == 0
    system.stop()
    (receipt,) = read_receipts([key_of(tool, {"id": 7}, digest="creds-v1")])
    assert receipt.status is ReceiptStatus.PENDING


# -- suspension and budgets --------------------------------------------------------------------


def test_suspension_releases_receipt_to_pending(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record("score", input, ctx)
        raise SuspendedError("the run was paused by the host")

    tool = Tool(tool_id="score", fn=fn)
    system = make_system([tool])
    with pytest.raises(SuspendedError, match="paused"):
        system.proxy().execute("score", {"lead": 1}).get(timeout=WAIT_S)
    system.stop()

    (receipt,) = read_receipts([key_of(tool, {"lead": 1})])
    assert receipt is not None
    assert receipt.status is ReceiptStatus.PENDING and receipt.error is None and receipt.lease_id is None


def test_budget_max_provider_calls_refuses_and_releases(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    tool = _echo_tool(recorder)
    system = make_system([tool], policy=Policy(batch_grace_s=0.05, max_provider_calls=2))
    inputs = [{"n": n} for n in range(3)]
    outcomes = [outcome(system.proxy().execute("echo", i)) for i in inputs]

    refused = [i for i, o in zip(inputs, outcomes, strict=True) if isinstance(o, BudgetExceededError)]
    served = [i for i, o in zip(inputs, outcomes, strict=True) if not isinstance(o, Exception)]
    assert len(refused) == 1 and len(served) == 2, outcomes
    assert recorder.count() == 2
    system.stop()
    statuses = [r.status for r in read_receipts([key_of(tool, i) for i in refused + served])]
    assert statuses == [ReceiptStatus.PENDING, ReceiptStatus.COMPLETED, ReceiptStatus.COMPLETED]


# -- stopping -------------------------------------------------------------------------------------


def test_stop_cancels_queued_calls_and_finishes_running_ones(
    make_system: Any, recorder: Any, db_path: Path, read_receipts: Any, key_of: Any
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(input: Any, ctx: Any) -> Any:
        recorder.record("slow", input, ctx)
        started.set()
        assert release.wait(WAIT_S)
        return {"done": input["n"]}

    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        recorder.record("batch", payload, ctx)
        return [{"ok": True} for _ in payload]

    slow_tool = Tool(tool_id="slow", fn=slow)
    tools = [slow_tool, batch_tool(recorder, batch_fn, max_batch_size=10)]
    system = make_system(tools, policy=Policy(batch_grace_s=30.0))
    running = system.proxy().execute("slow", {"n": 1})
    wait_event(started, "the slow call to start")
    queued = [system.proxy().execute("verify", {"x": x}) for x in (1, 2)]  # in the 30 s grace window

    stopper = threading.Thread(target=system.stop)
    stopper.start()
    for future in queued:
        with pytest.raises(CallCancelledError):
            future.get(timeout=WAIT_S)
    stopper.join(0.2)
    assert stopper.is_alive(), "stop() returned while a provider call was still running"
    release.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()

    result = running.get(timeout=0)
    assert (result.execution, result.value) == ("live", {"done": 1})
    (receipt,) = read_receipts([key_of(slow_tool, {"n": 1})])
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"done": 1}
    with sqlite3.connect(db_path) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM receipts GROUP BY status").fetchall())
    assert statuses == {"completed": 1}
    assert recorder.count("batch") == 0
    with pytest.raises(CallCancelledError):
        system.proxy().execute("slow", {"n": 2}).get(timeout=WAIT_S)


def test_stats_has_the_same_keys_on_a_rerun(make_system: Any) -> None:
    tool = Tool(tool_id="t", fn=lambda i, c: i)
    first = make_system([tool])
    first.proxy().execute("t", {"x": 1}).get(timeout=15)
    again = make_system([tool], run_id="r2")
    assert again.proxy().execute("t", {"x": 1}).get(timeout=15).execution == "cached"
    fresh, rerun = first.stats(), again.stats()
    assert set(rerun) == set(fresh)  # code reading stats()["requests"] works on a rerun too
    assert (fresh["requests"], rerun["requests"]) == (1, 0)
    assert (fresh["receipts_created"], rerun["receipts_created"]) == (1, 0)


def test_tools_of_one_provider_with_other_pacings_are_refused_not_silently_replaced(tmp_path: Path) -> None:
    """A provider has one set of limits: two tools giving it different pacings is a
    mistake said at start (the last tool's used to replace the others' silently, so a
    stated rate could vanish); a tool left at the default takes the other's."""
    from actors.system import provider_pacings

    paced = Pacing(rps=2.0)
    parent = Tool(tool_id="parent", fn=lambda i, c: i, provider="P", pacing=paced)
    child = Tool(tool_id="child", fn=lambda i, c: i, provider="P")
    assert provider_pacings([parent, child]) == provider_pacings([child, parent]) == {"P": paced}
    other = Tool(tool_id="other", fn=lambda i, c: i, provider="P", pacing=Pacing(rps=5.0))
    store = SqliteReceiptStore(tmp_path / "r.db")
    try:
        with pytest.raises(ValueError, match="different pacings"):
            DispatchSystem.start(
                tools=[parent, child, other], store=store, run=RunInfo(run_id="r", org_id="o", scope="s")
            )
    finally:
        store.close()


def test_an_http_tool_left_at_its_default_takes_the_pacing_another_tool_of_its_host_states() -> None:
    from actors.http import http_tool
    from actors.system import provider_pacings

    stated = http_tool("single", "http://127.0.0.1:9/one", pacing=Pacing(rps=5.0))
    default = http_tool("other", "http://127.0.0.1:9/two")
    plain = Tool(tool_id="plain", fn=lambda i, c: i, provider="127.0.0.1")
    assert provider_pacings([stated, default, plain]) == {"127.0.0.1": Pacing(rps=5.0)}
    assert provider_pacings([plain, default]) == {"127.0.0.1": default.pacing}  # the slow start
