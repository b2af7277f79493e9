"""Claim dispositions and waits on another owner's receipt: timer polls, change
notifications, a recorded failure, a receipt given back when its call was not sent.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import (
    NotSentError,
    ReceiptWaitTimeoutError,
    RecordedFailureError,
)
from actors.messages import (
    PollDue,
    ReceiptsChanged,
)
from actors.tool import Policy
from stores.types import (
    ClaimDisposition,
    FailureKind,
    ReceiptStatus,
)

from .conftest import (
    TIMEOUT_S,
    Driver,
    value_of,
)

# -- waiting on another owner --------------------------------------------------------------


def test_lifecycle_wait_on_another_owner_polls_by_timer_and_takes_its_output() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs"))
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 1}))
    outcome = d.outcome(call)
    assert (value_of(outcome), outcome.execution) == ({"theirs": 1}, "in_flight")
    assert d.fx.counts["waiting_on_owner"] == 0  # the gauge went back down
    d.assert_nothing_held()


def test_lifecycle_wait_times_out_after_its_attempts() -> None:
    d = Driver(policy=Policy(timeout_s=TIMEOUT_S, receipt_wait_max_attempts=2))
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    running = d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs")
    d.fire(PollDue)
    d.read(a=running)
    d.fire(PollDue)
    d.read(a=running)  # the last poll claims (the store judges the lease)
    d.answer_claim({"a": ClaimDisposition.RUNNING}, a=running)
    assert isinstance(d.outcome(call), ReceiptWaitTimeoutError)
    d.assert_nothing_held()


def test_lifecycle_read_answer_goes_to_its_own_key_when_a_waiter_left_meanwhile() -> None:
    d = Driver()
    first, second = d.drain("a", "b")
    d.answer_claim({"a": ClaimDisposition.RUNNING, "b": ClaimDisposition.RUNNING})
    d.fire(PollDue)  # one read of a and b
    assert d.cancel(first)  # a leaves before the read answers
    d.read(a=d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs"),
           b=d.receipt("b", ReceiptStatus.COMPLETED, output={"b": 1}))  # fmt: skip
    assert value_of(d.outcome(second)) == {"b": 1}
    d.assert_nothing_held()


def test_lifecycle_change_notification_reads_at_once_and_counts_no_attempt() -> None:
    d = Driver(policy=Policy(timeout_s=TIMEOUT_S, receipt_wait_max_attempts=2))
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    assert d.fx.watched == {"a"}
    running = d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs")
    for _ in range(5):  # other keys of the org changed: a is still held
        d.life.handle(ReceiptsChanged(keys=tuple(["a"])), d.now)
        d.read(a=running)
    assert [m for _, m in d.fx.timers if isinstance(m, PollDue)] == [PollDue(keys=("a",))]  # no new timer
    assert not d.answered(call)  # no attempt spent: the wait has not timed out
    d.life.handle(ReceiptsChanged(keys=tuple(["a"])), d.now)
    d.life.handle(ReceiptsChanged(keys=tuple(["a"])), d.now)  # a read is already out: no second one now...
    d.life.handle(ReceiptsChanged(keys=tuple(["a"])), d.now)
    assert len(d.fx.reads) == 6
    d.read(a=running)  # ...but one more after it (it may predate the change)
    assert len(d.fx.reads) == 7
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 1}))
    outcome = d.outcome(call)
    assert (value_of(outcome), outcome.execution) == ({"theirs": 1}, "in_flight")
    assert d.fx.watched == set()
    d.fire(PollDue)  # the fallback timer finds nothing to read
    assert len(d.fx.reads) == 7
    d.assert_nothing_held()


def test_lifecycle_woken_reclaim_that_waits_again_keeps_one_timer() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    d.life.handle(ReceiptsChanged(keys=tuple(["a"])), d.now)
    d.read(a=d.receipt("a", ReceiptStatus.PENDING))  # released: claim again
    d.answer_claim({"a": ClaimDisposition.RUNNING})  # someone else took it first
    assert len([m for _, m in d.fx.timers if isinstance(m, PollDue)]) == 1
    assert d.fx.watched == {"a"}
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 2}))
    assert value_of(d.outcome(call)) == {"theirs": 2}
    assert d.fx.watched == set()
    d.assert_nothing_held()


def test_lifecycle_recorded_failure_not_retryable_is_reported() -> None:
    d = Driver()
    (call,) = d.drain("a")
    failed = d.receipt("a", ReceiptStatus.FAILED, error="bad input", failure_kind=FailureKind.PERMANENT)
    d.answer_claim({"a": ClaimDisposition.FAILED}, a=failed)
    assert isinstance(d.outcome(call), RecordedFailureError)
    d.assert_nothing_held()


def test_lifecycle_not_sent_error_releases_the_receipt() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    d.mark()
    d.finish(error=NotSentError("not sent"))
    assert isinstance(d.outcome(call), NotSentError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()
