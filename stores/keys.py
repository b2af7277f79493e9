"""Receipt keys: a deterministic sha256 over the canonical call.

The canonical input is the RFC 8785 JSON Canonicalization Scheme (JCS) form of the
call's input, produced by the ``rfc8785`` package:

* object keys sorted (by UTF-16 code units, RFC 8785 section 3.2.3) at every depth,
  list order kept, no insignificant whitespace;
* numbers are IEEE 754 doubles printed as ECMAScript does (RFC 8785 section 3.2.2.3),
  so ``1`` and ``1.0`` are the same number and give the same key; integers beyond
  +/-(2**53 - 1) cannot be represented exactly and are refused (pass them as strings);
* strings are kept exactly as given: **no Unicode normalisation**. "é" written as one
  code point (NFC) and as "e" + combining accent (NFD) are different inputs to a
  provider, so they get different keys. Lone surrogates are refused.

Anything that is not plain JSON (NaN, Infinity, bytes, sets, datetimes, non-string
object keys, arbitrary objects) raises :class:`~stores.errors.InvalidInputError`; a key
is never computed from a lossy form. Nor for an input over the input cap
(:data:`stores.inputs.MAX_INPUT_BYTES` of JSON text, non-semantic fields counted): it
raises :class:`~stores.errors.InputTooLargeError`, so no call of it is claimed or sent.

The key hashes, in a versioned envelope: org id, scope, tool id, provider action
version, credential-scope digest, staleness setting and the sha256 of the canonical
input. Two orgs never share a key, and every store operation is also filtered by
org id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs
import orjson
import rfc8785

from stores.errors import InvalidInputError
from stores.inputs import check_input_size, utf8_size_bytes
from stores.quoting import brief, shorten

__all__ = [
    "KEY_FORMAT",
    "KeyExplanation",
    "canonical_json",
    "explain_key",
    "key_and_input_hash",
    "key_maker",
    "orjson_is_jcs",
    "receipt_key",
]

KEY_FORMAT = "tooldispatch.receipt.v1"
"""Envelope tag hashed into every key; bump it to invalidate every key at once."""


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
    if orjson_is_jcs(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except orjson.JSONEncodeError:
            pass  # e.g. a lone surrogate: rfc8785 below gives the precise error
    try:
        return rfc8785.dumps(value).decode("utf-8")
    except (rfc8785.CanonicalizationError, UnicodeError, RecursionError, ValueError) as exc:
        raise InvalidInputError(f"input is not canonical JSON: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    """An rfc8785 error's text, short (an IntegerDomainError's text is the integer itself,
    whose ``str`` raises past 4300 digits)."""
    if isinstance(exc, rfc8785.IntegerDomainError) and exc.args:
        return f"{brief(exc.args[0], 40)} exceeds safe integer domain for JSON floats"
    try:
        return shorten(str(exc), 400)
    except ValueError:
        return type(exc).__name__


_MAX_SAFE_INT = 2**53 - 1


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


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@attrs.frozen
class KeyExplanation:
    """Every part a receipt key was built from (see :func:`explain_key`)."""

    key: str
    """The receipt key: sha256 hex of the envelope."""
    org_id: str
    scope: str
    tool_id: str
    version: str
    credential_scope_digest: str
    stale_after_s: float | None
    canonical_input: str
    """The RFC 8785 text that was hashed."""
    input_hash: str
    """sha256 hex of ``canonical_input``."""
    envelope: str
    """The JSON envelope whose sha256 is ``key``."""


def explain_key(
    *,
    org_id: str,
    scope: str,
    tool_id: str,
    input: Any,
    credential_scope_digest: str = "",
    version: str = "",
    stale_after_s: float | None = None,
    ignore_fields: Collection[str] = (),
) -> KeyExplanation:
    """Build a receipt key and return it with every part it hashed.

    Args:
        org_id: the org the call runs for (keys never cross orgs).
        scope: the play's name.
        tool_id: the tool.
        input: the call's JSON input.
        credential_scope_digest: hash naming the credentials the call runs under.
        version: the provider action version.
        stale_after_s: the staleness setting in seconds, or None.
        ignore_fields: top-level input fields the tool declares non-semantic.

    Raises:
        InvalidInputError: the input is not plain JSON, or a part is not a string.
    """
    canonical, input_hash, envelope, key = _build(
        org_id, scope, tool_id, input, credential_scope_digest, version, stale_after_s, ignore_fields
    )
    return KeyExplanation(
        key=key,
        org_id=org_id,
        scope=scope,
        tool_id=tool_id,
        version=version,
        credential_scope_digest=credential_scope_digest,
        stale_after_s=stale_after_s,
        canonical_input=canonical,
        input_hash=input_hash,
        envelope=envelope,
    )


def _build(
    org_id: str,
    scope: str,
    tool_id: str,
    input: Any,
    credential_scope_digest: str,
    version: str,
    stale_after_s: float | None,
    ignore_fields: Collection[str],
) -> tuple[str, str, str, str]:
    """(canonical input, input hash, envelope, key); see :func:`explain_key`."""
    for name, part in (("org_id", org_id), ("scope", scope), ("tool_id", tool_id)):
        if not isinstance(part, str) or not part:
            raise InvalidInputError(f"{name} must be a non-empty string, got {brief(part)}")
    if not isinstance(version, str) or not isinstance(credential_scope_digest, str):
        raise InvalidInputError("version and credential_scope_digest must be strings")
    canonical = canonical_json(input, ignore_fields=ignore_fields)
    check_input_size(size_bytes=utf8_size_bytes(canonical))
    if ignore_fields and isinstance(input, Mapping) and any(k in input for k in ignore_fields):
        check_input_size(input)  # the fields left out of the key are sent all the same
    input_hash = _sha256(canonical)
    stale = None if stale_after_s is None else canonical_json(float(stale_after_s))
    envelope = orjson.dumps(
        [KEY_FORMAT, org_id, scope, tool_id, version, credential_scope_digest, stale, input_hash]
    ).decode("utf-8")
    return canonical, input_hash, envelope, _sha256(envelope)


def key_and_input_hash(
    *,
    org_id: str,
    scope: str,
    tool_id: str,
    input: Any,
    credential_scope_digest: str = "",
    version: str = "",
    stale_after_s: float | None = None,
    ignore_fields: Collection[str] = (),
) -> tuple[str, str]:
    """(receipt key, input hash) of :func:`explain_key`, without the explanation object.

    Raises:
        InvalidInputError: as :func:`explain_key`.
    """
    _, input_hash, _, key = _build(
        org_id, scope, tool_id, input, credential_scope_digest, version, stale_after_s, ignore_fields
    )
    return key, input_hash


def receipt_key(**parts: Any) -> str:
    """Return only the key of :func:`explain_key` (same arguments, same errors)."""
    return explain_key(**parts).key


def key_maker(
    *,
    org_id: str,
    scope: str,
    tool_id: str,
    credential_scope_digest: str = "",
    version: str = "",
    stale_after_s: float | None = None,
    ignore_fields: Collection[str] = (),
) -> Callable[[Any], tuple[str, str, bytes]]:
    """``make(input) -> (key, input hash, canonical input as UTF-8 bytes)``: the key and
    hash equal to :func:`key_and_input_hash` with these parts, and what the hash is of
    (kept with the receipt), for many inputs: the parts are checked once and the envelope
    before the input hash is hashed once (each key then hashes only the input hash on a
    copy).

    Raises:
        InvalidInputError: a part is not a string (here), or an input is not plain JSON
            (from ``make``).
        InputTooLargeError: (from ``make``) an input is over ``stores.inputs.MAX_INPUT_BYTES``
            of JSON text.
    """
    _, _, envelope, _ = _build(
        org_id, scope, tool_id, None, credential_scope_digest, version, stale_after_s, ()
    )
    head = envelope.encode("utf-8")
    cut = len(_sha256("null")) + 3  # the input hash, its quotes and the closing bracket
    prefix = hashlib.sha256(head[: len(head) - cut + 1])  # through the opening quote
    ignored = frozenset(ignore_fields)
    sha256, dumps, sort = hashlib.sha256, orjson.dumps, orjson.OPT_SORT_KEYS

    def make(input: Any) -> tuple[str, str, bytes]:
        data: bytes | None = None
        value = input
        if ignored and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in ignored}
        if orjson_is_jcs(value):
            try:
                data = dumps(value, option=sort)
            except orjson.JSONEncodeError:
                data = None
        if data is None:
            data = canonical_json(value).encode("utf-8")
        check_input_size(size_bytes=len(data))
        if value is not input and len(value) != len(input):
            check_input_size(input)  # the fields left out of the key are sent all the same
        input_hash = sha256(data).hexdigest()
        digest = prefix.copy()
        digest.update(f'{input_hash}"]'.encode("ascii"))
        return digest.hexdigest(), input_hash, data

    return make
