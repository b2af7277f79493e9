"""The one converter for what is persisted (receipt outputs, salvage entries).

Outputs are stored exactly. :func:`validate_output` admits only the values JSON
carries back as the same Python value: ``dict`` with ``str`` keys, ``list``, ``str``,
``int``, ``float``, ``bool`` and ``None``, of those exact types (no subclasses, so no
enums), at most :data:`MAX_OUTPUT_DEPTH` containers deep. Everything else (tuple, set,
bytes, datetime, dict with int keys, any object) raises
:class:`~stores.errors.InvalidOutputError` naming the path and the type: a tuple would
come back as a list, so the live caller and every later caller would see two different
answers for one receipt. Tuples are refused for that reason.

Two encodings, one text column:

* the fast form: orjson's compact JSON, for every output it can write exactly;
* the exact form, where orjson refuses or would lose something (lone surrogates such
  as ``"caf\\ud83d"``, integers beyond 64 bits, NaN and Infinity, nesting deeper than
  orjson's 254 levels): :data:`EXACT_PREFIX` (one space, which orjson never writes)
  followed by the text of Python's ``json`` module (UTF-8, ``\\u`` escapes for lone
  surrogates only, ``NaN``/``Infinity``/``-Infinity`` as Python's JSON reader accepts
  them). A high and a low surrogate held as two code points side by side cannot be
  written (JSON reads that escape pair as one character) and is refused.
  :func:`decode_output` reads the exact form with ``json`` and everything else with
  orjson (which would turn a big integer into a float).

What neither form can carry (nesting beyond :data:`MAX_OUTPUT_DEPTH`, integers beyond
Python's 4300-digit conversion limit) raises
:class:`~stores.errors.OutputNotStorableError`; :func:`salvage_form` gives the value a
form the salvage log can always write.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from typing import Any

import orjson
from cattrs.preconf.orjson import make_converter

from stores.errors import InvalidOutputError, OutputNotStorableError, UnreadableOutputError

__all__ = [
    "EXACT_PREFIX",
    "MAX_OUTPUT_DEPTH",
    "EncodedOutput",
    "UnreadableOutput",
    "converter",
    "decode_json",
    "decode_output",
    "decode_stored",
    "encode_json",
    "encode_output",
    "salvage_form",
    "validate_output",
]

converter = make_converter()

EXACT_PREFIX = " "
"""Marks the exact form of an output (orjson never starts its text with a space)."""

MAX_OUTPUT_DEPTH = 500
"""Deepest nesting of lists and objects an output may have (orjson's limit is 254;
Python's ``json`` reads up to its recursion limit, 1000 frames, shared with the caller)."""

_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1
_ATOMS = (str, bool, type(None))


def _where(path: list[Any]) -> str:
    """``$['a'][0]``; a long path keeps its first and last 6 steps."""
    steps = [f"[{part}]" if isinstance(part, int) else f"[{part!r:.60}]" for part in path]
    if len(steps) > 12:
        steps = [*steps[:6], f"...({len(steps) - 12} more)...", *steps[-6:]]
    return "$" + "".join(steps)


def validate_output(value: Any) -> bool:
    """Check that ``value`` is plain JSON that reads back as the same value.

    Args:
        value: a tool's output.

    Returns:
        True when the fast (orjson) form cannot hold it exactly (NaN, Infinity,
        integers beyond 64 bits, nesting deeper than 254): the exact form is needed.
        Lone surrogates are found by the encoder, not here.

    Raises:
        InvalidOutputError: a member is not JSON (its path, as ``$['a'][0]``, and its
            type are in the message), or a dict key is not a ``str``.
        OutputNotStorableError: nesting deeper than :data:`MAX_OUTPUT_DEPTH`.
    """
    exact = False
    # (value, depth, path-as-tuple-chain); the path is only rebuilt for an error.
    stack: list[tuple[Any, int, Any]] = [(value, 0, None)]
    while stack:
        item, depth, trail = stack.pop()
        kind = type(item)
        if kind in _ATOMS:
            continue
        if kind is int:
            if not _INT64_MIN <= item <= _UINT64_MAX:
                exact = True
            continue
        if kind is float:
            if not math.isfinite(item):
                exact = True
            continue
        if kind is dict or kind is list:
            if depth >= MAX_OUTPUT_DEPTH:
                raise OutputNotStorableError(
                    f"output at {_where(_unwind(trail))} nests deeper than {MAX_OUTPUT_DEPTH} levels"
                )
            if depth >= 254:
                exact = True
            if kind is dict:
                for key, member in item.items():
                    if type(key) is not str:
                        raise InvalidOutputError(
                            f"output at {_where(_unwind(trail))} has a {type(key).__name__} key "
                            f"{key!r:.80}; JSON object keys are strings (it would come back as "
                            "a different value)"
                        )
                    stack.append((member, depth + 1, (trail, key)))
            else:
                for index, member in enumerate(item):
                    stack.append((member, depth + 1, (trail, index)))
            continue
        raise InvalidOutputError(
            f"output at {_where(_unwind(trail))} is a {kind.__module__}.{kind.__qualname__}, "
            "not JSON (dict with str keys, list, str, int, float, bool, None); it would come "
            "back as a different value, so return a JSON value"
        )
    return exact


def _unwind(trail: Any) -> list[Any]:
    parts: list[Any] = []
    while trail is not None:
        trail, part = trail
        parts.append(part)
    return parts[::-1]


class EncodedOutput:
    """An output already encoded by :func:`encode_output` (on the worker that got it), so
    the store and the flusher never validate or serialise it twice."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self) -> Any:
        """The decoded output (a fresh copy each time)."""
        return decode_output(self.text)


class UnreadableOutput:
    """What a receipt's ``output`` holds when its stored text cannot be decoded (changed
    by hand, damaged, written by something else): the text as stored and why it could
    not be read. The receipt's other fields are read as usual, so a bulk read or claim
    answers every other key; whoever needs the value gets
    :class:`~stores.errors.UnreadableOutputError` (:func:`encode_output` raises it)."""

    __slots__ = ("problem", "text")

    def __init__(self, text: str, problem: str) -> None:
        self.text = text
        self.problem = problem

    def __eq__(self, other: object) -> bool:
        return type(other) is UnreadableOutput and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"UnreadableOutput({self.text[:60]!r}, {self.problem!r})"


def decode_stored(text: str | bytes | None) -> Any:
    """:func:`decode_output` for a value read from a store: text it cannot decode comes
    back as an :class:`UnreadableOutput` instead of raising (one damaged row must not
    fail a read of many)."""
    try:
        return decode_output(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # orjson's and json's errors
        raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        return UnreadableOutput(raw, f"{type(exc).__name__}: {exc}")


def encode_output(output: Any) -> str:
    """Serialise a tool's output for the store: the fast form, or the exact form.

    An :class:`EncodedOutput` is returned as it is.

    Returns:
        Text for the ``output`` column; :func:`decode_output` gives back an equal value
        of the same types.

    Raises:
        InvalidOutputError: not JSON (see :func:`validate_output`); permanent by nature.
        OutputNotStorableError: JSON, but beyond what can be stored (see the module
            docstring); not the provider's fault: salvage it with :func:`salvage_form`.
        UnreadableOutputError: an :class:`UnreadableOutput` (a stored text that could not
            be read back).
    """
    if type(output) is EncodedOutput:
        return output.text
    if type(output) is UnreadableOutput:
        raise UnreadableOutputError(f"the stored output cannot be read back ({output.problem})")
    if not validate_output(output):
        try:
            return orjson.dumps(output).decode("utf-8")
        except orjson.JSONEncodeError:
            pass  # a lone surrogate: the exact form escapes it
    try:
        text = json.dumps(output, separators=(",", ":"), allow_nan=True, ensure_ascii=False)
    except (ValueError, RecursionError) as exc:  # ValueError: int beyond 4300 digits
        raise OutputNotStorableError(f"output cannot be stored exactly: {exc}") from None
    if _SURROGATE_PAIR.search(text):
        raise InvalidOutputError(
            "output holds a surrogate pair as two separate code points; JSON reads that "
            "escape as one character, so it would come back as a different value"
        )
    return EXACT_PREFIX + _SURROGATE.sub(_escape, text)


_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def decode_output(text: str | bytes | None) -> Any:
    """Read text written by :func:`encode_output` (None stays None).

    Raises:
        ValueError: the text is not an encoded output.
    """
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if text.startswith(EXACT_PREFIX):
        return json.loads(text)
    return orjson.loads(text)


REPR_NODES = 100_000
"""Most values a salvage description visits: a value holding one list twice per level
(``a = [a, a]``) has 2**50 paths to the depth limit, each of which reprlib would walk."""


class _BoundedRepr(reprlib.Repr):
    """reprlib's brief repr that stops (``...``) after ``budget`` values."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.left = budget

    def repr1(self, x: Any, level: int) -> str:
        self.left -= 1
        if self.left < 0:
            return "..."
        return super().repr1(x, level)


