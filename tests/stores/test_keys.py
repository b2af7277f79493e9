"""Receipt keys and canonical JSON (SEMANTICS.md "Receipt keys", RFC 8785)."""

from __future__ import annotations

import datetime
import hashlib
import json
import random
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stores import InvalidInputError, canonical_json, explain_key, receipt_key

PARTS: dict[str, Any] = {
    "org_id": "org-a",
    "scope": "play",
    "tool_id": "verify_email",
    "input": {"email": "a@b.c", "opts": {"deep": [1, 2]}},
    "credential_scope_digest": "cred-1",
    "version": "v1",
    "stale_after_s": None,
}

PINNED_KEY = "5b4585b525be1e4a5dbaa6d64525dc178fcfd6617845ab739381fa4577132fab"
"""The key of PARTS. If this changes, every stored receipt stops matching: that
must be a deliberate KEY_FORMAT bump, never an accident."""


def key_with(**changes: Any) -> str:
    return receipt_key(**{**PARTS, **changes})


def test_key_is_deterministic_and_pinned() -> None:
    assert receipt_key(**PARTS) == receipt_key(**PARTS) == PINNED_KEY
    assert len(PINNED_KEY) == 64 and int(PINNED_KEY, 16) >= 0


@pytest.mark.parametrize(
    ("part", "value"),
    [
        ("org_id", "org-b"),
        ("scope", "play-2"),
        ("tool_id", "verify_phone"),
        ("input", {"email": "a@b.c", "opts": {"deep": [1, 3]}}),
        ("credential_scope_digest", "cred-2"),
        ("credential_scope_digest", ""),
        ("version", "v2"),
        ("version", ""),
        ("stale_after_s", 3600.0),
        ("stale_after_s", 0),
    ],
)
def test_key_changes_with_each_part(part: str, value: Any) -> None:
    assert key_with(**{part: value}) != PINNED_KEY


def test_key_differs_for_every_staleness_setting() -> None:
    keys = {key_with(stale_after_s=s) for s in (None, 0, 60, 3600, 3600.5)}
    assert len(keys) == 5
    assert key_with(stale_after_s=60) == key_with(stale_after_s=60.0)


def test_key_parts_cannot_bleed_into_each_other() -> None:
    assert key_with(org_id="ab", scope="c") != key_with(org_id="a", scope="bc")
    assert key_with(tool_id="t", version="1") != key_with(tool_id="t1", version="")


def test_canonical_json_sorts_keys_at_every_depth() -> None:
    value = {"b": 1, "a": {"d": [{"z": 0, "y": {"q": 1, "p": 2}}], "c": None}}
    assert canonical_json(value) == '{"a":{"c":null,"d":[{"y":{"p":2,"q":1},"z":0}]},"b":1}'


