"""Errors of the dispatcher, and safe reads of errors raised by code it does not control.

Our errors all derive from :class:`stores.ToolDispatchError`.

Errors also come from code this library does not control: an SDK's error whose ``__str__``
formats a response body that is gone, whose ``__getattr__`` looks names up in a dict
(``KeyError`` instead of ``AttributeError``), whose ``__setattr__`` refuses, whose
``__class__`` is a proxy's, whose truth is its length. Reading one must never raise, or
the call it belongs to is never answered (and its slot never given back). Every read of
a foreign exception goes through these: its type and name from ``type`` itself
(:func:`is_a`, :func:`type_name`; never ``isinstance``, which asks ``__class__``), its
cause and traceback from ``BaseException``'s slots, its text and attributes guarded; and
never its truth (``is None``, not ``or``). Its text is cut to
:data:`stores.quoting.MAX_ERROR_CHARS` (a message that quotes a whole input or answer
is never carried whole).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, TypeGuard, TypeVar, overload

from stores.errors import (
    InputTooLargeError,
    InvalidInputError,
    InvalidOutputError,
    OutputNotStorableError,
    StoreError,
    ToolDispatchError,
)
from stores.quoting import shorten
from stores.types import FailureKind

__all__ = [
    "AuthScopeChangedError",
    "BudgetExceededError",
    "CallCancelledError",
    "CallCycleError",
    "DispatchError",
    "InputTooLargeError",
    "InvalidInputError",
    "InvalidOutputError",
    "LeaseLostError",
    "NotSentError",
    "OutputNotStorableError",
    "PersistenceCircuitOpenError",
    "ProviderError",
    "ProviderUnavailableError",
    "ProviderUnreachableError",
    "QuotaExhaustedError",
    "RateLimitedError",
    "ReceiptPersistenceError",
    "ReceiptWaitTimeoutError",
    "RecordedFailureError",
    "ResultSalvagedError",
    "StoreError",
    "SuspendedError",
    "ToolDispatchError",
    "ToolTimeoutError",
    "UncertainOutcomeError",
    "UnknownToolError",
    "UnreadableToolError",
    "attr_of",
    "cause_chain",
    "cause_of",
    "error_repr",
    "error_text",
    "exc_info_of",
    "flag_of",
    "hosts_own",
    "is_a",
    "note_signalled",
    "signalled",
    "tame",
    "traceback_of",
    "type_name",
    "with_traceback",
]

# -- reading a foreign error ------------------------------------------------------------

_T = TypeVar("_T")

_NAME = type.__dict__["__name__"]
"""``type.__name__`` itself: a metaclass's own ``__name__`` (one that raises) is passed by."""
_CAUSE = BaseException.__dict__["__cause__"]
"""The slot ``raise ... from`` sets: a subclass's ``__cause__`` property is passed by."""
_TRACEBACK = BaseException.__dict__["__traceback__"]
"""The slot ``raise`` fills: a subclass's ``__traceback__`` property is passed by."""
_WITH_TRACEBACK = BaseException.with_traceback
"""``with_traceback`` itself: a subclass's own (one that raises) is passed by."""


def type_name(obj: Any) -> str:
    """The name of ``obj``'s class, whatever its metaclass says."""
    try:
        return str.__str__(_NAME.__get__(type(obj)))  # a plain str, whatever str subclass it is
    except Exception:
        return "an object"


@overload
def is_a(obj: Any, classes: type[_T]) -> TypeGuard[_T]: ...
@overload
def is_a(obj: Any, classes: tuple[type, ...]) -> bool: ...


def is_a(obj: Any, classes: type | tuple[type, ...]) -> bool:
    """``isinstance(obj, classes)`` judged by ``obj``'s real type (``isinstance`` also asks
    ``obj.__class__``, which a foreign object may make raise); False if even that raises."""
    try:
        return issubclass(type(obj), classes)
    except Exception:
        return False


def cause_of(exc: BaseException) -> BaseException | None:
    """What ``exc`` was explicitly raised from (``raise X from e``), read from the slot."""
    try:
        cause = _CAUSE.__get__(exc)
    except Exception:
        return None
    return cause if is_a(cause, BaseException) else None


def cause_chain(exc: BaseException, depth: int = 8) -> Iterator[BaseException]:
    """``exc``, then what it was explicitly raised from (``raise X from e``), ``depth`` at most."""
    link: BaseException | None = exc
    for _ in range(depth):
        if link is None:
            return
        yield link
        link = cause_of(link)  # the slot: a foreign __cause__ property may raise


def traceback_of(exc: BaseException) -> Any:
    """``exc.__traceback__``, read from the slot (None if even that cannot be read)."""
    try:
        return _TRACEBACK.__get__(exc)
    except Exception:
        return None


def exc_info_of(exc: BaseException) -> tuple[type[BaseException], BaseException, Any]:
    """``(type, value, traceback)`` of ``exc`` for a future's ``set_exception``, read
    without asking ``exc`` anything."""
    return type(exc), exc, traceback_of(exc)


def with_traceback(exc: BaseException, tb: Any) -> BaseException:
    """``exc.with_traceback(tb)`` by ``BaseException``'s own method (a subclass's may
    raise), ready to be raised."""
    try:
        return _WITH_TRACEBACK(exc, tb)
    except Exception:  # a traceback that is not one: raised with its own
        return exc


