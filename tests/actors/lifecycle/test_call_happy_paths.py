"""A call claimed, admitted, marked running, run and persisted; followers, reuse, nested
calls, a tool that is not durable, the width of admission.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.lifecycle.calls import Group, GroupState
from actors.messages import (
    UnitFinished,
)
from stores.types import (
    ClaimDisposition,
)

from .conftest import (
    LOCAL,
    Driver,
    plain,
    run_to_running,
    value_of,
)

# -- the happy paths ---------------------------------------------------------------------


def test_lifecycle_claim_admit_mark_run_persist_answers_live_and_holds_nothing() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")
    assert [s.unit for s in d.fx.starts] == [1] or len(d.fx.starts) == 1
    assert d.life.groups["a"].state is GroupState.RUNNING
    d.finish({"v": 1})
    assert not d.answered(call)  # answered once persisted, not before
    assert d.fx.slots_released[False] == 0  # the slot is free only once the result is written
    d.persisted()
    result = d.outcome(call)
    assert (value_of(result), result.execution) == ({"v": 1}, "live")
    assert d.fx.memo["a"][1] is False
    d.assert_nothing_held()


def test_lifecycle_reused_and_followers_share_one_answer_each() -> None:
    d = Driver()
    owner = d.call("a")
    group = Group.of(owner)
    from actors.lifecycle.calls import Role

    follower = d.call("a")
    group.join(follower, Role.FOLLOWER)
    d.life.drained([group], d.now)
    d.answer_claim({"a": ClaimDisposition.REUSED})
    assert [value_of(d.outcome(c)) for c in (owner, follower)] == [{"stored": "a"}] * 2
    assert {d.outcome(c).execution for c in (owner, follower)} == {"cached"}
    assert d.fx.acquires == []  # nothing admitted
    d.assert_nothing_held()


def test_lifecycle_unbatched_tool_runs_non_durable_without_receipts() -> None:
    d = Driver(LOCAL)
    (call,) = d.drain("a")
    assert d.fx.claims == {}
    d.grant()
    assert d.fx.marks == {}
    spec = d.fx.starts[-1]
    d.life.handle(
        UnitFinished(unit=spec.unit, attempt=spec.attempt, members=[(plain({"x": 1}), None)], error=None),
        d.now,
    )
    assert value_of(d.outcome(call)) == {"x": 1}
    d.assert_nothing_held()


def test_lifecycle_nested_calls_take_exempt_slots_and_give_them_back() -> None:
    d = Driver()
    (call,) = d.drain("a", nested=True)
    d.answer_claim()
    assert d.fx.acquires == [(1, True)]
    d.grant(exempt=True)
    d.mark()
    d.finish()
    d.persisted()
    assert d.fx.slots_released == {False: 0, True: 1}
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_lifecycle_width_bounds_slots_asked_and_a_freed_slot_admits_the_next_at_once() -> None:
    d = Driver(width=2)
    calls = d.drain("a", "b", "c", "d")
    d.answer_claim()
    assert d.fx.acquires == [(2, False)]
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 2
    d.finish(spec=d.fx.starts[0])
    d.persisted()  # a's result written: its slot is free, the next unit is asked for at once
    assert d.fx.acquires[-1] == (1, False)
    d.grant()
    d.mark()
    assert len(d.fx.starts) == 3
    for spec in d.fx.starts[1:]:
        d.finish(spec=spec)
        d.persisted()
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert [value_of(d.outcome(c)) for c in calls] == [{"v": k} for k in "abcd"]
    d.assert_nothing_held()
