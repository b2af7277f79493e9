"""The send gate is the last step before a request leaves: every attempt of a paced
provider waits there for its turn (:func:`actors.worker.attempt.attempt`), so requests granted
together, or held up together between the grant and the send, still reach the provider
spaced at its rate."""

from __future__ import annotations

from typing import Any

from actors import NotSentError, Pacing, Tool
from actors.lifecycle.attempts import AttemptSpec
from actors.messages import UnitFinished
from actors.pacing.send_gate import SendGate
from actors.results import ToolContext
from actors.worker.attempt import attempt

from ..conftest import ORG

WAIT_S = 60.0


def _spec(tool: Tool, deadline: float) -> AttemptSpec:
    context = ToolContext(
        tool_id=tool.tool_id, idempotency_key="k", receipt_keys=("k",), credential_scope_digest="",
        deadline=deadline, timeout_s=deadline, attempt=1,
    )  # fmt: skip
    return AttemptSpec(
        unit=1, attempt=1, tool=tool, payload={}, inputs=[{}], batched=False, context=context, durable=False
    )


def test_attempt_whose_turn_comes_after_its_deadline_sends_nothing() -> None:
    sent: list[Any] = []
    tool = Tool(tool_id="api", fn=lambda payload, ctx: sent.append(payload))
    gate = SendGate(rps=10.0)
    gate.pause_until(100.0, 10.0)  # the provider said Retry-After: its pause outlasts the call
    told: list[UnitFinished] = []
    attempt(_spec(tool, deadline=50.0), told.append, clock=lambda: 10.0, gate=gate)
    assert sent == []
    assert [type(m.error) for m in told] == [NotSentError]


def test_attempt_at_a_closed_gate_sends_nothing() -> None:
    sent: list[Any] = []
    tool = Tool(tool_id="api", fn=lambda payload, ctx: sent.append(payload))
    gate = SendGate(rps=10.0)
    gate.close(until=30.0)  # the provider's circuit opened
    told: list[UnitFinished] = []
    attempt(_spec(tool, deadline=50.0), told.append, clock=lambda: 10.0, gate=gate)
    assert sent == [] and [type(m.error) for m in told] == [NotSentError]


def test_paced_requests_pass_their_providers_send_gate(make_system: Any, recorder: Any) -> None:
    tool = Tool(tool_id="api", fn=lambda payload, ctx: payload, pacing=Pacing(rps=200.0), provider="prov")
    system = make_system([tool])
    futures = [system.proxy().execute("api", {"n": n}) for n in range(5)]
    assert [f.get(timeout=WAIT_S).execution for f in futures] == ["live"] * 5
    assert system.gates.get(ORG, "prov").passed == 5
