"""A store error at each step of a call (claim, mark running, failure record, the
completion flusher, a refused output): every caller answered, nothing held.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import (
    LeaseLostError,
    ProviderError,
    ReceiptPersistenceError,
    StoreError,
)
from actors.flusher.actor import FlushOutcome
from stores.types import (
    FailureKind,
)

from .conftest import (
    BATCHED,
    Driver,
    run_to_running,
    value_of,
)

# -- store errors at each step -------------------------------------------------------------


def test_lifecycle_claim_error_answers_every_caller_and_holds_nothing() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.fail_claim(StoreError("disk I/O error"))
    assert all(isinstance(d.outcome(c), StoreError) for c in calls)
    assert d.fx.acquires == []
    d.assert_nothing_held()


def test_lifecycle_mark_running_error_releases_slot_receipt_and_heartbeat() -> None:
    d = Driver()
    calls = d.drain("a", "b")
    d.answer_claim()
    d.grant()
    d.mark(error=StoreError("database is locked"))
    assert all(isinstance(d.outcome(c), StoreError) for c in calls)
    assert d.fx.starts == []  # never sent
    assert {lease.key for lease in d.fx.released} == {"a", "b"}
    d.assert_nothing_held()


def test_lifecycle_mark_running_refusing_one_lease_runs_the_others() -> None:
    d = Driver(BATCHED)
    a, b = d.drain("a", "b")
    d.answer_claim()
    d.grant()
    first = max(d.fx.marks)
    assert [r.members for r in d.fx.records[first]] == [("a", "b")] or [
        r.members for r in d.fx.records[first]
    ] == [("b", "a")]
    d.mark(refused=("a",))
    assert isinstance(d.outcome(a), LeaseLostError)
    # the record (proposed with the mark) was not written: the request is proposed anew
    # without a, and only sent once recorded (so a crash can send exactly it again)
    assert d.fx.starts == []
    assert [r.members for r in d.fx.records[max(d.fx.marks)]] == [("b",)]
    d.mark()
    assert d.fx.starts[-1].context.receipt_keys == ("b",)
    d.finish()
    d.persisted()
    assert value_of(d.outcome(b)) == {"v": "b"}
    d.assert_nothing_held()


def test_lifecycle_failure_record_error_trips_the_latch_and_carries_both_causes() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish(error=ProviderError("bad request"))
    assert d.fx.slots_released[False] == 0  # held until the failure is written
    d.failures_recorded(error=StoreError("disk full"))
    error = d.outcome(call)
    assert isinstance(error, ReceiptPersistenceError) and "bad request" in str(error)
    assert d.fx.tripped
    d.assert_nothing_held()


def test_lifecycle_completion_flusher_error_salvages_and_answers() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish({"paid": True})
    d.persisted(error=RuntimeError("flusher crashed"))
    assert value_of(d.outcome(call)) == {"paid": True}  # the caller still gets what was paid for
    assert [k for k, _ in d.fx.salvaged] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_refused_output_is_answered_salvaged_and_its_receipt_failed() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish({"big": "x"})
    d.persisted(a=FlushOutcome("refused", error="too large", reason="output_too_large"))
    assert value_of(d.outcome(call)) == {"big": "x"}
    ((record,),) = d.fx.failures.values()
    assert record.failure_kind is FailureKind.OUTPUT_TOO_LARGE
    d.failures_recorded()
    d.assert_nothing_held()
