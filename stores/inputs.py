"""An input's canonical form and the input cap: one measure, one size rule for every way
an input arrives (docs/host-api.md, Calls).

The canonical form of a JSON value is its RFC 8785 JSON Canonicalization Scheme (JCS)
text (:func:`canonical_json`): the text a receipt key hashes (:mod:`stores.keys`), and
the one measure of an input's size. A call's input, through ``execute``,
``execute_many`` or a tool's nested call, and a row of a ``tooldispatch run`` input (CSV,
JSONL or plain text) are each held to :data:`MAX_INPUT_BYTES` of it (UTF-8), measured
on the whole input as it is handed to the tool: a tool's ``non_semantic_fields``, left
out of the key, are counted, and must be plain JSON like the rest. One over it fails
alone with :class:`~stores.errors.InputTooLargeError`, before anything is claimed, sent
or paid for; the other calls (rows) go on. The check is :func:`check_input_size`, made
where a receipt key is computed (:mod:`stores.keys`) and where the command line reads a
row.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import orjson
import rfc8785

from stores.errors import InputTooLargeError, InvalidInputError
from stores.quoting import brief, shorten

__all__ = [
    "MAX_INPUT_BYTES",
    "canonical_bytes",
    "canonical_json",
    "check_input_size",
    "json_size_bytes",
    "orjson_is_jcs",
    "sent_size_bytes",
    "unsafe_integer",
    "unsafe_integer_text",
    "utf8_size_bytes",
]

MAX_INPUT_BYTES = 32 * 1024 * 1024
"""Largest input one call (or one row of ``tooldispatch run``) may carry: 32 MiB of its
canonical JSON text (RFC 8785, UTF-8), the size of the largest output a receipt holds
(``stores.MAX_OUTPUT_BYTES``)."""

_MAX_SAFE_INT = 2**53 - 1
_ESCAPED = re.compile(r'["\\]')
"""The printable ASCII characters JSON escapes in a string."""


def canonical_json(value: Any, *, ignore_fields: Collection[str] = ()) -> str:
    """Return the RFC 8785 canonical JSON text of ``value``.

    Args:
        value: a JSON value (dict with str keys, list, str, int, float, bool, None).
        ignore_fields: top-level object keys the tool declares non-semantic; they are
            removed before canonicalisation (only when ``value`` is an object).

    Raises:
        InvalidInputError: ``value`` is not representable as JSON without loss.
    """
    if ignore_fields and isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in ignore_fields}
    return canonical_bytes(value).decode("utf-8")


def canonical_bytes(value: Any) -> bytes:
    """The RFC 8785 canonical JSON text of ``value``, UTF-8 (orjson's sorted output where
    it is byte-identical, :func:`orjson_is_jcs`; else the ``rfc8785`` package).

    Raises:
        InvalidInputError: ``value`` is not representable as JSON without loss.
    """
    if orjson_is_jcs(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # e.g. a lone surrogate: rfc8785 below gives the precise error
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeError, RecursionError, ValueError) as exc:
        raise InvalidInputError(f"input is not canonical JSON: {_why(exc, value)}") from None


def _why(exc: BaseException, value: Any) -> str:
    """Why ``value`` has no canonical text, short: an integer beyond +/-(2**53 - 1) is
    named by :func:`unsafe_integer_text` (rfc8785's text for one is the integer itself,
    whose ``str`` raises past 4300 digits), anything else by rfc8785's error."""
    if isinstance(exc, (rfc8785.IntegerDomainError, ValueError)):
        number = unsafe_integer(value)
        if number is not None:
            return f"{unsafe_integer_text(number)}; pass it as a string"
    try:
        return shorten(str(exc), 400)
    except ValueError:
        return type(exc).__name__


def unsafe_integer_text(number: int | str) -> str:
    """``"integer 12345678901234567 is outside the range JSON numbers keep exactly
    (±(2^53-1))"``, for an integer (or its decimal text) beyond +/-(2**53 - 1); one of
    more than 24 digits is shown by its first 20 and its length."""
    if isinstance(number, int):
        if number.bit_length() > 14_000:  # str() would refuse (4300 digits): say its size
            return f"an integer of about {int(number.bit_length() * 0.30103)} digits is {_OUTSIDE}"
        number = str(number)
    digits = number.lstrip("+-")
    if len(digits) > 24:
        number = f"{number[: len(number) - len(digits) + 20]}… ({len(digits)} digits)"
    return f"integer {number} is {_OUTSIDE}"


