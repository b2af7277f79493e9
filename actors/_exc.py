"""Reading an exception a tool (or a host's hook) raised, whatever its class does.

Errors come from code this library does not control: an SDK's error whose ``__str__``
formats a response body that is gone, whose ``__getattr__`` looks names up in a dict
(``KeyError`` instead of ``AttributeError``), whose ``__setattr__`` refuses. Reading one
must never raise, or the call it belongs to is never answered (and its slot never
given back). Every read of a foreign exception goes through these.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attr_of", "error_text", "flag_of"]


def error_text(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when the exception's own ``__str__`` raises."""
    try:
        return str(exc) or type(exc).__name__
    except BaseException:  # a __str__ raising anything, SystemExit included: never passed on
        return f"{type(exc).__name__} (its message could not be read)"


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
