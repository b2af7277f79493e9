"""A caller cancels at each state of its call: claiming, waiting on another owner,
waiting for a slot, marking running, running, a retry's back-off.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

import pytest

from actors.errors import (
    CallCancelledError,
)
from actors.lifecycle.calls import GroupState
from actors.messages import (
    PollDue,
)
from stores.types import (
    ClaimDisposition,
)

from .conftest import (
    SAFE,
    Driver,
    run_to_running,
    value_of,
)

# -- cancel at each state ------------------------------------------------------------------


def test_lifecycle_cancel_while_claiming_releases_the_claim_when_it_lands() -> None:
    d = Driver()
    (call,) = d.drain("a")
    assert d.cancel(call)
    assert isinstance(d.outcome(call), CallCancelledError)
    d.answer_claim()
    assert [lease.key for lease in d.fx.released] == ["a"]
    assert d.fx.acquires == []
    d.assert_nothing_held()


def test_lifecycle_cancel_while_waiting_on_another_owner_stops_the_wait() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim({"a": ClaimDisposition.RUNNING})
    assert d.life.groups["a"].state is GroupState.WAITING
    assert d.cancel(call)
    assert isinstance(d.outcome(call), CallCancelledError)
    d.fire(PollDue)  # the timer finds nothing to read
    assert d.fx.reads == {}
    d.assert_nothing_held()


def test_lifecycle_cancel_while_waiting_for_a_slot_releases_the_receipt() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    assert d.cancel(call)
    assert isinstance(d.outcome(call), CallCancelledError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.grant()
    assert d.fx.starts == []
    d.assert_nothing_held()


@pytest.mark.parametrize("nested", [False, True], ids=["slot", "exempt"])
def test_lifecycle_a_grant_beyond_what_still_waits_gives_its_charges_back(nested: bool) -> None:
    # Slots asked for two calls; one is cancelled before the governor answers. The grant
    # charged both to the provider_calls budget: the slot nobody used comes back with its
    # charge, else every cancelled wait would spend the budget for good.
    d = Driver()
    keep, gone = d.drain("a", "b", nested=nested)
    d.answer_claim()
    assert d.fx.acquires[-1] == (2, nested)
    assert d.cancel(gone)
    d.grant(exempt=nested)
    d.mark()
    assert len(d.fx.starts) == 1
    assert d.fx.refunds == 1
    d.finish()
    d.persisted()
    assert value_of(d.outcome(keep)) == {"v": "a"}
    assert d.fx.refunds == 1  # the call that went out keeps its charge
    d.assert_nothing_held()


def test_lifecycle_cancel_while_marking_running_is_never_sent() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    d.grant()
    assert d.cancel(call)
    d.mark()
    assert d.fx.starts == []
    assert isinstance(d.outcome(call), CallCancelledError)
    assert [lease.key for lease in d.fx.released] == ["a"]
    d.assert_nothing_held()


def test_lifecycle_cancel_while_running_is_refused_and_the_result_still_answers() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    assert not d.cancel(call)  # sent: persisted as usual
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_cancel_one_of_two_callers_keeps_the_execution() -> None:
    d = Driver()
    (owner,) = d.drain("a")
    other = d.attach("a")
    d.answer_claim()
    assert d.cancel(owner)
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert isinstance(d.outcome(owner), CallCancelledError)
    assert value_of(d.outcome(other)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_cancel_during_retry_backoff_releases_everything() -> None:
    d = Driver(SAFE)
    (call,) = run_to_running(d, "a")
    d.finish(error=ConnectionError("reset"))
    assert d.fx.retry_charges
    assert d.cancel(call)
    d.retry_charged()
    assert len(d.fx.starts) == 1
    d.assert_nothing_held()
