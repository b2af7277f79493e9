"""Reading an exception a tool (or a host's hook) raised, whatever its class does.

Errors come from code this library does not control: an SDK's error whose ``__str__``
formats a response body that is gone, whose ``__getattr__`` looks names up in a dict
(``KeyError`` instead of ``AttributeError``), whose ``__setattr__`` refuses. Reading one
must never raise, or the call it belongs to is never answered (and its slot never
given back). Every read of a foreign exception goes through these.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attr_of", "cause_of", "error_text", "flag_of", "is_a", "tame", "type_name"]

_NAME = type.__dict__["__name__"]
"""``type.__name__`` itself: a metaclass's own ``__name__`` (one that raises) is passed by."""
_CAUSE = BaseException.__dict__["__cause__"]
"""The slot ``raise ... from`` sets: a subclass's ``__cause__`` property is passed by."""


def type_name(obj: Any) -> str:
    """The name of ``obj``'s class, whatever its metaclass says."""
    try:
        return str(_NAME.__get__(type(obj)))
    except Exception:
        return "an object"


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


def error_text(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` raises."""
    try:
        return str(exc) or type_name(exc)
    except BaseException:  # a __str__ raising anything, SystemExit included: never passed on
        return f"{type_name(exc)} (its message could not be read)"


def tame(exc: BaseException) -> BaseException:
    """``exc`` itself, or, when the reads this library makes of a tool's error raise
    (``isinstance``, which asks ``__class__``; ``__cause__``/``__context__``; its class's
    name; a ProviderError's ``failure_kind``, a RateLimitedError's ``retry_after``), an
    :class:`~actors.errors.UnreadableToolError` holding it as ``original``. Made once,
    where the tool's function raised, so nothing after it reads the foreign object."""
    from .errors import ProviderError, RateLimitedError, UnreadableToolError

    try:
        isinstance(exc, _Probe)  # a class it is not: isinstance asks its __class__
        exc.__cause__  # noqa: B018 - each read may raise: that is what is checked
        exc.__context__  # noqa: B018
        str(type(exc).__name__)
        if isinstance(exc, ProviderError):
            exc.failure_kind  # noqa: B018
        if isinstance(exc, RateLimitedError):
            exc.retry_after  # noqa: B018
    except BaseException:  # whatever it raised, SystemExit included: the error is unreadable
        return UnreadableToolError(
            f"the tool raised a {type_name(exc)} this library cannot read (asking its type or "
            f"attributes raised): {error_text(exc)}",
            exc,
        )
    return exc


class _Probe:
    """A class no error is an instance of (see :func:`tame`)."""


def attr_of(obj: Any, name: str, default: Any = None) -> Any:
    """``getattr(obj, name, default)``, and ``default`` when looking it up raises anything
    (``getattr`` catches only ``AttributeError``)."""
    try:
        return getattr(obj, name, default)
    except Exception:
        return default


def flag_of(obj: Any, name: str, default: bool) -> bool:
    """The truth of ``obj.name`` (``default`` when it is missing, or reading or judging it
    raises)."""
    value = attr_of(obj, name, default)
    try:
        return bool(value)
    except Exception:
        return default
