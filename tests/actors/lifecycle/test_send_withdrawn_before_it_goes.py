"""Lifecycle state machine: an attempt handed to its worker but not sent yet (waiting for
its turn at the send gate, a batch being built) is withdrawn by a cancel or a lost
lease, and refused by its worker's last check after a trip or a stop
(:mod:`actors.worker.launch`). Fake clock, recording effects (``conftest.Driver``); each
test drives one such exit and checks that nothing is held after it."""

from __future__ import annotations

from typing import Any

from actors.errors import (
    CallCancelledError,
    LeaseLostError,
    PersistenceCircuitOpenError,
    ProviderError,
    RateLimitedError,
)
from actors.lifecycle.calls import Role
from actors.messages import RetryDue, UnitFinished
from actors.tool import Policy
from stores.types import FailureKind

from .conftest import BATCHED, SAFE, Driver, run_to_running, value_of


def _held(tool: Any = None, **kwargs: Any) -> Driver:
    """A driver whose workers wait before sending (their tickets stay untaken)."""
    d = Driver(tool, **kwargs) if tool is not None else Driver(**kwargs)
    d.fx.hold_sends = True
    return d


def _worker_looks(d: Driver) -> tuple[str, BaseException] | None:
    """The worker of the latest attempt reaches its last check: it sends (None: the test
    then finishes it) or reports why not, as ``actors.worker.attempt.attempt`` does."""
    spec = d.fx.starts[-1]
    refusal = d.fx.launch.take(spec.ticket)
    if refusal is not None:
        kind, error = refusal
        d.life.handle(
            UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=error, withdrawn=kind),
            d.now,
        )
        d.pump()
    return refusal


def test_withdrawn_cancel_while_held_answers_now_and_gives_everything_back() -> None:
    d = _held()
    (call,) = run_to_running(d, "a")
    assert d.cancel(call) is True
    assert isinstance(d.outcome(call), CallCancelledError)  # answered now, not at its turn
    assert d.fx.released == []  # its worker still holds the attempt
    assert _worker_looks(d) is not None and d.fx.withdrawn[0][0] == "cancelled"
    assert [lease.key for lease in d.fx.released] == ["a"]
    assert d.fx.counts["requests"] == 0 and d.fx.counts["provider_calls"] == 0  # nothing went
    assert d.fx.refunds == 1  # the slot's charge comes back
    assert d.fx.counts["cancelled"] == 1
    d.assert_nothing_held()


def test_withdrawn_cancel_after_the_worker_sent_is_refused() -> None:
    d = _held()
    (call,) = run_to_running(d, "a")
    assert _worker_looks(d) is None  # it went out
    assert d.cancel(call) is False
    d.finish({"v": 1})
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": 1}
    d.assert_nothing_held()


def test_withdrawn_batch_only_once_every_caller_cancelled() -> None:
    d = _held(BATCHED)
    first, second = run_to_running(d, "a", "b")
    first.future.cancel()
    assert d.cancel(first) is False  # the other member still wants the batch
    assert not d.answered(first)
    second.future.cancel()
    assert d.cancel(second) is True
    assert [type(d.outcome(c)) for c in (first, second)] == [CallCancelledError] * 2
    assert _worker_looks(d) is not None
    assert sorted(lease.key for lease in d.fx.released) == ["a", "b"]
    assert d.fx.counts["batches"] == 0
    d.assert_nothing_held()


def test_withdrawn_for_a_cancel_then_joined_goes_again_for_the_new_caller() -> None:
    d = _held()
    (call,) = run_to_running(d, "a")
    assert d.cancel(call) is True
    late = d.call("a")
    d.life.groups["a"].join(late, Role.ATTACHED)  # came before the worker reported
    d.life.joined(late, d.now)
    _worker_looks(d)
    assert d.fx.released == []  # not given back: admitted again for the caller who came
    d.grant()
    d.fx.hold_sends = False
    d.mark()
    assert len(d.fx.starts) == 2 and d.fx.starts[-1].ticket.sent  # a new ticket, taken at once
    d.finish({"v": 2})
    d.persisted()
    assert isinstance(d.outcome(call), CallCancelledError)
    assert value_of(d.outcome(late)) == {"v": 2}
    assert d.fx.counts["provider_calls"] == 1
    d.assert_nothing_held()


