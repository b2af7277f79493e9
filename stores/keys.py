"""Receipt keys: a deterministic sha256 over the canonical call.

The canonical input is the RFC 8785 JSON Canonicalization Scheme (JCS) form of the
call's input (:func:`stores.inputs.canonical_json`, the ``rfc8785`` package's text):

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
is never computed from a lossy form. The fields a tool declares non-semantic are left
out of the key but sent all the same: they must be plain JSON too. Nor is a key made for
an input over the input cap (:data:`stores.inputs.MAX_INPUT_BYTES` of canonical JSON
text, the whole input measured, non-semantic fields counted): it raises
:class:`~stores.errors.InputTooLargeError`, so no call of it is claimed or sent.

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

from stores.errors import InvalidInputError
from stores.inputs import canonical_bytes, canonical_json, check_input_size, orjson_is_jcs, sent_size_bytes
from stores.quoting import brief

__all__ = [
    "KEY_FORMAT",
    "KeyExplanation",
    "canonical_json",
    "explain_key",
    "key_and_input_hash",
    "key_maker",
    "key_of_hash_maker",
    "orjson_is_jcs",
    "receipt_key",
]

KEY_FORMAT = "tooldispatch.receipt.v1"
"""Envelope tag hashed into every key; bump it to invalidate every key at once."""


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
        InvalidInputError: the input (non-semantic fields included) is not plain JSON, or a
            part is not a string.
        InputTooLargeError: the whole input is over ``stores.inputs.MAX_INPUT_BYTES`` of
            canonical JSON text.
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
    value = input
    if ignore_fields and isinstance(input, Mapping):
        value = {k: v for k, v in input.items() if k not in ignore_fields}
    data = canonical_bytes(value)
    check_input_size(size_bytes=sent_size_bytes(len(data), input, ignore_fields))
    canonical = data.decode("utf-8")
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


def _envelope_prefix(
    org_id: str,
    scope: str,
    tool_id: str,
    credential_scope_digest: str,
    version: str,
    stale_after_s: float | None,
) -> Any:
    """A sha256 fed with the key's envelope up to the input hash (through its opening
    quote): a key is ``prefix.copy()`` fed ``<input hash>"]``."""
    _, _, envelope, _ = _build(
        org_id, scope, tool_id, None, credential_scope_digest, version, stale_after_s, ()
    )
    head = envelope.encode("utf-8")
    cut = len(_sha256("null")) + 3  # the input hash, its quotes and the closing bracket
    return hashlib.sha256(head[: len(head) - cut + 1])


def key_of_hash_maker(
    *,
    org_id: str,
    scope: str,
    tool_id: str,
    credential_scope_digest: str = "",
    version: str = "",
    stale_after_s: float | None = None,
) -> Callable[[str], str]:
    """``key_of(input hash) -> key``: the receipt key :func:`key_maker` with these parts
    gives an input of that hash (the envelope is hashed once). A stored receipt whose key
    is ``key_of`` its stored input hash is one a call with these parts would claim.

    Raises:
        InvalidInputError: a part is not a string.
    """
    return _keyer(_envelope_prefix(org_id, scope, tool_id, credential_scope_digest, version, stale_after_s))


def _keyer(prefix: Any) -> Callable[[str], str]:
    """``key_of(input hash) -> key`` over an envelope's hashed prefix (:func:`_envelope_prefix`)."""

    def key_of(input_hash: str) -> str:
        digest = prefix.copy()
        digest.update(f'{input_hash}"]'.encode())
        return str(digest.hexdigest())

    return key_of


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
        InvalidInputError: a part is not a string (here), or an input (non-semantic fields
            included) is not plain JSON (from ``make``).
        InputTooLargeError: (from ``make``) a whole input is over
            ``stores.inputs.MAX_INPUT_BYTES`` of canonical JSON text.
    """
    key_of = _keyer(_envelope_prefix(org_id, scope, tool_id, credential_scope_digest, version, stale_after_s))
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
            data = canonical_bytes(value)
        size = len(data)
        if value is not input and len(value) != len(input):  # the fields left out of the key are sent
            size = sent_size_bytes(size, input, ignored)
        check_input_size(size_bytes=size)
        input_hash = sha256(data).hexdigest()
        return key_of(input_hash), input_hash, data

    return make
