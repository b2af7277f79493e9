"""A forced refresh or a retry of a failure waits behind a normal call of the same input
that is still running (it never takes that call's execution): at most its own
``timeout_s``, as any wait. Before, it had no timer: it waited for the whole running call
(3 s on a 0.3 s timeout) and was then sent anyway. Real systems on SQLite files, both
runtimes."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from actors import Policy, ProviderError, ReceiptWaitTimeoutError, RecordedFailureError, Tool
from stores import FailureKind, SqliteReceiptStore

WAIT_S = 15.0


def _slow_tool(recorder: Any, started: threading.Event) -> Tool:
    def slow(i: Any, ctx: Any) -> Any:
        recorder.record("slow", i, ctx)
        started.set()
        time.sleep(1.5)
        return {"v": i}

    return Tool(tool_id="t", fn=slow)


@pytest.mark.parametrize("mode", ["force_refresh", "retry_failed"])
@pytest.mark.waits
def test_a_call_held_behind_a_running_call_times_out_at_its_own_timeout(
    make_system: Any, recorder: Any, mode: str
) -> None:
    started = threading.Event()
    system = make_system([_slow_tool(recorder, started)], policy=Policy(batch_grace_s=0.02))
    proxy = system.proxy()
    first = proxy.execute("t", {"k": 1}, timeout_s=10)
    assert started.wait(WAIT_S)
    start = time.monotonic()
    held = proxy.execute("t", {"k": 1}, timeout_s=0.3, **{mode: True})
    with pytest.raises(ReceiptWaitTimeoutError, match=r"timeout_s \(0\.3 s\)"):
        held.get(timeout=WAIT_S)
    waited = time.monotonic() - start
    assert waited < 0.9, f"the held {mode} call waited {waited:.2f} s on a 0.3 s timeout"
    assert first.get(timeout=WAIT_S).execution == "live"
    time.sleep(0.3)
    assert recorder.count("slow") == 1  # the call that gave up was never sent


@pytest.mark.waits
def test_a_patient_refresh_held_behind_a_running_call_runs_after_it(make_system: Any, recorder: Any) -> None:
    started = threading.Event()
    system = make_system([_slow_tool(recorder, started)], policy=Policy(batch_grace_s=0.02))
    proxy = system.proxy()
    first = proxy.execute("t", {"k": 2}, timeout_s=10)
    assert started.wait(WAIT_S)
    impatient = proxy.execute("t", {"k": 2}, timeout_s=0.2, force_refresh=True)
    patient = proxy.execute("t", {"k": 2}, timeout_s=10, force_refresh=True)
    with pytest.raises(ReceiptWaitTimeoutError):
        impatient.get(timeout=WAIT_S)
    assert first.get(timeout=WAIT_S).execution == "live"
    assert patient.get(timeout=WAIT_S).execution == "live"
    assert recorder.count("slow") == 2


def test_when_the_first_caller_of_a_queued_input_leaves_the_next_owns_its_execution(
    make_system: Any, recorder: Any
) -> None:
    """The owner of a call still in the grace window is cancelled: the next caller of that
    input owns the execution (``live``), not ``in_flight`` of an execution nobody owned."""
    from actors import BatchStrategy

    def batch_fn(payload: Any, ctx: Any) -> Any:
        recorder.record("batch", payload, ctx)
        return [{"v": i} for i in payload]

    def one(i: Any, ctx: Any) -> Any:
        recorder.record("one", i, ctx)
        return {"v": i}

    tool = Tool(tool_id="b", fn=one, batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=10))
    system = make_system([tool], policy=Policy(batch_grace_s=0.3))
    proxy = system.proxy()
    owner = proxy.execute("b", {"k": 3})
    follower = proxy.execute("b", {"k": 3})
    assert owner.cancel()
    result = follower.get(timeout=WAIT_S)
    assert (result.value, result.execution) == ({"v": {"k": 3}}, "live")
    assert recorder.count("batch") + recorder.count("one") == 1


@pytest.mark.waits
def test_calls_held_behind_a_running_call_never_stretch_its_deadline(make_system: Any) -> None:
    """Two forced refreshes wait behind a normal call whose caller gave up at 0.3 s. The
    normal call's retries stop at its own deadline (before: the held callers' timeouts
    stretched it, it kept paying for retries, and the refreshes never ran)."""
    from actors import ToolTimeoutError

    attempts: list[str] = []  # the idempotency key of each attempt: one per generation

    def flaky(i: Any, ctx: Any) -> Any:
        attempts.append(ctx.idempotency_key)
        time.sleep(0.4)
        raise ConnectionError("reset")

    tool = Tool(tool_id="t", fn=flaky, retry_safe=True)
    system = make_system([tool], policy=Policy(batch_grace_s=0.01, retry_attempts=5, retry_backoff_s=0.05))
    proxy = system.proxy()
    normal = proxy.execute("t", {"k": 1}, timeout_s=0.3)
    time.sleep(0.1)
    held = [proxy.execute("t", {"k": 1}, timeout_s=2.5, force_refresh=True) for _ in range(2)]
    with pytest.raises(ToolTimeoutError):
        normal.get(timeout=WAIT_S)
    for future in held:  # the refresh ran: the provider's error, or its own timeout
        with pytest.raises((ConnectionError, ToolTimeoutError)):
            future.get(timeout=WAIT_S)
    first = attempts[0]
    assert attempts.count(first) == 1, f"the normal call went on retrying: {attempts}"
    assert len(set(attempts)) == 2  # the refresh (a new generation) ran


class _SlowClaims(SqliteReceiptStore):
    """Claims that take a while (a busy store): a call made meanwhile finds the first
    call's claim still out."""

    claim_s = 0.4
    claiming = threading.Event()

    def claim_many(self, *args: Any, **kwargs: Any) -> Any:
        self.claiming.set()
        time.sleep(self.claim_s)
        return super().claim_many(*args, **kwargs)

    def read_reusable(self, *args: Any, **kwargs: Any) -> Any:
        """Finds nothing (as when the receipt settles between the caller's read and its
        claim): every call here goes to its claim."""
        return {}


