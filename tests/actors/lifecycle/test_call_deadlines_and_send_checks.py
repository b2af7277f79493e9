"""A call's deadline, and the checks right before its send: a provider paused (a 429
re-admission, or before the first send) or closed (its circuit open, also when it
opens while the worker waits at its gate).

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import (
    NotSentError,
    ProviderUnavailableError,
    RateLimitedError,
    ToolTimeoutError,
)
from actors.messages import (
    DeadlineDue,
    RetryDue,
    UnitFinished,
)
from stores.codec import encode_output

from .conftest import (
    SAFE,
    TIMEOUT_S,
    Driver,
    run_to_running,
    value_of,
)

# -- deadlines -----------------------------------------------------------------------------


def test_lifecycle_deadline_while_running_keeps_the_slot_until_the_late_result_is_persisted() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.fire(DeadlineDue)
    assert isinstance(d.outcome(call), ToolTimeoutError)
    assert d.fx.slots_released[False] == 0  # still running: the slot, lease and heartbeat stay
    assert d.fx.unregistered["a"] == 0
    again = d.attach("a")  # a new call of that key attaches to the running execution
    d.finish({"late": 1})
    assert d.fx.failures == {}  # the late result is not thrown away
    d.persisted()
    # the one call answered with the output this run completed (its owner timed out): live
    assert (value_of(d.outcome(again)), d.outcome(again).execution) == ({"late": 1}, "live")
    assert d.fx.memo["a"][0] == encode_output({"late": 1})
    assert d.fx.owes == set()  # a caller was told: nothing left for a later one
    d.assert_nothing_held()


def test_lifecycle_a_429_readmission_gets_a_whole_timeout_at_its_next_send() -> None:
    # a 429 means the call was not served: its deadline starts again when it is next sent
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="1"))
    d.retry_charged()
    d.tick(TIMEOUT_S + 1)  # the pause outlasted the first deadline
    d.fire(DeadlineDue)  # that old deadline is void now
    assert not d.answered(call)
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2 and d.fx.starts[-1].context.timeout_s == TIMEOUT_S
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_send_gate_paused_after_a_429_readmission_waits_for_the_pause() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="30"))
    d.retry_charged()
    d.fx.blocked = (d.now + 60.0, False)  # the provider paused after this grant
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 1 and d.open_acquires() == 1  # not sent: asked again
    d.fx.blocked = None
    d.tick(60.0)
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_send_gate_paused_before_the_first_send_readmits() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.fx.blocked = (d.now + 1.0, False)
    d.grant()
    d.mark()
    assert d.fx.starts == [] and d.fx.slots_released[False] == 1  # slot back, asked again
    assert d.fx.refunds == 1  # nothing went out under it: its provider_calls charge comes back
    assert d.open_acquires() == 1
    d.fx.blocked = None
    d.tick(1.0)
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_closed_circuit_at_send_refuses_and_releases() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.fx.blocked = (d.now + 5.0, True)
    d.grant()
    d.mark()
    assert isinstance(d.outcome(call), ProviderUnavailableError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_deadline_during_retry_backoff_is_never_readmitted_after_its_failure() -> None:
    d = Driver(SAFE)
    (call,) = run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.fire(DeadlineDue)  # the deadline passes while the retry's budget charge is out
    assert len(d.fx.failures) == 1  # its failure is being recorded
    d.retry_charged()  # the charge answers before the failure write does
    while any(isinstance(m, RetryDue) for _, m in d.fx.timers):
        d.fire(RetryDue)
    assert d.open_acquires() == 0, "a unit whose failure is being recorded asked for a slot again"
    assert len(d.fx.marks) == 1 and len(d.fx.starts) == 1
    d.failures_recorded()
    assert len(d.fx.failures) == 1
    assert isinstance(d.outcome(call), ConnectionError)
    d.assert_nothing_held()


def test_lifecycle_a_send_held_at_the_workers_gate_when_the_circuit_opens_is_refused_and_given_back() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    spec = d.fx.starts[-1]
    d.fx.blocked = (d.now + 5.0, True)  # the circuit opened while the worker waited for its turn
    d.life.handle(
        UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=NotSentError("gate closed")),
        d.now,
    )  # no sent_at: nothing went out
    d.pump()
    d.grant()  # admitted again; its send meets the open circuit
    d.mark()
    assert isinstance(d.outcome(call), ProviderUnavailableError)
    assert [lease.key for lease in d.fx.released] == ["a"]  # given back, not recorded failed
    assert d.fx.failures == {}
    assert d.fx.refunds == 2  # neither grant sent anything: both charges come back
    d.assert_nothing_held()


def test_lifecycle_a_retry_whose_deadline_passes_while_it_is_marked_running_records_its_last_error() -> None:
    d = Driver(SAFE)
    (call,) = run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()  # admitted again: marking its receipt running
    d.tick(TIMEOUT_S)  # its deadline passes before the mark answers (its timer not yet fired)
    d.mark()
    assert len(d.fx.starts) == 1  # the retry is never sent
    assert [f.key for records in d.fx.failures.values() for f in records] == ["a"]
    d.failures_recorded()
    assert isinstance(d.outcome(call), ConnectionError)  # the last attempt's error
    d.fire(DeadlineDue)  # its timer fires late: nothing is left to end
    d.assert_nothing_held()
