"""Quoting values in messages: an error text or a report never carries a whole input or output.

An input may be 32 MiB (:data:`stores.inputs.MAX_INPUT_BYTES`), an output too, and a
provider's error often echoes what it was sent. A message quotes a value through
:func:`brief` (a bounded ``repr``, :data:`QUOTE_CHARS`), and a whole error text, which
may itself quote one, is cut by :func:`shorten` to :data:`MAX_ERROR_CHARS` where it is
kept (a receipt's error, a row's error in ``tooldispatch run``'s output, a report). A
receipt keeps what its call was for cut likewise (:func:`kept_input`,
:data:`INPUT_TEXT_MAX_CHARS`), and any text it keeps in a form every backend stores
(:func:`storable`).
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = [
    "INPUT_TEXT_MAX_CHARS",
    "MAX_ERROR_CHARS",
    "QUOTE_CHARS",
    "brief",
    "kept_input",
    "shorten",
    "storable",
]

QUOTE_CHARS = 200
"""Most characters of a value quoted in a message (:func:`brief`)."""

MAX_ERROR_CHARS = 2000
"""Most characters of an error text kept: recorded in a receipt, written to a row's
output, shown in a report (:func:`shorten`)."""


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text``, or its head and tail joined by ``…[N chars cut]…`` so that it holds at
    most ``limit`` characters (plus the marker's few digits).

    Args:
        text: any text.
        limit: most characters kept, >= 1 (a quarter of them from the end).
    """
    if len(text) <= limit:
        return text
    tail = limit // 4
    head = limit - tail
    return f"{text[:head]}…[{len(text) - head - tail} chars cut]…{text[len(text) - tail :] if tail else ''}"


class _Brief(reprlib.Repr):
    """reprlib's bounded repr: strings and other values cut to ``limit`` characters,
    containers to a few items and levels (a str is sliced before it is repr'd)."""

    def __init__(self, limit: int) -> None:
        super().__init__()  # keyword arguments only from Python 3.12
        self.maxstring = self.maxother = self.maxlong = limit
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 8

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:  # beyond Python's 4300-digit limit for int -> str
            return f"<an int of {x.bit_length()} bits>"


def brief(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A ``repr`` of ``value`` of at most about ``limit`` characters, for a message.

    A large string is sliced before it is repr'd (never copied whole); containers show
    their first items. A value whose ``repr`` raises is named by its type. Never raises.
    """
    try:
        text = _Brief(limit).repr(value)
    except Exception:  # a foreign __repr__ that raises (or recursion): the type alone
        try:
            text = f"<{type(value).__name__}>"
        except Exception:
            text = "<a value>"
    return shorten(text, limit)


def storable(text: str) -> str:
    """``text`` with NUL (where SQLite's JSON functions cut a string short) and lone
    surrogates (no UTF-8 form) written as backslash escapes."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


INPUT_TEXT_MAX_CHARS = 4096
"""Most characters of a call's input a receipt keeps (``Receipt.input_text``); a longer
one is cut there, ending in ``…`` (the input hash still names the whole input)."""


def kept_input(text: str | None) -> str | None:
    """``text`` as a receipt keeps it: at most :data:`INPUT_TEXT_MAX_CHARS` characters
    (cut ones end in ``…``), made :func:`storable`; None stays None (the receipt keeps
    what it holds)."""
    if text is None:
        return None
    if len(text) > INPUT_TEXT_MAX_CHARS:
        text = text[: INPUT_TEXT_MAX_CHARS - 1] + "\u2026"
    return storable(text)
