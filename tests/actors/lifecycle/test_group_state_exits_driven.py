"""Every move of :data:`actors.lifecycle.states.TRANSITIONS` is made by the real
lifecycle: the state-machine tests of this folder are run with every move recorded,
and each state is seen leaving by each exit its row allows."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from actors.lifecycle import calls
from actors.lifecycle.states import TRANSITIONS, GroupState, check_transition

from . import (
    test_batch_goes_again_whole,
    test_call_cancel_at_each_state,
    test_call_deadlines_and_send_checks,
    test_call_happy_paths,
    test_call_lease_loss,
    test_call_retries_and_backpressure,
    test_call_stop_at_each_state,
    test_call_store_errors,
    test_claim_straight_into_running,
    test_claim_uncertain_reconciled,
    test_claim_waits_and_dispositions,
    test_lease_cleanup_after_failed_writes,
    test_send_withdrawn_before_it_goes,
)

MODULES = (
    test_batch_goes_again_whole,
    test_call_cancel_at_each_state,
    test_call_deadlines_and_send_checks,
    test_call_happy_paths,
    test_call_lease_loss,
    test_call_retries_and_backpressure,
    test_call_stop_at_each_state,
    test_call_store_errors,
    test_claim_straight_into_running,
    test_claim_uncertain_reconciled,
    test_claim_waits_and_dispositions,
    test_lease_cleanup_after_failed_writes,
    test_send_withdrawn_before_it_goes,
)


def _scenarios() -> list[Any]:
    """The state-machine tests that take no argument (no fixture, no parameter)."""
    return [
        fn
        for module in MODULES
        for name, fn in sorted(vars(module).items())
        if name.startswith("test_") and callable(fn) and not inspect.signature(fn).parameters
    ]


def test_group_state_every_exit_in_the_table_is_taken_by_the_lifecycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: set[tuple[GroupState, GroupState]] = set()

    def recording(key: str, old: GroupState, new: GroupState) -> GroupState:
        seen.add((old, new))
        return check_transition(key, old, new)

    monkeypatch.setattr(calls, "check_transition", recording)
    scenarios = _scenarios()
    assert len(scenarios) >= 80
    for scenario in scenarios:
        scenario()
    table = {(old, new) for old, exits in TRANSITIONS.items() for new in exits}
    missing = sorted(f"{old.value} -> {new.value}" for old, new in table - seen)
    assert not missing, f"moves in the table no scenario makes: {missing}"
    assert seen <= table
