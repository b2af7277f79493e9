"""The call group's transition table (:mod:`actors.lifecycle.states`): every state is
driven to every exit the table allows, and every move it does not allow raises at once."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import pytest

from actors.lifecycle.calls import Group
from actors.lifecycle.states import TRANSITIONS, GroupState, IllegalTransitionError, check_transition
from actors.tool import Tool
from stores import ToolDispatchError


def _noop(value: Any, ctx: Any) -> Any:
    return value


TOOL = Tool(tool_id="lookup", fn=_noop)


def _group() -> Group:
    return Group(key="k", tool=TOOL, input={}, input_hash="h-k", credential_digest="", stale_after_s=None)


def _path_to(state: GroupState) -> list[GroupState]:
    """The shortest legal path from ``queued`` to ``state`` (the states after ``queued``)."""
    paths: dict[GroupState, list[GroupState]] = {GroupState.QUEUED: []}
    todo = collections.deque([GroupState.QUEUED])
    while todo:
        here = todo.popleft()
        for nxt in sorted(TRANSITIONS[here]):
            if nxt not in paths:
                paths[nxt] = [*paths[here], nxt]
                todo.append(nxt)
    return paths[state]


EDGES = [(old, new) for old in GroupState for new in sorted(TRANSITIONS[old])]
ILLEGAL = [
    (old, new) for old, new in itertools.product(GroupState, GroupState) if new not in TRANSITIONS[old]
]


def test_group_state_table_covers_every_state_and_names_only_states() -> None:
    assert set(TRANSITIONS) == set(GroupState)
    for exits in TRANSITIONS.values():
        assert exits <= set(GroupState)


def test_group_state_every_state_is_reachable_and_reaches_settled() -> None:
    for state in GroupState:
        group = _group()
        for step in _path_to(state):
            group.state = step
        assert group.state is state
    for state in GroupState:  # settled is reachable from each (it is the only final state)
        seen, todo = {state}, [state]
        while todo:
            for nxt in TRANSITIONS[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert GroupState.SETTLED in seen
    assert [s for s in GroupState if not TRANSITIONS[s]] == [GroupState.SETTLED]


@pytest.mark.parametrize(("old", "new"), EDGES, ids=[f"{o.value}->{n.value}" for o, n in EDGES])
def test_group_state_each_state_takes_each_exit_in_the_table(old: GroupState, new: GroupState) -> None:
    group = _group()
    for step in _path_to(old):
        group.state = step
    group.state = new
    assert group.state is new
    assert check_transition("k", old, new) is new


@pytest.mark.parametrize(("old", "new"), ILLEGAL, ids=[f"{o.value}->{n.value}" for o, n in ILLEGAL])
def test_group_state_a_move_not_in_the_table_raises_at_once(old: GroupState, new: GroupState) -> None:
    group = _group()
    for step in _path_to(old):
        group.state = step
    with pytest.raises(IllegalTransitionError) as raised:
        group.state = new
    assert group.state is old  # the move did not happen
    assert (raised.value.key, raised.value.old, raised.value.new) == ("k", old, new)
    assert isinstance(raised.value, ToolDispatchError)
    assert f"{old.value} -> {new.value}" in str(raised.value)