def test_withdrawn_when_the_lease_is_lost_while_held_is_never_sent() -> None:
    d = _held()
    (call,) = run_to_running(d, "a")
    d.leases_lost("a")
    assert isinstance(d.outcome(call), LeaseLostError)
    assert _worker_looks(d) == d.fx.withdrawn[0]
    assert d.fx.released == []  # not ours any more
    assert d.fx.persists == {} and d.fx.failures == {}
    d.assert_nothing_held()


def test_withdrawn_by_a_stop_refuses_the_callers_and_gives_the_receipts_back() -> None:
    d = _held()
    (call,) = run_to_running(d, "a")
    d.fx.launch.stop()  # DispatchSystem.stop, before the queue hears of it
    kind, _ = _worker_looks(d) or ("", None)
    assert kind == "stopped"
    assert isinstance(d.outcome(call), CallCancelledError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.stop()
    d.assert_nothing_held()


def test_withdrawn_by_the_latch_counts_its_callers_refused() -> None:
    d = _held(BATCHED)
    calls = run_to_running(d, "a", "b")
    d.fx.write_latch.trip("writes failed")
    kind, _ = _worker_looks(d) or ("", None)
    assert kind == "latch"
    assert all(isinstance(d.outcome(c), PersistenceCircuitOpenError) for c in calls)
    assert d.fx.counts["refused_by_latch"] == 2
    assert sorted(lease.key for lease in d.fx.released) == ["a", "b"]
    d.assert_nothing_held()


def test_withdrawn_retry_gives_its_retry_charge_back() -> None:
    d = Driver(SAFE, policy=Policy(timeout_s=5.0, retry_backoff_s=0.5))
    (call,) = run_to_running(d, "a")
    d.finish(error=ProviderError("503", failure_kind=FailureKind.TRANSIENT))
    d.retry_charged()
    d.fire(RetryDue)
    d.fx.hold_sends = True
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2
    d.fx.launch.stop()
    assert _worker_looks(d) is not None
    assert d.fx.retry_refunds == 1
    assert d.unsent_retries == 0
    d.unsent_retries = 1  # the retry never went out: its charge came back
    assert isinstance(d.outcome(call), CallCancelledError)
    d.stop()
    d.assert_nothing_held()


def test_withdrawn_batch_partly_lost_goes_again_with_the_members_still_ours() -> None:
    d = _held(BATCHED)
    calls = run_to_running(d, "a", "b", "c")
    d.leases_lost("a", "b")
    assert all(isinstance(d.outcome(c), LeaseLostError) for c in calls[:2])
    assert _worker_looks(d) is not None and d.fx.withdrawn[0][0] == "lease_lost"
    assert d.fx.released == []  # a and b are another run's now; c goes again
    d.fx.hold_sends = False
    d.grant()
    d.mark()
    assert d.fx.starts[-1].context.receipt_keys == ("c",)
    d.finish({"v": "c"})
    d.persisted()
    assert value_of(d.outcome(calls[2])) == {"v": "c"}
    assert d.fx.counts["provider_calls"] == 1
    d.assert_nothing_held()


def test_withdrawn_batch_sent_before_goes_again_whole_after_a_partial_loss() -> None:
    d = _held(BATCHED)
    calls = run_to_running(d, "a", "b")
    d.fx.hold_sends = False
    d.finish(error=RateLimitedError(retry_after="1"))  # it went out once: its key covers both
    d.retry_charged()
    d.fx.hold_sends = True
    d.grant()
    d.mark()
    d.leases_lost("a")
    assert d.fx.withdrawn == []  # sent before: it goes again whole, the lost member rides along
    assert isinstance(d.outcome(calls[0]), LeaseLostError)
    d.fx.launch.take(d.fx.starts[-1].ticket)
    d.finish()
    d.persisted()
    assert value_of(d.outcome(calls[1])) == {"v": "b"}
