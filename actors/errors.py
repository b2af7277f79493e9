"""Errors of the dispatcher. All derive from :class:`stores.ToolDispatchError`."""

from __future__ import annotations

from actors.runtime.foreign import error_repr
from stores.errors import (
    InvalidInputError,
    InvalidOutputError,
    OutputNotStorableError,
    StoreError,
    ToolDispatchError,
)
from stores.types import FailureKind

__all__ = [
    "AuthScopeChangedError",
    "BudgetExceededError",
    "CallCancelledError",
    "CallCycleError",
    "DispatchError",
    "InvalidInputError",
    "InvalidOutputError",
    "LeaseLostError",
    "NotSentError",
    "OutputNotStorableError",
    "PersistenceCircuitOpenError",
    "ProviderError",
    "ProviderUnavailableError",
    "ProviderUnreachableError",
    "RateLimitedError",
    "ReceiptPersistenceError",
    "ReceiptWaitTimeoutError",
    "RecordedFailureError",
    "StoreError",
    "SuspendedError",
    "ToolDispatchError",
    "ToolTimeoutError",
    "UncertainOutcomeError",
    "UnknownToolError",
    "UnreadableToolError",
]


class DispatchError(ToolDispatchError):
    """Base of errors raised by the dispatch system (not by the store)."""


class UnknownToolError(DispatchError, LookupError):
    """``execute`` named a tool the system was not started with."""


class BudgetExceededError(DispatchError):
    """A budget (provider calls, retries, receipt operations) is spent; the call was refused."""


class PersistenceCircuitOpenError(DispatchError):
    """The latch is tripped: receipts cannot be persisted, so no provider call starts."""


class LeaseLostError(DispatchError):
    """Our lease on the receipt was taken (expired and reclaimed); the result is not ours to store."""


class ReceiptWaitTimeoutError(DispatchError):
    """Waited for another owner's live lease past the bounded attempts; never stolen."""


class CallCycleError(DispatchError):
    """A tool's function called a call it runs inside (same tool, same input: the same
    receipt key), itself or through other tools (A calls B, B calls A): that call would
    wait for its own result. Refused at once; the tool's own call goes on."""


class CallCancelledError(DispatchError):
    """The dispatcher stopped (or the run was aborted) before the call started."""


class ReceiptPersistenceError(DispatchError):
    """Recording a result or failure failed; carries the tool's own error as ``cause`` when any."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        if cause is not None:  # often a tool's own error, whose __repr__ may raise
            message = f"{message}; the call had failed with: {error_repr(cause)}"
        super().__init__(message)
        self.cause = cause


class RecordedFailureError(DispatchError):
    """The receipt holds a non-retryable failure from an earlier run (normal mode reuses it)."""

    def __init__(self, message: str, *, failure_kind: FailureKind | None) -> None:
        super().__init__(message)
        self.failure_kind = failure_kind


class ProviderError(DispatchError):
    """Raised by tools for a provider failure of a known kind.

    Args:
        message: what happened.
        failure_kind: how to record it (decides whether a later claim re-runs it).
        retry_in_call: see below (default: the class's).

    Attributes:
        failure_kind: how it is recorded.
        retry_in_call: whether another attempt within the same call may help (for a
            transient kind). False when the failure says the provider is down rather than
            busy: the call fails at once and the provider's circuit counts it.
        sent: True when the request may have reached the provider (its connection broke
            after sending): for a tool that is not retry-safe the outcome is ``uncertain``.
    """

    failure_kind: FailureKind = FailureKind.PERMANENT
    retry_in_call: bool = True
    sent: bool = False

    def __init__(
        self, message: str = "", *, failure_kind: FailureKind | None = None, retry_in_call: bool | None = None
    ) -> None:
        super().__init__(message)
        if failure_kind is not None:
            self.failure_kind = failure_kind
        if retry_in_call is not None:
            self.retry_in_call = retry_in_call


class RateLimitedError(ProviderError):
    """The provider answered 429 (or 503 with Retry-After): backpressure.

    Args:
        message: what happened.
        retry_after: the raw ``Retry-After`` header value (RFC 9110 section 10.2.3), or None.
    """

    failure_kind = FailureKind.RATE_LIMITED

    def __init__(self, message: str = "rate limited", *, retry_after: str | float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProviderUnavailableError(ProviderError):
    """The provider's circuit is open: its last calls all failed as unavailable
    (connection errors, 5xx, timeouts), so this call was refused without being sent.
    Its receipt stays pending: a later run calls it."""

    failure_kind = FailureKind.TRANSIENT


class ProviderUnreachableError(ProviderError):
    """The provider could not be reached at all (connection refused, no route, name not
    resolved): nothing was sent. Transient, but not retried within the call (an attempt
    a second later meets the same closed port); counted as unavailable by the
    provider's circuit, which opens after a few such calls, from parallel calls at once."""

    failure_kind = FailureKind.TRANSIENT
    retry_in_call = False


class ToolTimeoutError(ProviderError):
    """The tool did not return within its timeout."""

    failure_kind = FailureKind.TIMEOUT


class NotSentError(ToolTimeoutError):
    """The call's turn to send came after its deadline (a provider pause or pacing held it
    at the send gate); nothing was sent. The call is re-admitted; recorded (kind timeout,
    retryable) only when re-admissions run out."""


class SuspendedError(DispatchError):
    """Raised by a tool when the host pauses the run: receipts are released, not failed."""


class UncertainOutcomeError(RecordedFailureError):
    """A call to a tool that is not retry-safe may have reached its provider (it timed out
    or its connection broke after sending, or its owner died while it ran): its receipt
    is ``uncertain`` and is not run again silently. Without a ``reconcile`` hook on the
    tool, an operator decides: ``tooldispatch receipts resolve KEY --rerun | --fail``."""


class AuthScopeChangedError(DispatchError):
    """Raised by a tool when its credentials changed mid-run: keys are recomputed, re-queued once."""


class UnreadableToolError(DispatchError):
    """A tool raised an error this library cannot read: asking its type (``isinstance``
    asks its ``__class__``), its cause, its class's name or a ProviderError's
    ``failure_kind`` raised. Its call fails with this stand-in instead (recorded as a
    permanent failure), so no reading of it can fail anything else.

    Attributes:
        original: the error the tool raised.
    """

    def __init__(self, message: str, original: BaseException) -> None:
        super().__init__(message)
        self.original = original
