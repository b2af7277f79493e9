"""What the lifecycle hands to a worker, and how it judges what comes back.

An attempt is fixed on the tool queue actor (:class:`AttemptSpec`, made by
:func:`spec_for`) with its permission to send (:class:`SendTicket`, taken or withdrawn
under :class:`~actors.worker.launch.Launch`'s lock); the worker runs it and reports an
outcome, whose error the lifecycle classifies here (:func:`failure_kind_for`,
:func:`transient`, :func:`retry_in_call`).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Literal

import attrs

from actors.errors import (
    InvalidInputError,
    NotSentError,
    ProviderError,
    RateLimitedError,
    attr_of,
    flag_of,
    is_a,
)
from actors.lifecycle.calls import Group, Role, Unit
from actors.results import ToolContext, batch_idempotency_key, provider_idempotency_key
from actors.runtime.nesting import NestScope
from actors.tool import Tool
from stores.codec import decode_output, encode_output
from stores.keys import canonical_json
from stores.types import BatchRecord, FailureKind

__all__ = [
    "AttemptSpec",
    "PlainValue",
    "Refusal",
    "SendTicket",
    "WithdrawKind",
    "batch_record",
    "failure_kind_for",
    "plain_value",
    "recorded_input",
    "recorded_value",
    "retry_in_call",
    "spec_for",
    "transient",
]


WithdrawKind = Literal["cancelled", "lease_lost", "stopped", "latch", "deadline"]
"""Why an attempt was not sent: its callers left, its lease was lost, the system stopped,
the latch tripped, its deadline passed (or its turn at the gate came after it)."""

Refusal = tuple[WithdrawKind, BaseException]
"""What :meth:`Launch.take` answers for an attempt that must not be sent."""


class SendTicket:
    """One attempt's permission to send: taken by its worker, or withdrawn first (one of
    the two, under :class:`Launch`'s lock). Plain data; only :class:`Launch` changes it."""

    __slots__ = ("deadline", "judged", "refusal", "sent", "wake")

    def __init__(self, deadline: float = float("inf")) -> None:
        self.deadline = deadline
        """``time.monotonic()`` after which it is not worth sending; its tool queue moves
        it later when a more patient caller joins (a float, read as a snapshot)."""
        self.judged = deadline
        """The deadline its worker judged it by when it refused it for its deadline."""
        self.sent = False
        """The worker took it: the request went (or is going) out."""
        self.refusal: Refusal | None = None
        """Withdrawn by the tool queue, and why."""
        self.wake: threading.Event | None = None
        """Set to wake its sender from a wait at the gate (only while it waits there)."""


def failure_kind_for(exc: BaseException) -> FailureKind:
    """How a tool error is recorded: ProviderError says; timeouts and connection
    errors are transient; invalid input is invalid_input; anything else permanent."""
    if is_a(exc, ProviderError):  # (reads that may raise, of a foreign error: never raise here)
        kind = attr_of(exc, "failure_kind")
        return kind if is_a(kind, FailureKind) else FailureKind.PERMANENT
    if is_a(exc, (TimeoutError, concurrent.futures.TimeoutError)):
        return FailureKind.TIMEOUT
    if is_a(exc, (ConnectionError, OSError)):
        return FailureKind.TRANSIENT
    if is_a(exc, InvalidInputError):
        return FailureKind.INVALID_INPUT
    return FailureKind.PERMANENT


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the provider could not serve at all (connection errors,
    5xx, timeouts): retried in-call (retry-safe tools), and counted by the circuit."""
    return not is_a(exc, (RateLimitedError, NotSentError)) and failure_kind_for(exc) in (
        FailureKind.TRANSIENT,
        FailureKind.TIMEOUT,
    )


def retry_in_call(exc: BaseException) -> bool:
    """Whether another in-call attempt may help: transient, and not marked otherwise
    (an error with ``retry_in_call = False``, such as a refused connection, is evidence
    for the circuit, not worth another attempt)."""
    return transient(exc) and flag_of(exc, "retry_in_call", True)


@attrs.frozen(kw_only=True)
class AttemptSpec:
    """Everything one attempt needs, fixed on the actor before it is handed to the pool."""

    unit: int
    attempt: int
    tool: Tool
    payload: Any
    inputs: list[Any]
    batched: bool
    context: ToolContext
    durable: bool
    ancestors: frozenset[str] = frozenset()
    """The receipt keys of the tool calls its nested callers were made inside."""
    ticket: SendTicket | None = None
    """Its permission to send, taken right before the request (:mod:`actors.worker.launch`)."""
    traces: tuple[Any, ...] | None = None
    """Telemetry on: each member's owner call's trace (``Call.trace``, or None), in member
    order; None when telemetry is off."""


def _canonical_key(unit: Unit) -> str:
    """``unit``'s members put in one canonical order, by their provider idempotency keys
    (``unit.groups`` is sorted in place), and the request's idempotency key: the single
    member's, or :func:`~actors.results.batch_idempotency_key` of them all."""
    groups = unit.groups
    idem = [provider_idempotency_key(g.key, g.receipt.generation if g.receipt else None) for g in groups]
    if len(groups) == 1:
        return idem[0]
    order = sorted(range(len(groups)), key=idem.__getitem__)
    groups[:] = [groups[i] for i in order]
    return batch_idempotency_key(idem[i] for i in order)


