"""A batch tool's request is recorded with its running mark, before it is sent, and a
request taken over from a lost owner (``Claim.batch``) is sent again exactly as recorded,
first, under its key (issue 26).

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

import pytest

from actors.errors import CallCancelledError, LeaseLostError
from actors.lifecycle.attempts import recorded_input
from actors.messages import ReceiptsClaimed, RetryDue, UnitFinished
from actors.results import batch_idempotency_key, provider_idempotency_key
from actors.tool import BatchStrategy, Tool
from stores.types import BatchRecord, Claim, ClaimDisposition, LeaseRef, ReceiptStatus

from .conftest import BATCHED, Driver, noop, value_of

SAFE_BATCHED = Tool(
    tool_id="verify", fn=noop, retry_safe=True, batch=BatchStrategy(batch_fn=noop, max_batch_size=5)
)
CLAIMED = ClaimDisposition.CLAIMED


def _recorded(*keys: str) -> BatchRecord:
    """A request a lost owner recorded, in its own order, its inputs with a field the keys
    never saw (a non-semantic one): sent again, the request carries them."""
    return BatchRecord(
        key="recorded-key", tool_id=BATCHED.tool_id, members=keys,
        inputs=tuple(recorded_input({"k": k, "sent": "first"}) for k in keys),
    )  # fmt: skip


def _take_over(d: Driver, record: BatchRecord) -> None:
    """Answer the latest claim (of some of ``record``'s members) as a takeover of the whole
    request: every member claimed under a new lease, in the request's order."""
    batch, _, asked = d.last_claim()
    members = []
    for n, key in enumerate(record.members):
        receipt = d.receipt(
            key, ReceiptStatus.QUEUED, lease_id=f"taken-{n}", attempts=2, batch_key=record.key
        )
        d.claimed_leases[key] = LeaseRef(key, f"taken-{n}")
        members.append(Claim(CLAIMED, receipt))
    by_key = {m.receipt.key: m for m in members}
    claims = [Claim(CLAIMED, by_key[k].receipt, record, tuple(members)) for k in asked]
    d.life.handle(ReceiptsClaimed(batch=batch, value=claims, error=None), d.now)
    d.pump()


def test_lifecycle_a_batch_is_recorded_with_its_running_mark_and_sent_as_recorded() -> None:
    d = Driver(BATCHED)
    calls = d.drain("a", "b", "c")
    d.answer_claim()
    d.grant()
    mark = max(d.fx.marks)
    (record,) = d.fx.records[mark]
    keys = [provider_idempotency_key(k, 1) for k in "abc"]
    assert sorted(record.members) == ["a", "b", "c"]
    assert record.key == batch_idempotency_key(keys)
    assert [provider_idempotency_key(k, 1) for k in record.members] == sorted(keys)  # the canonical order
    assert record.inputs == tuple(recorded_input({"k": k}) for k in record.members)
    assert d.fx.starts == []  # nothing goes before the store has it
    d.mark()
    spec = d.fx.starts[-1]
    assert (spec.context.idempotency_key, spec.context.receipt_keys) == (record.key, record.members)
    d.finish()
    d.persisted()
    assert [value_of(d.outcome(c)) for c in calls] == [{"v": "a"}, {"v": "b"}, {"v": "c"}]
    d.assert_nothing_held()


def test_lifecycle_a_lone_call_of_a_batch_tool_is_recorded_alone() -> None:
    d = Driver(BATCHED)
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    (record,) = d.fx.records[max(d.fx.marks)]
    assert (record.key, record.members) == (provider_idempotency_key("a", 1), ("a",))
    d.mark()
    assert d.fx.starts[-1].context.idempotency_key == record.key and not d.fx.starts[-1].batched
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_a_tool_without_a_batch_strategy_records_nothing() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    assert d.fx.records[max(d.fx.marks)] == ()
    d.mark()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_a_request_taken_over_goes_first_whole_in_its_order_under_its_key() -> None:
    """Only b is asked for here; the lost owner's request carried c, b, a: that request goes
    again, exactly (members, order, key, inputs as sent), and every member's output is
    stored (c and a for their next callers); a call of a made meanwhile joins it and is
    the one call answered ``live`` with a's output (this run completed it; nobody else was
    told); c, callerless, is marked for its first caller."""
    d = Driver(BATCHED)
    (call,) = d.drain("b")
    record = _recorded("c", "b", "a")
    _take_over(d, record)
    assert sorted(d.fx.registered) == ["a", "b", "c"]  # every lease renewed while it waits and runs
    joined = d.attach("a")
    d.grant()
    assert d.fx.records[max(d.fx.marks)] == ()  # recorded already: not again
    assert {lease.key for lease in d.fx.marks[max(d.fx.marks)]} == {"a", "b", "c"}
    d.mark()
    spec = d.fx.starts[-1]
    assert spec.context.idempotency_key == "recorded-key"
    assert spec.context.receipt_keys == ("c", "b", "a")
    assert spec.inputs == [{"k": k, "sent": "first"} for k in "cba"]
    assert d.fx.counts["requests_resent"] == 1
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "b"}
    assert d.outcome(joined).execution == "live" and value_of(d.outcome(joined)) == {"v": "a"}
    assert {e.key for entries in d.fx.persists.values() for e in entries} == {"a", "b", "c"}
    assert d.fx.owes == {"c"}  # marked before its write: its first caller anywhere is live
    d.assert_nothing_held()


