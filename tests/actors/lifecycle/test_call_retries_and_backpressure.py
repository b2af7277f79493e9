"""Retries of a transient error (the retry budget charged, spent or given back), 429s
re-admitted after charging the budget, the governor refusing slots, and the latch
refusing every provider call once tripped.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

import pytest

from actors.errors import (
    BudgetExceededError,
    NotSentError,
    PersistenceCircuitOpenError,
    RateLimitedError,
)
from actors.lifecycle.calls import Call
from actors.messages import (
    RetryDue,
)
from actors.tool import Policy
from stores.types import (
    FailureKind,
)

from .conftest import (
    SAFE,
    TIMEOUT_S,
    Driver,
    run_to_running,
    stopped_outcome,
    value_of,
)

# -- retries and backpressure --------------------------------------------------------------


def test_lifecycle_429_readmits_after_charging_the_retry_budget() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="2"))
    assert d.fx.backpressures == ["2"]
    assert d.fx.slots_released[False] == 1  # the slot goes back while it waits
    d.retry_charged()
    d.grant()
    d.mark()
    assert [s.attempt for s in d.fx.starts] == [1, 2]
    d.finish()
    d.persisted()
    assert (value_of(d.outcome(call)), d.outcome(call).execution) == ({"v": "a"}, "live")
    assert d.fx.counts["provider_calls"] == 1 and d.fx.counts["requests"] == 2
    d.assert_nothing_held()


def test_lifecycle_429_past_its_readmissions_records_the_rate_limit() -> None:
    d = Driver(policy=Policy(timeout_s=TIMEOUT_S, retry_attempts=1))
    (call,) = run_to_running(d, "a")
    d.finish(error=RateLimitedError())
    d.retry_charged()
    d.grant()
    d.mark()
    d.finish(error=RateLimitedError())
    ((record,),) = d.fx.failures.values()
    assert record.failure_kind is FailureKind.RATE_LIMITED
    d.failures_recorded()
    assert isinstance(d.outcome(call), RateLimitedError)
    d.assert_nothing_held()


def _retry_running(d: Driver) -> Call:
    """A call whose first attempt failed transiently, its retry charged and sent."""
    (call,) = run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    d.mark()
    return call


def test_lifecycle_a_retry_that_went_out_spends_its_charge() -> None:
    d = Driver(SAFE, policy=Policy(timeout_s=TIMEOUT_S, retry_backoff_s=0.5, retry_attempts=2))
    call = _retry_running(d)
    d.finish(error=ConnectionError("reset again"))  # sent, failed: the retry was paid for
    d.failures_recorded()
    assert isinstance(d.outcome(call), ConnectionError)
    assert d.fx.retry_refunds == 0
    d.assert_nothing_held()


def test_lifecycle_a_retry_its_send_gate_never_sent_gives_its_charge_back() -> None:
    d = Driver(SAFE)
    call = _retry_running(d)
    d.finish(error=NotSentError("its turn came after its deadline"), sent=False)
    d.pump()
    assert d.fx.retry_refunds == 1
    if d.fx.failures:
        d.failures_recorded()
    assert isinstance(d.outcome(call), BaseException)
    d.assert_nothing_held()


def test_lifecycle_a_429_readmission_stopped_before_its_send_gives_its_charge_back() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish(error=RateLimitedError(retry_after="5"))
    d.retry_charged()  # queued for a slot again, the retry paid for
    d.stop()
    stopped_outcome(d, call)
    assert d.fx.retry_refunds == 1
    d.assert_nothing_held()


def test_lifecycle_retry_budget_refused_releases_the_receipt_unrecorded() -> None:
    d = Driver(SAFE)
    (call,) = run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    d.retry_charged(BudgetExceededError("retries budget of 0 is spent"))
    assert isinstance(d.outcome(call), BudgetExceededError)
    assert d.fx.failures == {}
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_transient_error_is_retried_then_succeeds() -> None:
    d = Driver(SAFE)
    call = _retry_running(d)
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_governor_refusal_gives_every_waiting_unit_back() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.answer_claim()
    d.refuse(BudgetExceededError("provider_calls budget of 0 is spent"))
    assert all(isinstance(d.outcome(c), BudgetExceededError) for c in calls)
    assert {lease.key for lease in d.fx.released} == {"a", "b"}
    d.assert_nothing_held()


# -- the latch -----------------------------------------------------------------------------


@pytest.mark.parametrize("tripped_at", ["before_admission", "after_grant"])
def test_lifecycle_tripped_latch_starts_no_provider_call(tripped_at: str) -> None:
    d = Driver()
    calls = d.drain("a", "b")
    if tripped_at == "before_admission":
        d.fx.latch = "completion failed"
        d.answer_claim()
        assert d.fx.acquires == []
    else:
        d.answer_claim()
        d.grant()
        d.fx.latch = "completion failed"
        d.mark()
    assert d.fx.starts == []
    assert all(isinstance(d.outcome(c), PersistenceCircuitOpenError) for c in calls)
    assert d.fx.counts["refused_by_latch"] == 2
    d.assert_nothing_held()
