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
from actors.lifecycle.calls import Unit
from actors.results import ToolContext, batch_idempotency_key, provider_idempotency_key
from actors.runtime.nesting import NestScope
from actors.tool import Tool
from stores.types import FailureKind

__all__ = [
    "AttemptSpec",
    "PlainValue",
    "Refusal",
    "SendTicket",
    "WithdrawKind",
    "failure_kind_for",
    "plain_value",
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


def spec_for(unit: Unit, attempt_no: int, now: float, ticket: SendTicket | None = None) -> AttemptSpec:
    """The attempt ``attempt_no`` of ``unit``; its context gives the time left to the deadline.

    A batch's members are first put in one canonical order, by their provider idempotency
    keys (``unit.groups`` is sorted in place: the answer's members are matched to it by
    position). Its idempotency key does not depend on the order
    (:func:`~actors.results.batch_idempotency_key`), so the same members must make the
    same request: a provider that replays a stored answer for that key (a batch the
    killed run sent, sent again whole by the rerun) answers in the order first sent, and
    members in another order would each get another member's result.
    """
    tool = unit.groups[0].tool
    groups = unit.groups
    idem = [provider_idempotency_key(g.key, g.receipt.generation if g.receipt else None) for g in groups]
    if len(groups) > 1:
        order = sorted(range(len(groups)), key=idem.__getitem__)
        groups[:] = [groups[i] for i in order]
        idem = [idem[i] for i in order]
    deadline = unit.deadline if unit.deadline is not None else now + unit.timeout_s
    context = ToolContext(
        tool_id=tool.tool_id,
        idempotency_key=idem[0] if len(groups) == 1 else batch_idempotency_key(idem),
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
        ticket=ticket,
    )  # fmt: skip


@attrs.frozen
class PlainValue:
    """A non-durable tool's output, handed over as is (it is never stored)."""

    value: Any


def plain_value(member: Any) -> Any:
    """The value of a non-durable member (see :func:`attempt`)."""
    return member.value if isinstance(member, PlainValue) else member
