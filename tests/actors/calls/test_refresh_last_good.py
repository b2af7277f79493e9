"""A forced refresh that does not give a new output never hides the last good one (issue
26, defect 3). A refresh of a tool that is not retry-safe whose connection is reset after
sending is recorded ``uncertain``: ordinary calls (normal, retry_failed) still get the
stored output, marked ``refresh_uncertain`` and counted, in this system (its memo), in
another one, and through the front door's bulk read; only a forced re-run meets the
uncertainty. A refresh refused for good (a recorded failure) leaves the old output for
the calls that shared its execution without asking for a refresh.

Real SQLite files and a real HTTP provider on 127.0.0.1 (``scripted_provider``); both
runtimes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import Policy, ProviderError, Tool, ToolTimeoutError, UncertainOutcomeError
from actors.front import READ_FIRST
from actors.http import HttpEndpoint
from stores import ReceiptStatus

WAIT_S = 15.0
CARD = {"card": 1}
OTHERS = [{"card": n} for n in range(2, READ_FIRST + 2)]
"""Enough other inputs that a bulk call is read from the store on the caller's thread."""


@pytest.fixture
def charge(scripted_provider: Any) -> Any:
    """A tool that is not retry-safe, on the scripted provider (closed at teardown)."""
    endpoint = HttpEndpoint(f"{scripted_provider.url}/charge")
    yield Tool(tool_id="charge", fn=endpoint, timeout_s=5.0)
    endpoint.close()


def _get(future: Any) -> Any:
    return future.get(timeout=WAIT_S)