def salvage_form(value: Any) -> tuple[Any, str | None]:
    """What the salvage log writes for an output: ``(value_or_stand_in, why)``.

    Returns:
        ``(value, None)`` when the output can be stored (it goes back exactly), else
        ``(stand_in, reason)``: a JSON description ``{"type", "reason", "repr"}`` (the
        repr cut to 1 MiB of text) for an operator, never replayed into a store.
    """
    if type(value) is EncodedOutput:
        return value.value(), None
    try:
        encode_output(value)
    except (InvalidOutputError, OutputNotStorableError) as exc:
        brief = _BoundedRepr(REPR_NODES)  # keyword arguments only from Python 3.12
        brief.maxlevel = 50
        brief.maxstring = brief.maxother = brief.maxlong = 1 << 20
        brief.maxlist = brief.maxdict = brief.maxtuple = brief.maxset = 10_000
        try:
            text = brief.repr(value)
        except (RecursionError, ValueError) as why:
            text = f"<no repr: {why}>"
        reason = str(exc)
        return {"type": type(value).__qualname__, "reason": reason, "repr": text}, reason
    return value, None


def encode_json(value: Any) -> str:
    """Serialise ``value`` (attrs classes, enums... through the converter) to JSON text.

    For salvage entries and other records; outputs use :func:`encode_output`.

    Raises:
        TypeError: the value has no JSON form (orjson.JSONEncodeError is a TypeError).
    """
    plain = converter.unstructure(value)
    text = orjson.dumps(plain).decode("utf-8")
    if "null" in text and _has_non_finite(plain):  # orjson writes NaN/Infinity as null
        raise TypeError("NaN and Infinity have no JSON form (RFC 8259 section 6)")
    return text


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def decode_json(text: str | bytes | None) -> Any:
    """Parse JSON text written by :func:`encode_json` (None stays None)."""
    if text is None:
        return None
    return orjson.loads(text)
