"""How a call's failure is recorded: its error text and failure kind, and whether it is
``uncertain`` (a tool that is not retry-safe may have acted). Rules: docs/how-it-works.md,
the disposition table; SEMANTICS (Failure, suspension; uncertain)."""

from __future__ import annotations

from typing import Any

import pykka

from actors.errors import (
    CallCancelledError,
    InvalidOutputError,
    LeaseLostError,
    NotSentError,
    OutputNotStorableError,
    PersistenceCircuitOpenError,
    ProviderError,
    ProviderUnavailableError,
    ProviderUnreachableError,
    ReceiptWaitTimeoutError,
    ToolTimeoutError,
    UncertainOutcomeError,
    cause_chain,
    error_text,
    flag_of,
    is_a,
)
from actors.lifecycle.attempts import failure_kind_for
from actors.lifecycle.exits import RELEASE_ON, TooLarge
from actors.tool import Tool
from stores import output_too_large_error
from stores.types import FailureKind

__all__ = ["PASSING", "exiting", "failure_record", "may_have_acted", "passing"]

PASSING = (
    *RELEASE_ON, LeaseLostError, CallCancelledError, ReceiptWaitTimeoutError, PersistenceCircuitOpenError,
    ProviderUnavailableError, UncertainOutcomeError, ToolTimeoutError, pykka.Timeout,
)  # fmt: skip
"""Refusals of a call for a reason that passes (stopped, a wait ran out: the caller's
timeout on a running call or on a receipt, or a tool's own ``get(timeout=)``; suspended,
the run's budget, lease lost, circuit open, an outcome not yet reconciled). A tool that passes one on from a
nested call (raised, or the explicit cause of what it raised) made its own request:
retry-safe, it is recorded ``transient`` (a later call runs it again and completes it);
not retry-safe, ``uncertain`` (it acted; never re-run silently)."""


def passing(exc: BaseException) -> bool:
    """``exc``, or an error it was explicitly raised from (a few levels), is a refusal
    that passes (:data:`PASSING`)."""
    return any(is_a(link, PASSING) for link in cause_chain(exc))


def exiting(exc: BaseException) -> bool:
    """``exc`` (or an error it was raised from) refused the function's work because the
    interpreter is exiting: ``concurrent.futures`` schedules nothing once its shutdown
    began, before ``atexit`` stops the system. Not the provider's answer nor the
    input's fault: recorded as a stop (``transient``; ``uncertain`` if not retry-safe)."""
    shut = "interpreter shutdown"
    return any(is_a(link, RuntimeError) and shut in error_text(link) for link in cause_chain(exc))


def may_have_acted(tool: Tool, exc: BaseException, relayed: bool = False) -> bool:
    """A tool that is not retry-safe whose request may have reached the provider: it
    timed out, or its connection broke, after sending (a refused connection sent
    nothing); or, ``relayed``, its request went out and then a nested call of its failed
    for a reason a rerun would retry. Recorded ``uncertain``: never re-run silently."""
    if tool.retry_safe:
        return False
    if relayed:  # it acted (its request went out); a kind a rerun would retry must not re-run it silently
        return passing(exc) or failure_kind_for(exc).retryable
    if exiting(exc):  # cut short by the exit, perhaps after its own request
        return True
    # by its real type (a tool's error's own __class__ may lie, or raise)
    if is_a(exc, (ProviderUnreachableError, NotSentError, ConnectionRefusedError)):
        return False
    if is_a(exc, ProviderError):
        return is_a(exc, ToolTimeoutError) or flag_of(exc, "sent", False)
    return is_a(exc, (TimeoutError, ConnectionError))


def failure_record(exc: BaseException, relayed: bool, salvage_path: str) -> tuple[str, Any]:
    """(error text, ``FailureKind``) to record for ``exc`` (``relayed``: passed on by the
    tool from a nested call; ``salvage_path``: named where a paid answer was kept)."""
    if is_a(exc, TooLarge):
        return output_too_large_error(exc.size_bytes, salvage_path), FailureKind.OUTPUT_TOO_LARGE
    if is_a(exc, InvalidOutputError):
        return error_text(exc), FailureKind.PERMANENT
    if is_a(exc, OutputNotStorableError):  # paid for: never re-paid by a normal rerun
        # recorded permanent, as an InvalidOutputError (a kind every version reads)
        return (
            f"{error_text(exc)}; the answer was salvaged to {salvage_path} (tooldispatch "
            "salvage ls); run with retry_failed or force_refresh to call the provider again"
        ), FailureKind.PERMANENT
    if (relayed and passing(exc)) or exiting(exc):
        return error_text(exc), FailureKind.TRANSIENT
    kind = failure_kind_for(exc)
    if (
        kind is FailureKind.TRANSIENT
        and not relayed
        and is_a(exc, ProviderError)
        and flag_of(exc, "sent", False)
    ):
        # its connection broke after sending: no answer came, as for a timeout, so the next
        # attempt asks under the same idempotency key (stores.next_generation)
        return error_text(exc), FailureKind.TIMEOUT
    return error_text(exc), kind
