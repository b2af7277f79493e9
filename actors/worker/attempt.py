"""What runs on the worker pool: one attempt of one provider call, reported as a message.

The lifecycle never waits for a tool. It hands :func:`attempt` to the pool; the
attempt builds the tool's context, calls the tool (or the batch operation), splits a
batch result per member and encodes every member's output on the worker (so a value
that cannot be serialised fails its own member, off every actor), works out what each
answer cost (:mod:`actors.worker.prices`), then tells the tool queue actor
:class:`~actors.messages.UnitFinished`.

Also here: how an error is classified (:func:`failure_kind_for`, :func:`transient`)
and how a batch result is split (:func:`split_members`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.errors import (
    NotSentError,
    ProviderError,
    attr_of,
    error_text,
    is_a,
    tame,
    type_name,
)
from actors.lifecycle.attempts import AttemptSpec, PlainValue
from actors.lifecycle.units import used_units
from actors.messages import UnitFinished
from actors.pacing.reports import Report, collecting
from actors.runtime.nesting import enter_keys, leave_keys, relayed_here
from actors.tool import Tool
from actors.worker.prices import member_costs
from stores.codec import encode_output
from stores.errors import InvalidOutputError, OutputNotStorableError
from stores.types import FailureKind

if TYPE_CHECKING:
    from actors.pacing.send_gate import SendGate
    from actors.worker.launch import Launch

__all__ = ["attempt", "split_members"]


def split_members(tool: Tool, inputs: list[Any], raw: Any) -> list[Any]:
    """One value (or exception) per member of a batch, in member order.

    By position, or matched by id when the strategy gives ``input_id``/``result_id``
    (a member with no matching item gets None: ``no_result``). An item that is an
    exception (a per-member provider error) stays that member's outcome, by position
    or by id (by id, an exception item must carry the member's id as ``result_id``
    of the exception, or ``input_id`` attribute; else it cannot be matched and the
    member it belongs to fails with it when the result holds exactly one such item
    per unmatched member in order).

    Raises:
        ProviderError: the batch result does not have one result per member.
    """
    batch = tool.batch
    assert batch is not None
    n = len(inputs)
    items = list(batch.split(raw, n))
    if batch.input_id is not None and batch.result_id is not None:
        by_id: dict[Any, Any] = {}
        errors: list[BaseException] = []
        for item in items:
            if is_a(item, BaseException):
                item_id = attr_of(item, "input_id")
                if item_id is None:
                    errors.append(item)
                else:
                    by_id[item_id] = item
            else:
                by_id[batch.result_id(item)] = item
        out = [by_id.get(batch.input_id(value), _MISSING) for value in inputs]
        unmatched = [i for i, value in enumerate(out) if value is _MISSING]
        if errors and len(errors) == len(unmatched):
            for i, error in zip(unmatched, errors, strict=True):
                out[i] = error
        elif errors:
            error = errors[0]
            for i in unmatched:
                out[i] = error
        return [None if value is _MISSING else value for value in out]
    if len(items) != n:
        raise ProviderError(
            f"{batch.batch_operation or tool.tool_id} returned {len(items)} results for {n} members",
            failure_kind=FailureKind.TRANSIENT,
        )
    return items


_MISSING = object()

GATE_WAIT_MIN_S = 1e-4
"""Shortest wait at the send gate told to a traced call (a turn given at once is none)."""


def _encode(value: Any) -> tuple[str | None, BaseException | None]:
    if is_a(value, BaseException):
        return None, value
    try:
        return encode_output(value), None
    except (InvalidOutputError, OutputNotStorableError) as exc:
        exc.raw_output = value  # salvaged in a described form
        return None, exc
    except BaseException as exc:  # anything a value raises while serialised fails its member alone
        error = InvalidOutputError(
            f"the tool's output cannot be serialised: {type_name(exc)}: {error_text(exc)}"
        )
        error.raw_output = value
        return None, error


def attempt(
    spec: AttemptSpec,
    tell: Callable[[Any], None],
    clock: Callable[[], float] = time.monotonic,
    gate: SendGate | None = None,
    launch: Launch | None = None,
) -> None:
    """Run one attempt on the calling worker and ``tell`` the outcome (never raises).

    ``gate``: the provider's send gate; the request waits there for its turn (spaced at
    the governor's rate: the steps between a grant and the send, such as marking a batch
    of receipts running, would otherwise let granted calls go out in bunches larger
    than the provider's burst). A turn that would come after the call's deadline, or a
    gate closed meanwhile, sends nothing: :class:`~actors.errors.NotSentError`.

    ``launch``: the last check, right before the tool function (or the batch operation,
    after its payload is built): a deadline passed (the ticket's, which a caller who
    joins moves later), an attempt withdrawn meanwhile, a tripped latch or a stop sends
    nothing and is told back as ``UnitFinished(withdrawn=...)``; a wait at the gate ends
    at once for any of them, and gives its booked turn back (:mod:`actors.worker.launch`).
    """
    tool = spec.tool
    ticket = spec.ticket
    traces = spec.traces  # (None unless telemetry is on)
    gated: tuple[str, float] | None = None  # its wait at the send gate, told with its outcome
    if gate is not None and gate.paced:  # an unpaced gate lets every request go at once
        latest = ticket.deadline if ticket is not None else spec.context.deadline
        park = functools.partial(launch.park, ticket) if launch is not None and ticket is not None else None
        since = clock()
        try:
            turn = gate.wait_turn(latest=latest, clock=clock, park=park)
        finally:
            if launch is not None and ticket is not None and ticket.wake is not None:  # it waited
                launch.unpark(ticket)
        until = clock()
        if until - since > GATE_WAIT_MIN_S:
            gated = ("pause" if gate.blocked(since) is not None else "pacing", until - since)
            if traces is not None:
                _waited(traces, gated[0], since, until)
        if not turn:
            refusal = launch.refusal(ticket) if launch is not None else None
            blocked = gate.blocked(clock())
            if refusal is not None:  # withdrawn, tripped or stopped while it waited
                _not_sent(spec, tell, *refusal)
            elif blocked is not None and blocked[1]:
                # the provider's circuit opened meanwhile: its tool queue readmits it
                error = NotSentError(f"{tool.tool_id}: its provider's circuit opened before it was sent")
                tell(UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=error))
            else:
                _past_deadline(spec, tell, "its turn to send came after its deadline", latest)
            return
    sent_at: float | None = None
    report = Report()  # what the tool reports of its request: units used, limits announced
    nest = spec.context._nest  # threads the function starts join it inside ctx.nested()
    token = enter_keys(spec.ancestors.union(spec.context.receipt_keys), nest)  # a nested call of one: a cycle
    try:
        if spec.batched and tool.batch is not None:
            send: Callable[[Any, Any], Any] = tool.batch.batch_fn
            payload = tool.batch.build(spec.inputs)
        else:
            send, payload = tool.fn, spec.payload
        deadline = ticket.deadline if ticket is not None else spec.context.deadline  # a joiner may move it
        if clock() >= deadline:  # passed while it waited or its payload was built
            _past_deadline(spec, tell, "its deadline passed before it was sent", deadline)
            return
        refusal = launch.take(ticket) if launch is not None else None
        if refusal is not None:  # withdrawn, tripped or stopped since it was handed over
            _not_sent(spec, tell, *refusal)
            return
        sent_at = clock()
        with collecting() as report:
            raw = send(payload, spec.context) if traces is None else _traced_send(send, payload, spec, traces)
        values = split_members(tool, spec.inputs, raw) if spec.batched else [raw]
        # a nested call's error given as a member's outcome: that call's, not the request's;
        # an error whose reads raise is told as its stand-in (``tame``), from here on
        relayed_at = [i for i, v in enumerate(values) if is_a(v, BaseException) and relayed_here(token, v)]
        values = [tame(v) if is_a(v, BaseException) else v for v in values]
        relayed = tuple(values[i] for i in relayed_at)
    except BaseException as exc:
        told = tame(exc)
        passed_on = (told,) if relayed_here(token, exc) else ()  # a nested call's error: its request went out
        tell(UnitFinished(
            unit=spec.unit, attempt=spec.attempt, members=None, error=told, sent_at=sent_at,
            relayed=passed_on, replayed=spec.context.replayed, gated=gated, announced=tuple(report.announced),
        ))  # fmt: skip
        if not is_a(exc, Exception):
            raise
        return
    finally:
        leave_keys(token, nest)
    members: list[tuple[Any, BaseException | None]]
    costs: tuple[Any, ...] = ()
    usage: dict[str, float] = {}
    try:
        if tool.units_used is not None or report.usage:
            usage = used_units(tool, spec.inputs, values, report.usage)
        if spec.durable:
            members = [_encode(v) for v in values]
            costs = member_costs(tool, spec.inputs, values, spec.batched)
            if traces is not None and costs:
                for trace, cost in zip(traces, costs, strict=False):
                    if trace is not None:
                        trace.cost = cost
        else:
            members = [(None, v) if is_a(v, BaseException) else (PlainValue(v), None) for v in values]
    except BaseException as exc:  # a guard: the unit is told whatever its values do
        told = tame(exc)
        tell(UnitFinished(
            unit=spec.unit, attempt=spec.attempt, members=None, error=told, sent_at=sent_at,
            replayed=spec.context.replayed, gated=gated,
        ))  # fmt: skip
        return
    tell(UnitFinished(
        unit=spec.unit, attempt=spec.attempt, members=members, error=None, sent_at=sent_at, relayed=relayed,
        replayed=spec.context.replayed, costs=costs, gated=gated, usage=usage,
        announced=tuple(report.announced),
    ))  # fmt: skip


def _traced_send(
    send: Callable[[Any, Any], Any], payload: Any, spec: AttemptSpec, traces: tuple[Any, ...]
) -> Any:
    """``send(payload, spec.context)`` with telemetry on: the call's context attached (a
    batch's: a span linked to its members' calls), so the tool's own spans nest under it."""
    first = next((t for t in traces if t is not None), None)
    if first is None:  # no caller of it is traced (members riding along)
        return send(payload, spec.context)
    sending = first.ins.sending(spec.tool, traces, spec.attempt, spec.batched, spec.context.idempotency_key)
    try:
        raw = send(payload, spec.context)
    except BaseException as exc:
        sending.close(exc)
        raise
    sending.close(None)
    return raw


def _waited(traces: tuple[Any, ...], reason: str, since: float, until: float) -> None:
    for trace in traces:
        if trace is not None:
            trace.wait(reason, since, until)


def _not_sent(spec: AttemptSpec, tell: Callable[[Any], None], kind: str, error: BaseException) -> None:
    tell(UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=error, withdrawn=kind))


def _past_deadline(spec: AttemptSpec, tell: Callable[[Any], None], why: str, deadline: float) -> None:
    if spec.ticket is not None:
        spec.ticket.judged = deadline
    _not_sent(spec, tell, "deadline", NotSentError(f"{spec.tool.tool_id}: {why}; not sent"))