_OUTSIDE = "outside the range JSON numbers keep exactly (±(2^53-1))"


def unsafe_integer(value: Any) -> int | None:
    """The first integer of ``value`` (a JSON value) beyond +/-(2**53 - 1), which has no
    canonical text, or None. Walked without recursion; a container met twice is walked
    once."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                return item
        elif isinstance(item, (Mapping, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(reversed(list(item.values() if isinstance(item, Mapping) else item)))
    return None


def orjson_is_jcs(value: Any) -> bool:
    """True when orjson's sorted output is byte-identical to RFC 8785 for ``value``.

    That holds for exact dict/list/str/int/bool/None trees with ASCII object keys
    (code point order equals UTF-16 order) and integers within +/-(2**53 - 1) (no
    floats: ECMAScript number formatting is rfc8785's job). Both escape strings the
    same way (checked by tests/stores/test_keys_fastpath.py). Anything else, including
    every invalid input and an input that contains itself, takes the rfc8785 path.
    """
    stack = [value]
    seen: set[int] = set()  # containers walked: an input that contains itself ends the walk
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                return False
        elif kind is dict or kind is list:
            if id(item) in seen:
                return False  # a cycle (or a shared subtree): rfc8785 decides, and refuses a cycle
            seen.add(id(item))
            if kind is list:
                stack.extend(item)
                continue
            for key in item:
                if type(key) is not str or not key.isascii():
                    return False
            stack.extend(item.values())
        else:
            return False
    return True


def utf8_size_bytes(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate from ``surrogateescape`` counts as the
    byte it stands for); ASCII text is measured without a copy."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogateescape"))


def json_size_bytes(value: Any) -> int:
    """Bytes of ``value``'s canonical JSON text (:func:`canonical_bytes`): the measure of
    the input cap.

    Raises:
        InvalidInputError: ``value`` is not plain JSON (a set, NaN, bytes, an integer
            beyond +/-(2**53 - 1)...): it has no canonical text to measure.
    """
    if type(value) is str and value.isascii() and value.isprintable() and not _ESCAPED.search(value):
        return len(value) + 2  # no escapes: the text and its two quotes, without a copy
    return len(canonical_bytes(value))


def sent_size_bytes(keyed_bytes: int, input: Any, ignored: Collection[str]) -> int:
    """The canonical size of the whole ``input`` (bytes), from ``keyed_bytes``, the size of
    its canonical text without its ``ignored`` top-level fields (the text a receipt key
    hashes): each ignored field present adds its member (``"name":value``) and a comma.
    A member's size does not depend on where RFC 8785 sorts it, so the whole input is
    never encoded a second time.

    Raises:
        InvalidInputError: an ignored field's value is not plain JSON (it is sent all the
            same, so it must be JSON like the rest of the input).
    """
    if not ignored or not isinstance(input, Mapping):
        return keyed_bytes
    size, present, kept = keyed_bytes, 0, 0
    for name, value in input.items():
        if name not in ignored:
            kept += 1
            continue
        try:
            size += json_size_bytes(name) + 1 + json_size_bytes(value) + 1
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"input field {brief(name, 60)} (a non-semantic field, left out of the key but sent) "
                f"is not plain JSON: {str(exc).removeprefix('input is not canonical JSON: ')}"
            ) from None
        present += 1
    if present and not kept:
        size -= 1  # "{}" had no member: n members take n - 1 commas
    return size


def check_input_size(value: Any = None, *, size_bytes: int | None = None, what: str = "its JSON text") -> int:
    """Hold an input to :data:`MAX_INPUT_BYTES`; return its size in bytes.

    Args:
        value: the input (a JSON value); measured by :func:`json_size_bytes` (its
            canonical JSON text, RFC 8785) unless ``size_bytes`` is given.
        size_bytes: its size when the caller has already measured it (the key maker), or
            what was read of it (a line of an input file), bytes.
        what: what was measured, for the message ("its JSON text", "the line").

    Raises:
        InputTooLargeError: over the cap; the message gives the size and the cap, never
            the input.
        InvalidInputError: ``value`` is not plain JSON (it has no canonical text).
    """
    size = json_size_bytes(value) if size_bytes is None else size_bytes
    if size > MAX_INPUT_BYTES:
        error = InputTooLargeError(
            f"input too large: {what} is {size} bytes; the cap is {MAX_INPUT_BYTES} bytes (32 MiB)"
        )
        error.size_bytes = size
        raise error
    return size
