"""A tool's ``reconcile`` hook (asked about an uncertain receipt) is held to its callers'
timeouts as a provider call is: a slow hook no longer keeps a caller waiting past its own
``timeout_s`` (callers that join meanwhile included); its late answer is still stored for
the next caller, and a late ``NOT_DONE`` with no caller left calls no provider. Real
systems on SQLite files, both runtimes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import Tool, ToolTimeoutError, UncertainOutcomeError
from actors.tool import NOT_DONE
from stores import ReceiptStatus

WAIT_S = 15.0


def _uncertain_tool(recorder: Any, answer: Any, hook_s: float, answered: threading.Event) -> Tool:
    """Not retry-safe; its first attempt times out after sending (receipt uncertain)."""
    attempts = [0]

    def charge(i: Any, c: Any) -> Any:
        recorder.record("charge", i, c)
        attempts[0] += 1
        if attempts[0] == 1:
            raise ToolTimeoutError("timed out after sending")
        return {"charged": attempts[0]}

    def reconcile(i: Any, c: Any) -> Any:
        recorder.record("reconcile", i, c)
        time.sleep(hook_s)
        answered.set()
        return answer

    return Tool(tool_id="charge", fn=charge, reconcile=reconcile)


def _make_uncertain(system: Any, read_receipts: Any, key_of: Any, tool: Tool) -> str:
    with pytest.raises(ToolTimeoutError):
        system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    key = key_of(tool, {"card": 1})
    (receipt,) = read_receipts([key])
    assert receipt is not None and receipt.status is ReceiptStatus.UNCERTAIN
    return key


def _wait_until(predicate: Any, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.waits
def test_a_slow_reconcile_hook_answers_the_caller_at_its_timeout_and_its_answer_is_kept(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any
) -> None:
    answered = threading.Event()
    tool = _uncertain_tool(recorder, {"charged": "reconciled"}, 1.5, answered)
    system = make_system([tool])
    key = _make_uncertain(system, read_receipts, key_of, tool)
    start = time.monotonic()
    with pytest.raises(UncertainOutcomeError, match=r"did not answer within 0\.3 s"):
        system.proxy().execute("charge", {"card": 1}, timeout_s=0.3).get(timeout=WAIT_S)
    waited = time.monotonic() - start
    assert waited < 1.2, f"the caller waited {waited:.2f} s on a 0.3 s timeout"
    assert answered.wait(WAIT_S)
    _wait_until(lambda: read_receipts([key])[0].status is ReceiptStatus.COMPLETED)
    result = system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    assert (result.value, result.execution) == ({"charged": "reconciled"}, "cached")
    assert recorder.count("charge") == 1 and recorder.count("reconcile") == 1


@pytest.mark.waits
def test_a_late_not_done_with_no_caller_left_calls_no_provider(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any
) -> None:
    answered = threading.Event()
    tool = _uncertain_tool(recorder, NOT_DONE, 0.8, answered)
    system = make_system([tool])
    key = _make_uncertain(system, read_receipts, key_of, tool)
    with pytest.raises(UncertainOutcomeError, match="did not answer"):
        system.proxy().execute("charge", {"card": 1}, timeout_s=0.2).get(timeout=WAIT_S)
    assert answered.wait(WAIT_S)
    _wait_until(lambda: read_receipts([key])[0].status is not ReceiptStatus.UNCERTAIN)
    time.sleep(0.3)  # a claim and a provider call would have started by now
    assert recorder.count("charge") == 1  # nobody waits: nothing paid
    (receipt,) = read_receipts([key])
    assert receipt is not None and receipt.status is ReceiptStatus.PENDING
    result = system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)  # the next caller runs it
    assert (result.value, result.execution) == ({"charged": 2}, "live")
    assert recorder.count("charge") == 2


@pytest.mark.waits
def test_callers_joining_a_reconcile_keep_their_own_timeouts(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any
) -> None:
    answered = threading.Event()
    tool = _uncertain_tool(recorder, {"charged": "reconciled"}, 1.2, answered)
    system = make_system([tool])
    _make_uncertain(system, read_receipts, key_of, tool)
    proxy = system.proxy()
    first = proxy.execute("charge", {"card": 1}, timeout_s=10)
    _wait_until(lambda: recorder.count("reconcile") == 1)
    short = proxy.execute("charge", {"card": 1}, timeout_s=0.2)
    start = time.monotonic()
    with pytest.raises(UncertainOutcomeError, match=r"within 0\.2 s"):
        short.get(timeout=WAIT_S)
    waited = time.monotonic() - start
    assert waited < 0.8, f"the joiner waited {waited:.2f} s on a 0.2 s timeout"
    assert first.get(timeout=WAIT_S).value == {"charged": "reconciled"}
    assert recorder.count("charge") == 1 and recorder.count("reconcile") == 1
