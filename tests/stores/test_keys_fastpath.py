"""The orjson fast path of canonical_json is byte-identical to RFC 8785 (rfc8785), and
``key_maker`` (the per-tool key function) gives the keys and hashes of ``key_and_input_hash``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from stores.errors import InvalidInputError
from stores.keys import canonical_json, key_and_input_hash, key_maker, orjson_is_jcs

_SAFE = 2**53 - 1
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_fast_leaves = st.none() | st.booleans() | st.integers(-_SAFE, _SAFE) | _text
_fast_trees = st.recursive(
    _fast_leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.characters(max_codepoint=127), max_size=6), children, max_size=4
        )
    ),
    max_leaves=20,
)
_any_leaves = _fast_leaves | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-_SAFE, _SAFE)
_any_trees = st.recursive(
    _any_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150)
@given(_fast_trees)
def test_fast_path_matches_rfc8785(value: object) -> None:
    assert orjson_is_jcs(value)
    assert orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == rfc8785.dumps(value)


@settings(max_examples=150)
@given(_any_trees)
def test_canonical_json_matches_rfc8785_for_any_json(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value).decode("utf-8")


def test_fast_path_refuses_what_it_cannot_prove() -> None:
    assert not orjson_is_jcs({"a": 1.5})
    assert not orjson_is_jcs({"é": 1})
    assert not orjson_is_jcs([2**53])
    assert not orjson_is_jcs((1, 2))
    assert not orjson_is_jcs({1: "a"})


def test_every_control_character_escapes_like_rfc8785() -> None:
    for code in [*range(0x20), 0x7F, 0x2028, 0x2029, 0xFEFF, 0x1F600]:
        text = chr(code)
        assert canonical_json({"s": text}) == rfc8785.dumps({"s": text}).decode("utf-8")


_parts = st.fixed_dictionaries(
    {
        "org_id": _text.filter(bool),
        "scope": _text.filter(bool),
        "tool_id": _text.filter(bool),
        "credential_scope_digest": _text,
        "version": _text,
        "stale_after_s": st.none() | st.floats(0, 1e9) | st.integers(0, 10**6),
        "ignore_fields": st.sampled_from([(), ("a",), ("a", "b")]),
    }
)


@settings(max_examples=150)
@given(_parts, _any_trees)
def test_key_maker_gives_the_keys_of_key_and_input_hash(parts: dict[str, Any], value: object) -> None:
    assert key_maker(**parts)(value)[:2] == key_and_input_hash(input=value, **parts)


def test_key_maker_refuses_what_key_and_input_hash_refuses() -> None:
    make = key_maker(org_id="o", scope="s", tool_id="t")
    for bad in ({"a": float("nan")}, {1: "a"}, [2**60], "\ud800", {"s": b"x"}):
        with pytest.raises(InvalidInputError):
            make(bad)
        with pytest.raises(InvalidInputError):
            key_and_input_hash(org_id="o", scope="s", tool_id="t", input=bad)
    with pytest.raises(InvalidInputError):
        key_maker(org_id="", scope="s", tool_id="t")
