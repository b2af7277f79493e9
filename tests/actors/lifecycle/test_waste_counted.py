"""What paid calls wasted (``Effects.waste``, ``stats()["wasted"]``): a paid answer another
run's output replaced (``refused``), a send whose outcome is uncertain at the tool's
stated price (``uncertain``); nothing for a call paid and stored, nor for a request a lost
owner recorded that this run sends again (answered anew, it was never billed before, as
far as can be known; replayed, it was billed once).

State-machine tests: the harness of ``conftest.py`` (fake clock, recording effects),
each ending with :meth:`Driver.assert_nothing_held`."""

from __future__ import annotations

from actors.errors import ToolTimeoutError
from actors.flusher.latch import FlushOutcome
from actors.tool import BatchStrategy, Tool
from stores.money import Money

from .conftest import Driver, noop, run_to_running, value_of
from .test_batch_request_recorded import _recorded, _take_over

PAID = Money("0.5", "USD")
PRICED = Tool(tool_id="lookup", fn=noop, price=PAID)
PRICED_BATCH = Tool(
    tool_id="verify", fn=noop, price=PAID, batch=BatchStrategy(batch_fn=noop, max_batch_size=5)
)


def test_a_paid_answer_stored_wastes_nothing() -> None:
    d = Driver(PRICED)
    (call,) = run_to_running(d, "a")
    d.finish({"v": 1}, costs=(PAID,))
    d.persisted()
    assert d.outcome(call).execution == "live"
    assert d.fx.spent == [PAID] and d.fx.wasted == []
    d.assert_nothing_held()


def test_a_paid_answer_another_run_completed_first_is_wasted_as_refused() -> None:
    d = Driver(PRICED)
    (call,) = run_to_running(d, "a")
    d.finish({"v": "ours"}, costs=(PAID,))
    d.persisted(a=FlushOutcome("completed_by_other", output={"v": "theirs"}))
    assert value_of(d.outcome(call)) == {"v": "theirs"} and d.outcome(call).execution == "cached"
    assert d.fx.spent == [PAID] and d.fx.wasted == [(PAID, "refused")]
    assert d.fx.saved == []  # the other run's output is no saving: ours was paid
    d.assert_nothing_held()


def test_a_send_whose_outcome_is_uncertain_wastes_the_stated_price() -> None:
    d = Driver(PRICED)  # not retry-safe: a timeout after the send may have been acted on
    (call,) = run_to_running(d, "a")
    d.finish(error=ToolTimeoutError("no answer"))
    assert "a" in d.fx.uncertain
    d.failures_recorded()
    assert isinstance(d.outcome(call), ToolTimeoutError)
    assert d.fx.spent == [] and d.fx.wasted == [(PAID, "uncertain")]
    d.assert_nothing_held()


def test_a_request_a_lost_owner_recorded_and_this_run_sent_again_wastes_nothing() -> None:
    """A crash may come between recording a request and sending it: an answer anew is
    that request's first payment (a provider that honours the Idempotency-Key replays a
    request it already answered)."""
    d = Driver(PRICED_BATCH)
    (call,) = d.drain("b")
    _take_over(d, _recorded("c", "b", "a"))
    d.grant()
    d.mark()
    d.finish(costs=(PAID, PAID, PAID))
    d.persisted()
    assert value_of(d.outcome(call)) == {"v": "b"}
    assert d.fx.spent == [PAID] * 3 and d.fx.wasted == []
    d.assert_nothing_held()


def test_a_request_taken_over_that_the_provider_replays_wastes_nothing() -> None:
    """The lost owner's send reached the provider, which answers the same request key from
    its record: nothing was paid twice."""
    d = Driver(PRICED_BATCH)
    d.drain("b")
    _take_over(d, _recorded("b"))
    d.grant()
    d.mark()
    d.finish(costs=(PAID,), replayed=True)  # the worker saw Idempotent-Replayed on the answer
    d.persisted()
    assert d.fx.spent == [] and d.fx.wasted == []
    d.assert_nothing_held()
