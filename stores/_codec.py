"""The one converter for what is persisted (receipt outputs, salvage entries).

cattrs' orjson preconfigured converter unstructures attrs classes, enums and the
like into JSON, and orjson writes it. Output text is what the ``output`` column holds.
"""

from __future__ import annotations

from typing import Any

import orjson
from cattrs.preconf.orjson import make_converter

__all__ = ["converter", "decode_json", "encode_json"]

converter = make_converter()


def encode_json(value: Any) -> str:
    """Serialise ``value`` to compact JSON text.

    Raises:
        TypeError: the value has no JSON form (orjson.JSONEncodeError is a TypeError).
    """
    return orjson.dumps(converter.unstructure(value)).decode("utf-8")


def decode_json(text: str | bytes | None) -> Any:
    """Parse JSON text written by :func:`encode_json` (None stays None)."""
    if text is None:
        return None
    return orjson.loads(text)
