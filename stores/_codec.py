"""The one converter for what is persisted (receipt outputs, salvage entries).

cattrs' orjson preconfigured converter unstructures attrs classes, enums and the
like into JSON, and orjson writes it. Output text is what the ``output`` column holds.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from cattrs.preconf.orjson import make_converter

__all__ = ["converter", "decode_json", "encode_json", "encode_output"]

converter = make_converter()


def encode_json(value: Any) -> str:
    """Serialise ``value`` to compact JSON text.

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


# orjson refuses (TypeError) dataclasses, dates and times, and subclasses of str, int,
# dict and list under these options, so the fast path below only succeeds for trees of
# exact JSON types (plus enums and UUIDs), which the converter leaves as they are.
_PLAIN_JSON = (
    orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def encode_output(output: Any) -> str:
    """``encode_json(output)``, byte for byte, without the converter's walk for plain JSON.

    Anything orjson refuses here, and any text holding ``null`` (orjson writes NaN and
    Infinity as null, which ``encode_json`` refuses), takes the converter's path.

    Raises:
        TypeError: the output has no JSON form (from ``encode_json``).
    """
    try:
        text = orjson.dumps(output, option=_PLAIN_JSON).decode("utf-8")
    except TypeError:
        return encode_json(output)
    return encode_json(output) if "null" in text else text
