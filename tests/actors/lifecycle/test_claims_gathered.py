"""State-machine tests of claims gathered while one is out (:mod:`actors.lifecycle.claiming`).

Groups drained while a claim of drained groups (or its slot request) is out wait for
its answer, then go in one claim: under load one transaction and one store turn claim
every call that came meanwhile, and an idle call is claimed at once. Each exit of a
gathered group (its caller gives up, the dispatcher stops, the claim before it fails, is
held in an outage, or its answer cannot be sorted) ends with its callers answered.
"""

from __future__ import annotations

import pytest

from actors.errors import CallCancelledError, StoreError
from actors.lifecycle.calls import Group, GroupState
from actors.messages import ClaimHeld, ReceiptsClaimed, WaitDue
from stores import StoreUnavailableError
from stores.types import ClaimDisposition, ReceiptStatus

from .conftest import Driver, value_of


def _claimed_keys(d: Driver) -> list[list[str]]:
    return [[r.key for r in requests] for _, (_, requests) in sorted(d.fx.claims.items())]


def _run_all(d: Driver) -> None:
    """Answer every request out (slots, marks, attempts, writes) until none is left."""
    finished: set[int] = set()
    for _ in range(50):
        if d.fx.marks and max(d.fx.marks) not in d._batches_seen:
            d.mark()
        elif d.open_acquires():
            d.grant()
        elif todo := [s for s in d.fx.starts if id(s) not in finished]:
            finished.add(id(todo[0]))
            d.finish(spec=todo[0])
            d.persisted()
        else:
            return


def test_groups_drained_while_a_claim_is_out_go_together_once_it_is_answered() -> None:
    d = Driver()
    (a,) = d.drain("a")
    b, c = d.drain("b", "c")
    (e,) = d.drain("e")
    assert _claimed_keys(d) == [["a"]]  # b, c and e wait for a's claim
    d.answer_claim()
    assert _claimed_keys(d) == [["a"], ["b", "c", "e"]]  # then go in one
    d.answer_claim()
    _run_all(d)
    assert [value_of(d.outcome(x))["v"] for x in (a, b, c, e)] == ["a", "b", "c", "e"]
    d.assert_nothing_held()


def test_an_idle_call_is_claimed_at_once() -> None:
    d = Driver()
    d.drain("a")
    d.answer_claim()
    d.drain("b")  # a is claimed (running or not): no claim of drained groups is out
    assert _claimed_keys(d) == [["a"], ["b"]]
    d.answer_claim()
    _run_all(d)
    d.assert_nothing_held()


def test_a_gathered_call_whose_caller_gives_up_is_never_claimed() -> None:
    d = Driver()
    (a,) = d.drain("a")
    b, c = d.drain("b", "c")
    assert d.cancel(b)
    assert isinstance(d.outcome(b), CallCancelledError)
    d.answer_claim()
    assert _claimed_keys(d) == [["a"], ["c"]]  # b's receipt was never touched
    assert "b" not in d.life.groups
    d.answer_claim()
    _run_all(d)
    assert value_of(d.outcome(a)) == {"v": "a"} and value_of(d.outcome(c)) == {"v": "c"}
    d.assert_nothing_held()


def test_a_stop_refuses_gathered_calls_and_claims_nothing_more() -> None:
    d = Driver()
    (a,) = d.drain("a")
    b, c = d.drain("b", "c")
    assert d.stop() == 2  # b and c refused now; a's claim is out (released when answered)
    assert isinstance(d.outcome(b), CallCancelledError) and isinstance(d.outcome(c), CallCancelledError)
    d.answer_claim()
    assert _claimed_keys(d) == [["a"]]
    assert isinstance(d.outcome(a), CallCancelledError)
    d.assert_nothing_held()


def test_a_failed_claim_still_sends_the_gathered_groups() -> None:
    d = Driver()
    (a,) = d.drain("a")
    (b,) = d.drain("b")
    assert d.life.groups["b"].state is GroupState.CLAIMING
    d.fail_claim(StoreError("disk I/O error"))
    assert isinstance(d.outcome(a), StoreError)
    d.last_claim()  # (b's slots asked first: nothing waits now; the governor says "the usual way")
    assert _claimed_keys(d) == [["a"], ["b"]]
    d.answer_claim()
    _run_all(d)
    assert value_of(d.outcome(b)) == {"v": "b"}
    d.assert_nothing_held()


def test_groups_drained_while_slots_are_asked_before_a_claim_wait_for_that_claim() -> None:
    d = Driver(straight=True)
    d.drain("a")
    d.drain("b")  # a's slots are asked for: b waits
    assert d.fx.claims == {} and len(d.fx.immediate) == 1
    d.grant_now(1)
    assert _claimed_keys(d) == [["a"]]
    d.answer_claim()
    assert _claimed_keys(d) == [["a"], ["b"]] or d.fx.immediate  # b: its own slots first
    if d.fx.immediate:
        d.grant_now(1)
    d.answer_claim()
    _run_all(d)
    d.assert_nothing_held()