def test_lifecycle_members_of_one_request_claimed_together_make_one_unit() -> None:
    d = Driver(BATCHED)
    calls = d.drain("a", "x", "c")
    record = _recorded("c", "b", "a")
    batch, _, _ = d.last_claim()
    members = tuple(
        Claim(
            CLAIMED, d.receipt(k, ReceiptStatus.QUEUED, lease_id=f"t-{k}", attempts=2, batch_key=record.key)
        )
        for k in record.members
    )
    by_key = {m.receipt.key: m for m in members}
    lone = d.receipt("x", ReceiptStatus.QUEUED, lease_id="t-x", attempts=1)
    claims = [Claim(CLAIMED, by_key["a"].receipt, record, members), Claim(CLAIMED, lone)]
    claims.append(Claim(CLAIMED, by_key["c"].receipt, record, members))
    for key in "abcx":
        d.claimed_leases[key] = LeaseRef(key, f"t-{key}")
    d.life.handle(ReceiptsClaimed(batch=batch, value=claims, error=None), d.now)
    d.pump()
    d.grant()
    d.mark()
    keys = sorted(spec.context.receipt_keys for spec in d.fx.starts)
    assert keys == [("c", "b", "a"), ("x",)]  # x never joins the recorded request
    for spec in list(d.fx.starts):
        d.finish(spec=spec)
        d.persisted()
    assert [value_of(d.outcome(c)) for c in calls] == [{"v": "a"}, {"v": "x"}, {"v": "c"}]
    d.assert_nothing_held()


def test_lifecycle_a_request_taken_over_keeps_its_key_across_in_call_retries() -> None:
    d = Driver(SAFE_BATCHED)
    (call,) = d.drain("a")
    _take_over(d, _recorded("b", "a"))
    d.grant()
    d.mark()
    d.finish(error=ConnectionError("reset after sending"))
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    d.mark(refused=("b",))  # b's lease was taken meanwhile: it rides along
    retry = d.fx.starts[-1]
    assert (retry.attempt, retry.context.idempotency_key) == (2, "recorded-key")
    assert retry.context.receipt_keys == ("b", "a")
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_a_request_taken_over_whose_leases_are_refused_at_its_mark_still_goes_whole() -> None:
    d = Driver(BATCHED)
    (call,) = d.drain("a")
    _take_over(d, _recorded("a", "b", "c"))
    d.grant()
    d.mark(refused=("c",))
    assert d.fx.starts[-1].context.receipt_keys == ("a", "b", "c")
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


@pytest.mark.parametrize("how", ["cancelled", "stopped"])
def test_lifecycle_a_request_taken_over_with_nobody_waiting_is_given_back_whole(how: str) -> None:
    d = Driver(BATCHED)
    (call,) = d.drain("b")
    if how == "cancelled":
        assert d.cancel(call)
    else:
        d.life.stop(d.now)
    _take_over(d, _recorded("c", "b", "a"))
    assert d.fx.starts == [] and d.fx.marks == {}
    assert sorted(lease.key for lease in d.fx.released) == ["a", "b", "c"]  # pending, record kept
    assert isinstance(d.outcome(call), CallCancelledError)
    d.assert_nothing_held()


def test_lifecycle_a_request_taken_over_is_not_dropped_when_its_lease_is_lost_before_it_goes() -> None:
    """Lost leases of a request that may have been sent before: it is not withdrawn (its
    key covers every member); the members still ours go, the lost ride along."""
    d = Driver(BATCHED)
    d.fx.hold_sends = True
    (call,) = d.drain("a")
    _take_over(d, _recorded("a", "b"))
    d.grant()
    d.mark()
    d.leases_lost("b")
    assert d.fx.withdrawn == []
    spec = d.fx.starts[-1]
    assert (spec.context.idempotency_key, spec.context.receipt_keys) == ("recorded-key", ("a", "b"))
    assert d.fx.launch.take(spec.ticket) is None
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_a_lease_lost_member_of_a_request_never_sent_is_left_out_and_recorded_anew() -> None:
    d = Driver(BATCHED)
    d.fx.hold_sends = True
    calls = d.drain("a", "b", "c")
    d.answer_claim()
    d.grant()
    d.mark()
    d.leases_lost("b")
    spec = d.fx.starts[-1]
    refusal = d.fx.launch.take(spec.ticket)
    assert refusal is not None and refusal[0] == "lease_lost"
    d.life.handle(
        UnitFinished(
            unit=spec.unit, attempt=spec.attempt, members=None, error=refusal[1], withdrawn="lease_lost"
        ),
        d.now,
    )
    d.pump()
    d.fx.hold_sends = False
    d.grant()
    (record,) = d.fx.records[max(d.fx.marks)]
    assert sorted(record.members) == ["a", "c"]
    d.mark()
    assert d.fx.starts[-1].context.idempotency_key == record.key
    d.finish()
    d.persisted()
    assert isinstance(d.outcome(calls[1]), LeaseLostError)
    assert [value_of(d.outcome(c)) for c in (calls[0], calls[2])] == [{"v": "a"}, {"v": "c"}]
    d.assert_nothing_held()