def test_canonical_json_sorts_keys_by_utf16_code_units() -> None:
    # RFC 8785 section 3.2.3: U+1F600 is the surrogate pair D83D DE00, before U+FFFF.
    assert canonical_json({"\uffff": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\uffff":1}'


def test_key_list_order_matters() -> None:
    assert key_with(input=[1, 2]) != key_with(input=[2, 1])
    assert key_with(input={"a": [{"x": 1}, {"y": 1}]}) != key_with(input={"a": [{"y": 1}, {"x": 1}]})


def test_key_ignores_whitespace_and_construction_order() -> None:
    compact = json.loads('{"email":"a@b.c","opts":{"deep":[1,2]}}')
    spaced = json.loads('{ "opts" : { "deep" : [ 1 ,\n 2 ] } ,\t"email" : "a@b.c" }')
    built: dict[str, Any] = {}
    built["opts"] = {"deep": [1, 2]}
    built["email"] = "a@b.c"
    assert list(built) != list(PARTS["input"])
    assert key_with(input=compact) == key_with(input=spaced) == key_with(input=built) == PINNED_KEY
    assert canonical_json(spaced) == '{"email":"a@b.c","opts":{"deep":[1,2]}}'


def test_key_int_and_equal_float_are_one_number() -> None:
    # Documented policy (stores/keys.py, RFC 8785 section 3.2.2.3): JSON numbers are doubles.
    assert key_with(input={"n": 1}) == key_with(input={"n": 1.0})
    assert canonical_json([1.0, -0.0, 1e21, 2.5]) == "[1,0,1e+21,2.5]"
    assert key_with(input={"n": 1}) != key_with(input={"n": 1.5})


@pytest.mark.parametrize("n", [2**53 + 1, -(2**53 + 1), 2**64, 2**53])
def test_key_refuses_integers_beyond_double_precision(n: int) -> None:
    with pytest.raises(InvalidInputError):
        key_with(input={"n": n})


def test_key_accepts_largest_safe_integer() -> None:
    assert canonical_json([2**53 - 1, -(2**53 - 1)]) == "[9007199254740991,-9007199254740991]"


def test_key_unicode_is_not_normalised() -> None:
    # Documented policy (stores/keys.py): NFC and NFD are different provider inputs.
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    assert key_with(input={"name": nfc}) != key_with(input={"name": nfd})
    assert key_with(input={nfc: 1}) != key_with(input={nfd: 1})
    assert canonical_json(nfd) == f'"{nfd}"'


def test_key_ignore_fields_removes_top_level_fields_only() -> None:
    a = {"email": "a@b.c", "request_id": "r1", "nested": {"request_id": "n1"}}
    b = {"email": "a@b.c", "request_id": "r2", "nested": {"request_id": "n1"}}
    assert key_with(input=a) != key_with(input=b)
    assert key_with(input=a, ignore_fields={"request_id"}) == key_with(input=b, ignore_fields={"request_id"})
    explained = explain_key(**{**PARTS, "input": a, "ignore_fields": ["request_id"]})
    assert explained.canonical_input == '{"email":"a@b.c","nested":{"request_id":"n1"}}'
    c = {**b, "nested": {"request_id": "n2"}}
    assert key_with(input=b, ignore_fields={"request_id"}) != key_with(input=c, ignore_fields={"request_id"})


class Custom:
    pass


NOT_JSON = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "bytes": b"abc",
    "bytearray": bytearray(b"abc"),
    "set": {1, 2},
    "frozenset": frozenset({1}),
    "datetime": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
    "date": datetime.date(2024, 1, 1),
    "int_key": {1: "one"},
    "none_key": {None: "x"},
    "custom_object": Custom(),
    "lone_surrogate": "\ud800",
    "lone_surrogate_key": {"\udfff": 1},
    "nested_nan": {"a": [1, {"b": float("nan")}]},
}


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_key_refuses_non_json_input(name: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        key_with(input=NOT_JSON[name])
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidInputError):
        canonical_json(NOT_JSON[name])


@pytest.mark.parametrize(
    ("part", "value"), [("org_id", ""), ("scope", ""), ("tool_id", None), ("org_id", 7), ("version", 2)]
)
def test_key_refuses_bad_parts(part: str, value: Any) -> None:
    with pytest.raises(InvalidInputError):
        key_with(**{part: value})


def test_explain_key_returns_every_part() -> None:
    explained = explain_key(**{**PARTS, "stale_after_s": 60.0})
    assert explained.key == key_with(stale_after_s=60.0)
    assert (explained.org_id, explained.scope, explained.tool_id) == ("org-a", "play", "verify_email")
    assert (explained.version, explained.credential_scope_digest, explained.stale_after_s) == (
        "v1",
        "cred-1",
        60.0,
    )
    assert (
        explained.canonical_input
        == canonical_json(PARTS["input"])
        == '{"email":"a@b.c","opts":{"deep":[1,2]}}'
    )
    assert explained.input_hash == hashlib.sha256(explained.canonical_input.encode("utf-8")).hexdigest()
    assert explained.key == hashlib.sha256(explained.envelope.encode("utf-8")).hexdigest()
    envelope = json.loads(explained.envelope)
    for part in ("org-a", "play", "verify_email", "v1", "cred-1", explained.input_hash):
        assert part in envelope


# -- properties --------------------------------------------------------------------------------

SAFE_INT = 2**53 - 1
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-SAFE_INT, SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def reordered(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every object's keys inserted in a shuffled order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reordered(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reordered(v, rnd) for v in value]
    return value


def json_number(digits: str) -> int | float:
    """Parse an integer literal as RFC 8785 reads every JSON number: as a double.

    Python's json would make "9007199254740992" (the canonical text of the float
    2.0**53) an int beyond the safe range, which canonical_json refuses by policy.
    """
    n = int(digits)
    return n if abs(n) <= SAFE_INT else float(n)


@settings(deadline=None)
@given(json_values)
def test_canonical_json_round_trips(value: Any) -> None:
    text = canonical_json(value)
    parsed = json.loads(text, parse_int=json_number)
    assert parsed == value
    assert canonical_json(parsed) == text


@settings(deadline=None)
@given(json_values, st.randoms(use_true_random=False))
def test_key_insensitive_to_key_insertion_order(value: Any, rnd: random.Random) -> None:
    assert key_with(input=reordered(value, rnd)) == key_with(input=value)
