"""The input cap: one size rule for every way an input arrives (docs/host-api.md, Calls).

A call's input, through ``execute``, ``execute_many`` or a tool's nested call, and a row
of a ``tooldispatch run`` input (CSV, JSONL or plain text) are each held to
:data:`MAX_INPUT_BYTES` of JSON text (UTF-8, no whitespace; for a call, the RFC 8785
text its receipt key hashes, every field counted). One over it fails alone with
:class:`~stores.errors.InputTooLargeError`, before anything is claimed, sent or paid
for; the other calls (rows) go on. The check is :func:`check_input_size`, made where a
receipt key is computed (:mod:`stores.keys`) and where the command line reads a row.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from stores.errors import InputTooLargeError

__all__ = ["MAX_INPUT_BYTES", "check_input_size", "json_size_bytes", "utf8_size_bytes"]

MAX_INPUT_BYTES = 32 * 1024 * 1024
"""Largest input one call (or one row of ``tooldispatch run``) may carry: 32 MiB of JSON
text, the size of the largest output a receipt holds (``stores.MAX_OUTPUT_BYTES``)."""


def utf8_size_bytes(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate from ``surrogateescape`` counts as the
    byte it stands for); ASCII text is measured without a copy."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogateescape"))


def json_size_bytes(value: Any) -> int:
    """Bytes of ``value``'s JSON text (UTF-8, no whitespace); 0 when it has none (a set,
    a NaN...: such an input is refused as :class:`~stores.errors.InvalidInputError`
    where its key is made, not here)."""
    try:
        return len(orjson.dumps(value))
    except TypeError:  # an integer beyond 64 bits, a lone surrogate, a non-str key
        pass
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return 0
    return len(text.encode("utf-8", "surrogatepass"))


def check_input_size(value: Any = None, *, size_bytes: int | None = None, what: str = "its JSON text") -> int:
    """Hold an input to :data:`MAX_INPUT_BYTES`; return its size in bytes.

    Args:
        value: the input (a JSON value); measured by :func:`json_size_bytes` unless
            ``size_bytes`` is given.
        size_bytes: its size when the caller has already encoded it (the key maker), or
            what was read of it (a line of an input file), bytes.
        what: what was measured, for the message ("its JSON text", "the line").

    Raises:
        InputTooLargeError: over the cap; the message gives the size and the cap, never
            the input.
    """
    size = json_size_bytes(value) if size_bytes is None else size_bytes
    if size > MAX_INPUT_BYTES:
        error = InputTooLargeError(
            f"input too large: {what} is {size} bytes; the cap is {MAX_INPUT_BYTES} bytes (32 MiB)"
        )
        error.size_bytes = size
        raise error
    return size
