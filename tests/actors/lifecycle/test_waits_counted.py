"""Where an execution's time goes (``Effects.waited``, ``stats()["waits"]``): the store's
claim and write, a slot, the send (running), a retry's back-off, another owner's
receipt, each counted once per execution (a batch request's wait once per member), on
the lifecycle's clock.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

import pytest

from actors.messages import PollDue, RetryDue
from stores.types import ClaimDisposition, ReceiptStatus

from .conftest import BATCHED, SAFE, Driver, run_to_running


def test_a_call_counts_its_claim_slot_send_and_write() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.tick(0.5)  # the claim is out
    d.answer_claim()
    d.tick(2.0)  # waiting for a slot
    d.grant()
    d.mark()
    sent_at = d.now
    d.tick(3.0)  # sent: the provider answers
    d.finish({"v": 1}, sent_at=sent_at)
    d.tick(0.25)  # the answer is written
    d.persisted()
    assert d.outcome(call).execution == "live"
    assert d.fx.waits == pytest.approx({"store": 0.75, "slot": 2.0, "running": 3.0})
    d.assert_nothing_held()


def test_a_batch_request_counts_each_members_time() -> None:
    d = Driver(BATCHED)
    d.drain("a", "b", "c")
    d.answer_claim()
    d.grant()
    d.mark()
    sent_at = d.now
    d.tick(2.0)
    d.finish(sent_at=sent_at)
    d.persisted()
    assert d.fx.waits["running"] == pytest.approx(6.0)  # three members, two seconds each
    d.assert_nothing_held()


def test_a_retry_counts_its_back_off() -> None:
    d = Driver(SAFE)  # retry_backoff_s=0.5
    run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.retry_charged()
    d.fire(RetryDue)  # its delay passes on the clock
    d.grant()
    d.mark()
    d.finish({"v": 1})
    d.persisted()
    assert d.fx.waits["retry_backoff"] == pytest.approx(0.5)
    d.assert_nothing_held()


def test_waiting_on_another_owner_counts_as_owner() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    d.tick(1.5)
    d.fire(PollDue)
    d.read(a=d.receipt("a", ReceiptStatus.COMPLETED, output={"theirs": 1}))
    assert d.outcome(call).execution == "in_flight"
    assert 1.5 <= d.fx.waits["owner"] < 1.6  # (and the first poll's delay)
    d.assert_nothing_held()
