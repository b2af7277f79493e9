"""A call's lease lost while it is claimed, running or persisting, and a renewal that
raced its completion.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import (
    LeaseLostError,
)
from actors.flusher.actor import FlushOutcome

from .conftest import (
    Driver,
    run_to_running,
    value_of,
)

# -- leases --------------------------------------------------------------------------------


def test_lifecycle_lease_lost_while_claimed_answers_at_once_and_returns_the_late_grant() -> None:
    d = Driver()
    (call,) = d.drain("a")
    d.answer_claim()
    assert d.open_acquires() == 1
    d.leases_lost("a")
    assert isinstance(d.outcome(call), LeaseLostError)
    d.grant()  # the governor's answer arrives after: the slot goes straight back
    assert d.fx.starts == []
    d.assert_nothing_held()


def test_lifecycle_lease_lost_while_running_answers_now_and_salvages_the_late_result() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.leases_lost("a")
    assert isinstance(d.outcome(call), LeaseLostError)
    late = d.attach("a")  # ToolQueue refuses lost groups; a direct join still never hangs
    d.finish({"late": True})
    assert d.fx.slots_released[False] == 0  # still held: the result is being written
    d.persisted(a=FlushOutcome("lease_lost", error="taken"))
    assert isinstance(d.outcome(late), LeaseLostError)
    assert d.fx.counts["salvaged"] == 1
    d.assert_nothing_held()


def test_lifecycle_lease_lost_while_persisting_is_judged_by_the_write() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish()
    d.leases_lost("a")  # a renewal refused while the completion is out
    assert not d.answered(call)  # the write's report decides
    d.persisted(a=FlushOutcome("lease_lost", error="taken"))
    assert isinstance(d.outcome(call), LeaseLostError)
    d.assert_nothing_held()


def test_lifecycle_a_renewal_racing_the_completion_is_not_a_lost_lease() -> None:
    # the receipt completed a moment before a renewal of it ran: the renewal is refused
    # (it is not queued/running any more), but the call's result stands
    d = Driver()
    (call,) = run_to_running(d, "a")
    d.finish()
    d.leases_lost("a")
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    assert d.fx.counts["lease_lost"] == 0
    d.lost.discard("a")
    d.assert_nothing_held()