def recorded_input(value: Any) -> str:
    """A member's input as a batch record keeps it: the stored-output text (JSON, dict
    order kept, exact); canonical JSON for what that refuses (a tuple in an input)."""
    try:
        return encode_output(value)
    except Exception:
        return canonical_json(value)


def batch_record(unit: Unit) -> BatchRecord:
    """The request ``unit`` (of a batch tool) is about to send, as its store records it
    before it goes (``mark_running_many(batches=...)``): its members in the canonical
    order (``unit.groups`` sorted in place), its key, their inputs. A tool that keeps no
    raw input in the store (``Tool.keep_input`` not True) has none recorded (None each):
    a takeover rebuilds the request from its own calls' inputs (their input hashes are
    on the members' receipts)."""
    key = _canonical_key(unit)
    groups = unit.groups
    tool = groups[0].tool
    kept = tool.keep_input is True
    return BatchRecord(
        key=key, tool_id=tool.tool_id, members=tuple(g.key for g in groups),
        inputs=tuple(recorded_input(g.input) if kept else None for g in groups),
    )  # fmt: skip


def recorded_value(text: str) -> Any:
    """A member's input as its batch record kept it (:func:`recorded_input`), for a request
    sent again."""
    return decode_output(text)


def spec_for(
    unit: Unit, attempt_no: int, now: float, ticket: SendTicket | None = None, traced: bool = False
) -> AttemptSpec:
    """The attempt ``attempt_no`` of ``unit``; its context gives the time left to the deadline.
    ``traced``: telemetry is on (the members' owners' traces go with it, ``AttemptSpec.traces``).

    A unit with a record (``Unit.record``: recorded before its first send, or taken over
    from a lost owner) sends exactly the recorded request: its members in the recorded
    order (the answer's members are matched to them by position), under the recorded
    key. Otherwise the members are first put in one canonical order, by their provider
    idempotency keys (:func:`_canonical_key`): the same members make the same request,
    so a provider that replays a stored answer for the key answers in the order sent.
    """
    tool = unit.groups[0].tool
    groups = unit.groups
    key = unit.record.key if unit.record is not None else _canonical_key(unit)
    deadline = unit.deadline if unit.deadline is not None else now + unit.timeout_s
    context = ToolContext(
        tool_id=tool.tool_id,
        idempotency_key=key,
        receipt_keys=tuple(g.key for g in groups),
        credential_scope_digest=groups[0].credential_digest,
        deadline=deadline,
        timeout_s=max(0.001, deadline - now),
        attempt=attempt_no,
        _nest=NestScope(),
    )
    batched = tool.batch is not None and len(groups) > 1
    inputs = [g.input for g in groups]
    payload = None if batched else inputs[0]  # a batch payload is built on the worker
    return AttemptSpec(
        unit=unit.id, attempt=attempt_no, tool=tool, payload=payload, inputs=inputs, batched=batched,
        context=context, durable=tool.durable, ancestors=frozenset().union(*(g.ancestors for g in groups)),
        ticket=ticket, traces=tuple(_owner_trace(g) for g in groups) if traced else None,
    )  # fmt: skip


def _owner_trace(group: Group) -> Any:
    """The trace of the call ``group``'s execution answers ``live`` (its owner), or None."""
    for call in group.calls:
        if call.role is Role.OWNER:
            return call.trace
    return None


@attrs.frozen
class PlainValue:
    """A non-durable tool's output, handed over as is (it is never stored)."""

    value: Any


def plain_value(member: Any) -> Any:
    """The value of a non-durable member (see :func:`attempt`)."""
    return member.value if isinstance(member, PlainValue) else member