def test_a_claim_held_in_an_outage_lets_the_gathered_groups_go_in_a_claim_of_their_own() -> None:
    d = Driver()
    (a,) = d.drain("a")
    (b,) = d.drain("b")
    first, _, _ = d.last_claim()
    d.life.handle(ClaimHeld(batch=first), d.now)  # the store holds a's claim to try it again
    d.pump()
    d.last_claim()  # (b's slots asked first: nothing waits now)
    assert _claimed_keys(d) == [["a"], ["b"]]  # b does not wait out a's patience
    d.answer_claim()
    _run_all(d)
    assert value_of(d.outcome(b)) == {"v": "b"}
    d.life.handle(ClaimHeld(batch=first), d.now)  # (told again, or late: nothing happens)
    d.life.handle(ReceiptsClaimed(batch=first, value=None, error=StoreUnavailableError("away")), d.now)
    d.pump()
    assert isinstance(d.outcome(a), StoreUnavailableError)
    assert _claimed_keys(d) == [["a"], ["b"]]
    d.assert_nothing_held()


def test_a_claim_answer_that_fails_to_be_sorted_never_leaves_the_gathered_groups_waiting() -> None:
    d = Driver()
    d.drain("a")
    (b,) = d.drain("b")
    first, _, _ = d.last_claim()
    with pytest.raises(ValueError):  # one claim short of its requests: a bug in a store
        d.life.handle(ReceiptsClaimed(batch=first, value=[], error=None), d.now)
    d.pump()
    d.last_claim()
    assert _claimed_keys(d) == [["a"], ["b"]]
    d.answer_claim()
    _run_all(d)
    assert value_of(d.outcome(b)) == {"v": "b"}


def test_callers_of_a_claim_held_in_an_outage_are_answered_each_at_its_own_timeout() -> None:
    d = Driver()
    patient, hasty = d.call("a"), d.call("b")
    hasty.timeout_s = 0.5
    d.life.drained([Group.of(patient), Group.of(hasty)], d.now)  # one claim for both
    d.pump()
    batch, _, keys = d.last_claim()
    assert keys == ["a", "b"]
    d.life.handle(ClaimHeld(batch=batch), d.now)  # it rides out the outage for 5 s
    d.pump()
    (delay, due) = min((t for t in d.fx.timers if isinstance(t[1], WaitDue)), key=lambda t: t[0])
    d.fx.timers.remove((delay, due))
    assert delay == 0.5
    d.tick(delay)
    d.life.handle(due, d.now)
    d.pump()
    assert isinstance(d.outcome(hasty), StoreUnavailableError) and not d.answered(patient)
    d.answer_claim()  # the store is back: b's receipt is claimed for nobody, and given back
    _run_all(d)
    assert value_of(d.outcome(patient)) == {"v": "a"}
    assert d.fx.starts and all(s.context.receipt_keys == ("a",) for s in d.fx.starts)
    d.assert_nothing_held()


def test_a_caller_joining_a_held_claim_is_answered_at_its_own_timeout() -> None:
    d = Driver()
    (first,) = d.drain("a")
    batch, _, _ = d.last_claim()
    d.life.handle(ClaimHeld(batch=batch), d.now)
    d.pump()
    joiner = d.attach("a")
    joiner.timeout_s = 0.5
    d.life.joined(joiner, d.now)
    d.pump()
    dues = sorted(delay for delay, message in d.fx.timers if isinstance(message, WaitDue))
    assert dues == [0.5, 5.0]  # the joiner's own deadline, beside the first caller's
    (due,) = [m for delay, m in d.fx.timers if isinstance(m, WaitDue) and delay == 0.5]
    d.tick(0.5)
    d.life.handle(due, d.now)
    d.pump()
    assert isinstance(d.outcome(joiner), StoreUnavailableError) and not d.answered(first)
    d.answer_claim()
    _run_all(d)
    assert value_of(d.outcome(first)) == {"v": "a"}
    d.assert_nothing_held()


def test_a_held_claim_whose_callers_all_gave_up_waits_on_no_other_owner() -> None:
    d = Driver()
    (a,) = d.drain("a")
    batch, _, _ = d.last_claim()
    d.life.handle(ClaimHeld(batch=batch), d.now)
    d.pump()
    d.fire(WaitDue)  # its only caller's own timeout, while the claim is held
    assert isinstance(d.outcome(a), StoreUnavailableError)
    theirs = d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs")
    d.answer_claim({"a": ClaimDisposition.RUNNING}, a=theirs)  # another owner runs it meanwhile
    assert "a" not in d.life.groups and d.fx.reads == {}  # nobody waits: no polls
    d.assert_nothing_held()
    later = d.drain("a")[0]  # a later call starts afresh
    d.answer_claim()
    _run_all(d)
    assert value_of(d.outcome(later)) == {"v": "a"}
    d.assert_nothing_held()


def test_a_claim_whose_callers_all_cancelled_waits_on_no_other_owner() -> None:
    d = Driver()
    (a,) = d.drain("a")
    d.last_claim()
    assert d.cancel(a)
    theirs = d.receipt("a", ReceiptStatus.RUNNING, lease_id="theirs")
    d.answer_claim({"a": ClaimDisposition.BLOCKED_ACTIVE_LEASE}, a=theirs)
    assert "a" not in d.life.groups and d.fx.reads == {}
    d.assert_nothing_held()