def error_repr(exc: BaseException) -> str:
    """``repr(exc)``, or ``error_text`` in its class's name when its ``__repr__`` raises;
    cut to :data:`~stores.quoting.MAX_ERROR_CHARS`."""
    try:
        return shorten(str.__str__(repr(exc)))  # (a plain str: see error_text)
    except BaseException as raised:  # as in error_text: a foreign __repr__'s error is never passed on
        if signalled(raised):
            raise
        return f"{type_name(exc)}({error_text(exc)!r})"


def error_text(exc: BaseException) -> str:
    """``str(exc)`` as a plain ``str`` cut to :data:`~stores.quoting.MAX_ERROR_CHARS`
    (head and tail kept), or a stand-in when the exception's own ``__str__`` raises (a
    ``__str__`` may also return a str subclass, whose own methods, asked by ``in`` or a
    format, may raise: the text is copied out of it)."""
    try:
        return shorten(str.__str__(str(exc))) or type_name(exc)
    except BaseException as raised:  # a __str__ raising anything, SystemExit included: never passed on
        if signalled(raised):
            raise
        return f"{type_name(exc)} (its message could not be read)"


def tame(exc: BaseException) -> BaseException:
    """``exc`` itself, or, when the reads its caller's code is likely to make of a tool's
    error raise (``isinstance``, which asks ``__class__``; ``__cause__``/``__context__``;
    its class's name; a ProviderError's ``failure_kind``, a RateLimitedError's
    ``retry_after``), an :class:`~actors.errors.UnreadableToolError` holding it as
    ``original``. Made once, where the tool's function raised. An error that passes may
    still misbehave later (a ``__class__`` that raises on another thread only): this
    library's own reads after it go by the helpers above all the same."""
    try:
        isinstance(exc, _Probe)  # a class it is not: isinstance asks its __class__
        exc.__cause__  # noqa: B018 - each read may raise: that is what is checked
        exc.__context__  # noqa: B018
        str(type(exc).__name__)
        if isinstance(exc, ProviderError):
            exc.failure_kind  # noqa: B018
        if isinstance(exc, RateLimitedError):
            exc.retry_after  # noqa: B018
    except BaseException as raised:  # whatever it raised, SystemExit included: the error is unreadable
        if signalled(raised):
            raise
        return UnreadableToolError(
            f"the tool raised a {type_name(exc)} this library cannot read (asking its type or "
            f"attributes raised): {error_text(exc)}",
            exc,
        )
    return exc


_SIGNALLED: deque[BaseException] = deque(maxlen=16)
"""The latest errors the host's signal handlers raised (noted by
:mod:`actors.runtime.host_signals`)."""


def note_signalled(exc: BaseException) -> None:
    """``exc`` was raised by one of the host's signal handlers: it is the host's."""
    _SIGNALLED.append(exc)


def signalled(exc: BaseException) -> bool:
    """Whether one of the host's signal handlers raised ``exc`` (its ``SystemExit`` or
    ``KeyboardInterrupt``, say): no catch-all of this library may swallow it or make it a
    call's error, though the same type raised by a tool, an input or a credentials function
    is that call's error."""
    return any(seen is exc for seen in tuple(_SIGNALLED))


def hosts_own(exc: BaseException) -> bool:
    """Whether ``exc``, caught on the caller's thread, is the caller's to handle rather than
    one call's error: a ``KeyboardInterrupt`` (Ctrl-C, whoever raised it), or what a
    signal handler raised."""
    return is_a(exc, KeyboardInterrupt) or signalled(exc)


class _Probe:
    """A class no error is an instance of (see :func:`tame`)."""


def attr_of(obj: Any, name: str, default: Any = None) -> Any:
    """``getattr(obj, name, default)``, and ``default`` when looking it up raises anything
    (``getattr`` catches only ``AttributeError``), SystemExit included: a lookup runs on
    an actor's thread, which such an error would end."""
    try:
        return getattr(obj, name, default)
    except BaseException as raised:
        if signalled(raised):
            raise
        return default


def flag_of(obj: Any, name: str, default: bool) -> bool:
    """The truth of ``obj.name`` (``default`` when it is missing, or reading or judging it
    raises)."""
    value = attr_of(obj, name, default)
    try:
        return bool(value)
    except BaseException as raised:  # (as in attr_of)
        if signalled(raised):
            raise
        return default


# -- the error tree --------------------------------------------------------------------


class DispatchError(ToolDispatchError):
    """Base of errors raised by the dispatch system (not by the store)."""


class UnknownToolError(DispatchError, LookupError):
    """``execute`` named a tool the system was not started with."""


class BudgetExceededError(DispatchError):
    """A budget (provider calls, retries, receipt operations, money) is spent, or the call
    would pass it: it was refused before it was sent, its receipt (if any) left pending."""


class QuotaExhaustedError(DispatchError):
    """A provider's quota (a :class:`~actors.tool.Limit` over a minute, an hour, a day) is
    spent, and its window renews after the call's timeout: the call was refused at once,
    without being sent, its receipt left pending (a later run pays for it).

    Attributes:
        limit: the limit, as :attr:`actors.tool.Limit.name` says it (``"1000 requests/day"``).
        reset_s: seconds from the refusal until the quota has room again.
    """

    def __init__(self, message: str, limit: str = "", reset_s: float = 0.0) -> None:
        super().__init__(message)
        self.limit = limit
        self.reset_s = reset_s


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


class ResultSalvagedError(CallCancelledError):
    """The dispatcher stopped (an abort whose bound ran out) while this call's paid
    result was being stored: the result is kept in the salvage file, and the next run
    (or ``tooldispatch salvage replay``) stores it from there; the tool is not called
    again. A :class:`CallCancelledError`: the call did not finish, and it is no failure."""


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