@pytest.mark.waits
@pytest.mark.parametrize("earlier", ["completed", "failed"])
def test_a_refresh_held_behind_a_claim_that_settles_at_once_is_sent_after_it(
    make_system: Any, recorder: Any, db_path: Any, earlier: str
) -> None:
    """The first call's claim finds the receipt settled (reused, or a recorded failure), so
    its group leaves straight from the claim, never running: the forced refresh held
    behind it still goes (it waited, unanswered, past its own timeout, until a stop)."""

    def fn(i: Any, ctx: Any) -> Any:
        recorder.record("fn", i, ctx)
        if earlier == "failed" and recorder.count("fn") == 1:
            raise ProviderError("no such input", failure_kind=FailureKind.PERMANENT)
        return {"v": i["k"]}

    tool = Tool(tool_id="t", fn=fn)
    first_run = make_system([tool], run_id="first")
    with contextlib.suppress(ProviderError):
        first_run.proxy().execute("t", {"k": 3}).get(timeout=WAIT_S)
    first_run.stop()
    store = _SlowClaims(db_path)
    store.claiming = threading.Event()
    try:
        system = make_system([tool], run_id="second", policy=Policy(batch_grace_s=0.0), store=store)
        proxy = system.proxy()
        normal = proxy.execute("t", {"k": 3})
        assert store.claiming.wait(WAIT_S)  # its claim is out
        refresh = proxy.execute("t", {"k": 3}, force_refresh=True, timeout_s=5.0)
        if earlier == "completed":
            assert normal.get(timeout=WAIT_S).execution == "cached"
        else:
            with pytest.raises(RecordedFailureError):
                normal.get(timeout=WAIT_S)
        assert refresh.get(timeout=WAIT_S).execution == "live"
        assert recorder.count("fn") == 2  # the first run's call, and the refresh
    finally:
        system.stop()
        store.close()
