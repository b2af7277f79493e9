"""An uncertain receipt of a tool with a ``reconcile`` hook (:mod:`actors.lifecycle.reconciling`):
the hook's answer is stored (its output reused, or the receipt made claimable and the
call run again) or, when the hook fails, the caller hears the outcome is uncertain.

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from typing import Any

from actors.errors import UncertainOutcomeError
from actors.lifecycle.states import GroupState
from actors.messages import Reconciled, Resolved
from actors.tool import NOT_DONE, Tool
from stores.codec import encode_output
from stores.types import ClaimDisposition, ReceiptStatus

from .conftest import Driver, noop, value_of


def _ask(value: Any, ctx: Any) -> Any:
    return NOT_DONE


RECONCILED = Tool(tool_id="charge", fn=noop, reconcile=_ask)


def _uncertain(d: Driver, key: str = "a") -> None:
    """The latest claim finds ``key``'s receipt uncertain: its reconcile hook is asked."""
    receipt = d.receipt(key, ReceiptStatus.UNCERTAIN, error="timed out after sending")
    d.answer_claim({key: ClaimDisposition.UNCERTAIN}, **{key: receipt})
    assert d.life.groups[key].state is GroupState.RECONCILING
    assert [k for _, k in d.fx.reconciles] == [key]


def _reconciled(d: Driver, value: Any = None, error: BaseException | None = None) -> None:
    batch, _ = d.fx.reconciles[-1]
    d.life.handle(Reconciled(batch=batch, value=value, error=error), d.now)
    d.pump()


def _resolved(d: Driver, error: BaseException | None = None) -> str:
    batch, _, action = d.fx.resolves[-1]
    d.life.handle(Resolved(batch=batch, value=None, error=error), d.now)
    d.pump()
    return action


def test_claim_uncertain_receipt_the_provider_completed_is_answered_from_the_hook() -> None:
    d = Driver(RECONCILED)
    (call,) = d.drain("a")
    _uncertain(d)
    _reconciled(d, value={"charged": 1})
    assert _resolved(d) == "complete"
    assert value_of(d.outcome(call)) == {"charged": 1}
    assert d.fx.starts == []  # the provider is not called again
    assert d.fx.memo["a"] == (encode_output({"charged": 1}), True)
    d.assert_nothing_held()


def test_claim_uncertain_receipt_the_provider_did_not_act_on_is_claimed_and_run_again() -> None:
    d = Driver(RECONCILED)
    (call,) = d.drain("a")
    _uncertain(d)
    _reconciled(d, value=NOT_DONE)
    assert _resolved(d) == "rerun"
    assert d.life.groups["a"].state is GroupState.CLAIMING
    d.answer_claim()
    d.grant()
    d.mark()
    d.finish()
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "a"}
    d.assert_nothing_held()


def test_claim_uncertain_receipt_whose_hook_fails_stays_uncertain() -> None:
    d = Driver(RECONCILED)
    (call,) = d.drain("a")
    _uncertain(d)
    _reconciled(d, error=RuntimeError("provider down"))
    outcome = d.outcome(call)
    assert isinstance(outcome, UncertainOutcomeError)
    assert "provider down" in str(outcome)
    assert d.fx.resolves == []  # nothing is stored: the receipt stays uncertain
    d.assert_nothing_held()
