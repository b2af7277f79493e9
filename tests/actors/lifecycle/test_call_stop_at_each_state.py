"""The dispatcher stops at each state of a call: before its drain, claiming, waiting,
waiting for a slot, marking running, running, a retry's back-off, persisting.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import (
    CallCancelledError,
)
from actors.messages import (
    PollDue,
    RetryDue,
)
from stores.types import (
    ClaimDisposition,
)

from .conftest import (
    SAFE,
    Driver,
    run_to_running,
    stopped_outcome,
    value_of,
)

# -- stop at each state --------------------------------------------------------------------


def test_lifecycle_stop_before_drain_refuses_at_once() -> None:
    d = Driver()
    d.stop()
    (call,) = d.drain("a")
    stopped_outcome(d, call)
    assert d.fx.claims == {}
    d.assert_nothing_held()


def test_lifecycle_stop_while_claiming_releases_the_claim_when_it_lands() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.stop()
    d.answer_claim()
    stopped_outcome(d, call)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_stop_while_waiting_on_another_owner_refuses_it() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    assert d.stop() == 1
    stopped_outcome(d, call)
    d.fire(PollDue)
    assert d.fx.reads == {}
    d.assert_nothing_held()


def test_lifecycle_stop_while_waiting_for_a_slot_releases_and_returns_the_late_grant() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.answer_claim()
    assert d.stop() == 2
    for call in calls:
        stopped_outcome(d, call)
    d.refuse(CallCancelledError("the dispatcher is stopping"))  # the governor's stop
    assert d.fx.starts == []
    assert {lease.key for lease in d.fx.released} == {"a", "b"}
    d.assert_nothing_held()


def test_lifecycle_stop_while_marking_running_is_never_sent() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    d.stop()
    d.mark()
    assert d.fx.starts == []
    stopped_outcome(d, call)
    d.assert_nothing_held()


def test_lifecycle_stop_while_running_lets_the_call_finish_and_persist() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    assert d.stop() == 0
    assert not d.life.idle
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_stop_during_retry_backoff_sends_nothing_more() -> None:
    d = Driver(SAFE)
    (call,) = run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.stop()
    stopped_outcome(d, call)
    d.retry_charged()
    for _ in range(len([t for t in d.fx.timers if isinstance(t[1], RetryDue)])):
        d.fire(RetryDue)
    assert len(d.fx.starts) == 1
    d.assert_nothing_held()


def test_lifecycle_stop_while_persisting_still_answers_the_result() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish()
    d.stop()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()
