"""The output codec (stores/codec.py): what a provider answered comes back exactly.

Hypothesis round-trips every JSON value Python can hold (lone surrogates, integers
beyond 64 bits, NaN and Infinity, nesting beyond orjson's 254 levels) through
encode_output/decode_output, and checks that what is not JSON is refused with its path.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import re
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stores import (
    InvalidOutputError,
    OutputNotStorableError,
    decode_output,
    encode_output,
    salvage_form,
    validate_output,
)
from stores.codec import EXACT_PREFIX, MAX_OUTPUT_DEPTH


def shape(value: Any) -> list[Any]:
    """A flat, type-exact picture of a value (NaN equal to NaN, -0.0 unlike 0.0)."""
    out: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            out.append(("dict", len(item)))
            for k, v in item.items():
                out.append(("key", k))
                stack.append(v)
        elif isinstance(item, list):
            out.append(("list", len(item)))
            stack.extend(item)
        elif isinstance(item, float):
            out.append(("float", "nan" if math.isnan(item) else item.hex()))
        else:
            out.append((type(item).__name__, item))
    return out


def nested(depth: int, leaf: Any = None) -> Any:
    value: Any = [] if leaf is None else [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


# Any code point, lone surrogates included, but never a high surrogate right before a low
# one (JSON reads that escape pair as one character: refused, tested below).
def _no_split_pairs(text: str) -> str:
    return re.sub("([\ud800-\udbff])(?=[\udc00-\udfff])", "\\1x", text)


texts = st.text(st.characters(), max_size=12).map(_no_split_pairs)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 5, max_value=2**64 + 5),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(),  # NaN, Infinity, -0.0, subnormals
    texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_codec_round_trips_any_json_value_exactly(value: Any) -> None:
    text = encode_output(value)
    assert shape(decode_output(text)) == shape(value)
    assert text.encode("utf-8")  # storable as UTF-8 text: lone surrogates are escaped


@settings(max_examples=100, deadline=None)
@given(scalars, st.integers(min_value=1, max_value=MAX_OUTPUT_DEPTH - 1))
def test_codec_round_trips_deep_nesting(leaf: Any, depth: int) -> None:
    value = nested(depth, leaf)
    assert shape(decode_output(encode_output(value))) == shape(value)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_codec_fast_form_is_orjson_for_what_orjson_writes_exactly(value: Any) -> None:
    """Plain outputs keep the fast form (orjson's bytes), so stored rows read as JSON."""
    text = encode_output(value)
    try:
        plain = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        assert text.startswith(EXACT_PREFIX)
        return
    if shape(orjson.loads(plain)) == shape(value):
        assert text == plain
    else:  # NaN written as null, a big int read back as a float: the exact form
        assert text.startswith(EXACT_PREFIX)
        assert json.loads(text) is not None or value is None


@pytest.mark.parametrize(
    "value",
    [
        {"snippet": "caf\ud83d"},
        2**64,
        -(2**63) - 1,
        float("nan"),
        [float("inf"), float("-inf")],
        nested(255),
        {"\udfff": "key"},
    ],
    ids=["lone-surrogate", "u64-plus-1", "i64-minus-1", "nan", "infinities", "depth-255", "surrogate-key"],
)
def test_codec_exact_form_for_what_orjson_refuses_or_changes(value: Any) -> None:
    text = encode_output(value)
    assert text.startswith(EXACT_PREFIX)
    assert shape(decode_output(text)) == shape(value)


NOT_JSON = [
    ((1, 2), "$", "tuple"),
    ({"a": [1, {2, 3}]}, "$['a'][1]", "set"),
    ({"blob": b"\x00"}, "$['blob']", "bytes"),
    ({"blob": bytearray(b"x")}, "$['blob']", "bytearray"),
    ([datetime.date(2026, 1, 1)], "$[0]", "date"),
    ({"at": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)}, "$['at']", "datetime"),
    ({"n": decimal.Decimal("1.10")}, "$['n']", "Decimal"),
    ({"id": uuid.UUID(int=1)}, "$['id']", "UUID"),
    ({1: "a"}, "$", "int key"),
    ({"x": {None: 1}}, "$['x']", "NoneType key"),
    ({"ordered": __import__("collections").OrderedDict(a=1)}, "$['ordered']", "OrderedDict"),
    ("\ud83d\ude00", "surrogate pair", "two separate code points"),
]


@pytest.mark.parametrize(("value", "where", "kind"), NOT_JSON, ids=[k for _, _, k in NOT_JSON])
def test_codec_refuses_values_that_would_come_back_different(value: Any, where: str, kind: str) -> None:
    with pytest.raises(InvalidOutputError) as info:
        encode_output(value)
    assert where in str(info.value) and kind in str(info.value)
    assert not isinstance(info.value, OutputNotStorableError)


def test_codec_validate_output_names_the_path_of_the_first_bad_member() -> None:
    with pytest.raises(InvalidOutputError, match=r"\$\['rows'\]\[2\]\['tags'\] is a builtins.frozenset"):
        validate_output({"rows": [{}, {}, {"tags": frozenset({"a"})}]})
    assert validate_output({"ok": [1, "a", None, True, 1.5]}) is False
    assert validate_output({"big": 2**64}) is True


@pytest.mark.parametrize(
    "value",
    [nested(MAX_OUTPUT_DEPTH + 1), nested(50_000), {"n": 10**5000}],
    ids=["depth-limit-plus-1", "depth-50000", "int-5001-digits"],
)
def test_codec_unstorable_json_raises_not_storable_and_has_a_salvage_form(value: Any) -> None:
    with pytest.raises(OutputNotStorableError):
        encode_output(value)
    stand_in, reason = salvage_form(value)
    assert reason
    assert stand_in["type"] == type(value).__qualname__ and stand_in["reason"] == reason
    assert decode_output(encode_output(stand_in)) == stand_in  # the salvage log can write it


def test_codec_salvage_form_of_storable_value_is_the_value() -> None:
    value = {"snippet": "caf\ud83d", "n": 2**70}
    assert salvage_form(value) == (value, None)


def test_codec_salvage_form_of_a_value_holding_itself_twice_is_bounded() -> None:
    loop: list[Any] = []
    loop.extend([loop, loop])  # 2**50 paths to the depth limit: an unbounded walk never ends
    stand_in, reason = salvage_form(loop)
    assert reason is not None and stand_in["type"] == "list"
    assert stand_in["repr"].endswith("]") and "..." in stand_in["repr"]


def test_a_failure_kind_written_by_a_newer_version_reads_as_permanent() -> None:
    """Never retried silently (so never paid for again), never a crash of the claim that
    met it (an unknown value raised ValueError and failed the whole claim)."""
    from stores import FailureKind

    assert FailureKind("a_kind_from_the_future") is FailureKind.PERMANENT
    assert not FailureKind("a_kind_from_the_future").retryable
