"""A batch already sent goes again whole under the key the provider saw: a member whose
caller left or whose lease was lost rides along; a nested call that joined borrows a
slot.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

import pytest

from actors.errors import (
    CallCancelledError,
    LeaseLostError,
    ProviderError,
    RateLimitedError,
)
from actors.messages import (
    RetryDue,
)
from actors.tool import BatchStrategy, Tool
from stores.types import (
    FailureKind,
)

from .conftest import (
    SAFE,
    Driver,
    noop,
    run_to_running,
    value_of,
)

SAFE_BATCHED = Tool(
    tool_id="verify-safe", fn=noop, retry_safe=True, batch=BatchStrategy(batch_fn=noop, max_batch_size=5)
)


@pytest.mark.parametrize("leaves", ["cancelled", "lease_lost"])
def test_lifecycle_a_sent_batch_retries_whole_under_the_key_the_provider_saw(leaves: str) -> None:
    # The first request may have been served (its answer lost): a retry without one member
    # would carry another batch key, and the provider would bill the others again.
    d = Driver(SAFE_BATCHED)
    calls = run_to_running(d, "a", "b", "c")
    first = d.fx.starts[-1]
    d.finish(error=ConnectionError("reset after sending"))
    if leaves == "cancelled":
        assert d.cancel(calls[1])
    else:
        d.leases_lost("b")
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    d.mark()
    retry = d.fx.starts[-1]
    assert retry.attempt == 2
    assert retry.context.receipt_keys == first.context.receipt_keys
    assert retry.context.idempotency_key == first.context.idempotency_key
    d.finish()
    d.persisted()
    assert [value_of(d.outcome(c)) for c in (calls[0], calls[2])] == [{"v": "a"}, {"v": "c"}]
    assert isinstance(d.outcome(calls[1]), CallCancelledError if leaves == "cancelled" else LeaseLostError)
    assert {e.key for entries in d.fx.persists.values() for e in entries} == {"a", "b", "c"}
    d.assert_nothing_held()


@pytest.mark.parametrize("again", ["retry", "429"])
def test_lifecycle_a_sent_batch_whose_lease_is_refused_at_the_next_mark_still_goes_whole(again: str) -> None:
    """The lease of one member of a batch sent before is found taken when the batch is
    marked running again (after a retry's back-off, a 429's re-admission): the member
    rides along, answered LeaseLostError, so the request keeps the key the provider saw.
    Dropping it (as for a batch never sent) changed the key, and the provider billed the
    others again (breaker round 3)."""
    d = Driver(SAFE_BATCHED)
    calls = run_to_running(d, "a", "b", "c")
    first = d.fx.starts[-1]
    if again == "429":
        d.finish(error=RateLimitedError(retry_after="1"))
        d.retry_charged()
    else:
        d.finish(error=ConnectionError("reset after sending"))
        d.retry_charged()
        d.fire(RetryDue)
    d.grant()
    d.mark(refused=("b",))
    assert isinstance(d.outcome(calls[1]), LeaseLostError)  # answered now, not when the batch ends
    retry = d.fx.starts[-1]
    assert retry is not first
    assert retry.context.receipt_keys == first.context.receipt_keys
    assert retry.context.idempotency_key == first.context.idempotency_key
    d.finish()
    d.persisted()
    assert [value_of(d.outcome(c)) for c in (calls[0], calls[2])] == [{"v": "a"}, {"v": "c"}]
    assert {e.key for entries in d.fx.persists.values() for e in entries} == {"a", "b", "c"}
    d.assert_nothing_held()


def test_lifecycle_a_sent_batch_whose_every_lease_is_refused_at_the_next_mark_is_not_sent_again() -> None:
    d = Driver(SAFE_BATCHED)
    calls = run_to_running(d, "a", "b")
    d.finish(error=ConnectionError("reset after sending"))
    d.retry_charged()
    d.fire(RetryDue)
    d.grant()
    sends = len(d.fx.starts)
    d.mark(refused=("a", "b"))
    assert len(d.fx.starts) == sends  # nobody's leases: the owners now run them
    assert all(isinstance(d.outcome(c), LeaseLostError) for c in calls)
    d.assert_nothing_held()


@pytest.mark.parametrize("again", ["retry", "429"])
def test_lifecycle_a_unit_a_nested_call_joined_while_it_held_a_slot_goes_again_on_a_borrowed_one(
    again: str,
) -> None:
    """A running tool's nested call joined this unit while it ran; its next attempt (a
    retry, a 429's re-admission) borrows the waiting parent's slot, as a nested call
    does, instead of queueing for a slot of the ceiling the parent holds one of."""
    from actors.lifecycle.calls import Role

    d = Driver(SAFE)
    (call,) = run_to_running(d, "a")
    nested = d.call("a", nested=True)
    d.life.groups["a"].join(nested, Role.ATTACHED)  # as ToolQueue.submit, then nested_joined
    d.life.nested_joined("a")
    if again == "429":
        d.finish(error=RateLimitedError(retry_after="1"))
        d.retry_charged()
    else:
        d.finish(error=ProviderError("503", failure_kind=FailureKind.TRANSIENT))
        d.retry_charged()
        d.fire(RetryDue)
    assert d.fx.acquires[-1] == (1, True)  # exempt: not behind the ceiling its parent holds
    d.grant(exempt=True)
    d.mark()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == value_of(d.outcome(nested)) == {"v": "a"}
    assert d.fx.slots_released == {False: 1, True: 1}
    d.assert_nothing_held()