def _wait_until(predicate: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        threading.Event().wait(0.01)


def test_refresh_reset_after_sending_leaves_the_last_good_output_to_ordinary_calls(
    make_system: Any, read_receipts: Any, key_of: Any, scripted_provider: Any, charge: Tool
) -> None:
    first = make_system([charge])
    good = _get(first.proxy().execute("charge", CARD))
    assert good.execution == "live" and good.value == {"input": CARD, "answer": 1}
    for result in first.proxy().execute_many("charge", OTHERS):
        assert _get(result).execution == "live"

    scripted_provider.set_mode("reset")
    with pytest.raises(ProviderError):  # the refresh's own outcome: the connection broke
        _get(first.proxy().execute("charge", CARD, force_refresh=True))
    (receipt,) = read_receipts([key_of(charge, CARD)])
    assert receipt is not None and receipt.status is ReceiptStatus.UNCERTAIN
    assert receipt.output == good.value  # kept

    # this system (its memo held the old output), then another one (a claim), then the
    # front door's bulk read of a cold rerun: the last good output, marked, counted
    second = make_system([charge], run_id="r2")
    answers = [
        _get(first.proxy().execute("charge", CARD)),
        _get(first.proxy().execute("charge", CARD, retry_failed=True)),
        _get(second.proxy().execute("charge", CARD)),
        _get(second.proxy().execute_many("charge", [CARD, *OTHERS])[0]),
    ]
    for result in answers:
        assert (result.value, result.execution, result.refresh_uncertain) == (good.value, "cached", True)
    assert first.stats()["refresh_uncertain"] == 2
    assert second.stats()["refresh_uncertain"] == 2
    assert second.stats()["tools"]["charge"]["refresh_uncertain"] == 2
    for result in second.proxy().execute_many("charge", OTHERS):  # the others are plain reuses
        assert (_get(result).execution, _get(result).refresh_uncertain) == ("cached", False)

    with pytest.raises(UncertainOutcomeError, match="receipts resolve"):  # a forced re-run meets it
        _get(second.proxy().execute("charge", CARD, force_refresh=True))
    assert scripted_provider.count() == 2 + len(OTHERS)  # the refresh was never sent again


@pytest.mark.parametrize(("mode", "uncertain"), [("refuse", False), ("reset", True)])
def test_refresh_failing_leaves_the_old_output_to_calls_that_shared_it_without_forcing(
    make_system: Any, read_receipts: Any, key_of: Any, scripted_provider: Any, charge: Tool,
    mode: str, uncertain: bool,
) -> None:  # fmt: skip
    good = _get(make_system([charge]).proxy().execute("charge", CARD))
    system = make_system([charge], run_id="r2", policy=Policy(batch_grace_s=0.05))  # its memo is empty
    scripted_provider.set_mode("hold")
    scripted_provider.received.clear()
    forced = system.proxy().execute("charge", CARD, force_refresh=True)
    assert scripted_provider.received.wait(WAIT_S)  # the refresh is at the provider
    ordinary = system.proxy().execute("charge", CARD)  # joins the refresh under way
    retried = system.proxy().execute("charge", CARD, retry_failed=True)
    _wait_until(lambda: system.stats()["deduped"] == 2)  # both joined the refresh's execution
    for future in (ordinary, retried):  # answered while the refresh is still held: never waiting on it
        result = _get(future)
        assert (result.value, result.execution, result.refresh_running) == (good.value, "cached", True)
    scripted_provider.set_mode(mode)

    with pytest.raises(ProviderError):
        _get(forced)
    assert system.stats()["refresh_running"] == 2
    later = _get(system.proxy().execute("charge", CARD))  # after the refresh's outcome
    assert (later.value, later.refresh_uncertain, later.refresh_running) == (good.value, uncertain, False)
    assert system.stats()["refresh_uncertain"] == (1 if uncertain else 0)
    (receipt,) = read_receipts([key_of(charge, CARD)])
    assert receipt is not None and receipt.output == good.value
    assert receipt.status is (ReceiptStatus.UNCERTAIN if uncertain else ReceiptStatus.COMPLETED)
    assert scripted_provider.count() == 2  # the ordinary callers sent nothing


def test_refresh_under_way_leaves_the_last_good_output_to_ordinary_calls_at_once(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    """A forced refresh whose tool still runs past its caller's timeout (its lease live):
    ordinary calls of that input get the last good output at once, marked
    ``refresh_running``, from the refreshing system (whose memo held the old output),
    from another system (a claim, and the front door's bulk read), and as followers of
    a forced call that meets the running refresh; none waits on it."""
    hold = threading.Event()
    release = threading.Event()
    sent: list[Any] = []

    def fn(input: Any, ctx: Any) -> Any:
        sent.append(input)
        if hold.is_set():
            release.wait(WAIT_S)  # past every caller's timeout: the tool still runs
        return {"input": input, "answer": len(sent)}

    tool = Tool(tool_id="charge", fn=fn, timeout_s=WAIT_S)
    first = make_system([tool], policy=Policy(batch_grace_s=0.05))
    good = _get(first.proxy().execute("charge", CARD))
    for result in first.proxy().execute_many("charge", OTHERS):
        assert _get(result).execution == "live"
    hold.set()
    forced = first.proxy().execute("charge", CARD, force_refresh=True, timeout_s=0.5)
    with pytest.raises(ToolTimeoutError):  # its caller gave up; the refresh runs on
        _get(forced)
    (receipt,) = read_receipts([key_of(tool, CARD)])
    assert receipt is not None and receipt.status is ReceiptStatus.RUNNING  # its lease is live

    second = make_system([tool], run_id="r2", policy=Policy(batch_grace_s=0.05))
    short = 3.0  # each ordinary call's own timeout: waiting on the refresh would fail it
    held_behind = [
        second.proxy().execute("charge", CARD, force_refresh=True, timeout_s=WAIT_S),  # meets the refresh
        second.proxy().execute("charge", CARD, timeout_s=short),  # its follower
    ]
    answers = [
        _get(first.proxy().execute("charge", CARD, timeout_s=short)),
        _get(first.proxy().execute("charge", CARD, retry_failed=True, timeout_s=short)),
        _get(second.proxy().execute("charge", CARD, timeout_s=short)),
        _get(second.proxy().execute_many("charge", [CARD, *OTHERS], timeout_s=short)[0]),
        _get(held_behind[1]),
    ]
    for result in answers:
        assert (result.value, result.execution) == (good.value, "cached")
        assert (result.refresh_running, result.refresh_uncertain) == (True, False)
    assert first.stats()["refresh_running"] == 2 and first.stats()["tools"]["charge"]["refresh_running"] == 2
    assert second.stats()["refresh_running"] == 3
    assert len(sent) == 2 + len(OTHERS)  # nothing more was sent

    release.set()  # the refresh's output is stored: the new one, for everyone
    assert _get(held_behind[0]).value == {"input": CARD, "answer": 2 + len(OTHERS) + 1}
    (after,) = read_receipts([key_of(tool, CARD)])
    assert after is not None and after.status is ReceiptStatus.COMPLETED and after.output != good.value
    fresh = _get(second.proxy().execute("charge", CARD))
    assert (fresh.value, fresh.refresh_running) == (after.output, False)
