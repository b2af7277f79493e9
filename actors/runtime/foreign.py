"""Reading an exception a tool (or a host's hook) raised, whatever its class does.

Errors come from code this library does not control: an SDK's error whose ``__str__``
formats a response body that is gone, whose ``__getattr__`` looks names up in a dict
(``KeyError`` instead of ``AttributeError``), whose ``__setattr__`` refuses, whose
``__class__`` is a proxy's, whose truth is its length. Reading one must never raise, or
the call it belongs to is never answered (and its slot never given back). Every read of
a foreign exception goes through these: its type and name from ``type`` itself
(:func:`is_a`, :func:`type_name`; never ``isinstance``, which asks ``__class__``), its
cause and traceback from ``BaseException``'s slots, its text and attributes guarded; and
never its truth (``is None``, not ``or``).
"""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar, overload

__all__ = [
    "attr_of",
    "cause_of",
    "error_repr",
    "error_text",
    "exc_info_of",
    "flag_of",
    "is_a",
    "tame",
    "traceback_of",
    "type_name",
    "with_traceback",
]

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
    """``repr(exc)``, or ``error_text`` in its class's name when its ``__repr__`` raises."""
    try:
        return str.__str__(repr(exc))  # (a plain str: see error_text)
    except BaseException:  # as in error_text: a foreign __repr__'s error is never passed on
        return f"{type_name(exc)}({error_text(exc)!r})"


def error_text(exc: BaseException) -> str:
    """``str(exc)`` as a plain ``str``, or a stand-in when the exception's own ``__str__``
    raises (a ``__str__`` may also return a str subclass, whose own methods, asked by
    ``in`` or a format, may raise: the text is copied out of it)."""
    try:
        return str.__str__(str(exc)) or type_name(exc)
    except BaseException:  # a __str__ raising anything, SystemExit included: never passed on
        return f"{type_name(exc)} (its message could not be read)"


def tame(exc: BaseException) -> BaseException:
    """``exc`` itself, or, when the reads its caller's code is likely to make of a tool's
    error raise (``isinstance``, which asks ``__class__``; ``__cause__``/``__context__``;
    its class's name; a ProviderError's ``failure_kind``, a RateLimitedError's
    ``retry_after``), an :class:`~actors.errors.UnreadableToolError` holding it as
    ``original``. Made once, where the tool's function raised. An error that passes may
    still misbehave later (a ``__class__`` that raises on another thread only): this
    library's own reads after it go by the helpers above all the same."""
    from actors.errors import ProviderError, RateLimitedError, UnreadableToolError

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
    (``getattr`` catches only ``AttributeError``), SystemExit included: a lookup runs on
    an actor's thread, which such an error would end."""
    try:
        return getattr(obj, name, default)
    except BaseException:
        return default


def flag_of(obj: Any, name: str, default: bool) -> bool:
    """The truth of ``obj.name`` (``default`` when it is missing, or reading or judging it
    raises)."""
    value = attr_of(obj, name, default)
    try:
        return bool(value)
    except BaseException:  # (as in attr_of)
        return default
