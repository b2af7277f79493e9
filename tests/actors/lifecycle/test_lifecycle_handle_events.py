"""``Lifecycle.handle(event, now)``: the one entry point takes every fact of
:data:`actors.lifecycle.machine.EVENTS` and refuses any other message type."""

from __future__ import annotations

from typing import Any

import pytest

from actors.lifecycle.machine import EVENTS
from actors.messages import (
    CallCancelled,
    ClaimHeld,
    CleanupDue,
    CompletionsPersisted,
    DeadlineDue,
    DrainDue,
    FailuresRecorded,
    LatchTripped,
    LeasesLost,
    PollDue,
    ReceiptsChanged,
    ReceiptsClaimed,
    ReceiptsRead,
    ReceiptsReleased,
    Reconciled,
    Resolved,
    RetryCharged,
    RetryDue,
    RunningMarked,
    SlotsGranted,
    UnitFinished,
    WaitDue,
)

from .conftest import Driver, run_to_running, value_of


def _stale(d: Driver) -> dict[type, Any]:
    """One message of each type, about a request, unit or key the lifecycle does not know."""
    return {
        UnitFinished: UnitFinished(unit=99, attempt=1, members=None, error=None),
        ReceiptsClaimed: ReceiptsClaimed(batch=99, value=[], error=None),
        ClaimHeld: ClaimHeld(batch=99),
        CompletionsPersisted: CompletionsPersisted(batch=99, value={}, error=None),
        RunningMarked: RunningMarked(batch=99, value=None, error=None),
        FailuresRecorded: FailuresRecorded(batch=99, value=None, error=None),
        LatchTripped: LatchTripped(batch=99, value=None, error=None),
        ReceiptsReleased: ReceiptsReleased(batch=99, value=None, error=None),
        CleanupDue: CleanupDue(keys=(), leases=(), attempt=1),
        Reconciled: Reconciled(batch=99, value=None, error=None),
        Resolved: Resolved(batch=99, value=None, error=None),
        ReceiptsRead: ReceiptsRead(batch=99, value=None, error=None),
        PollDue: PollDue(keys=("gone",)),
        DeadlineDue: DeadlineDue(units=(99,)),
        RetryCharged: RetryCharged(unit=99, value=False, error=RuntimeError("refused")),
        RetryDue: RetryDue(unit=99),
        WaitDue: WaitDue(keys=("gone",)),
        SlotsGranted: SlotsGranted(value=0, error=None),
        LeasesLost: LeasesLost(keys=("gone",)),
        ReceiptsChanged: ReceiptsChanged(keys=("gone",)),
        CallCancelled: CallCancelled(call=d.call("gone")),
    }


def test_lifecycle_handle_takes_every_event_type_and_drops_what_concerns_nothing_it_holds() -> None:
    d = Driver()
    stale = _stale(d)
    assert set(stale) == EVENTS
    for event in stale.values():
        d.life.handle(event, d.now)
        d.pump()
    assert d.life.idle
    assert not d.fx.answers


def test_lifecycle_handle_refuses_a_message_type_it_does_not_take() -> None:
    d = Driver()
    with pytest.raises(TypeError, match="DrainDue"):
        d.life.handle(DrainDue(generation=1), d.now)
    assert d.life.idle


def test_lifecycle_handle_drives_a_call_from_claim_to_its_answer() -> None:
    d = Driver()
    (call,) = run_to_running(d, "a")  # every answer handed in through ``handle``
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()
