"""The orjson fast path of canonical_json is byte-identical to RFC 8785 (rfc8785)."""

from __future__ import annotations

import orjson
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from stores.keys import _orjson_is_jcs, canonical_json

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
    assert _orjson_is_jcs(value)
    assert orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == rfc8785.dumps(value)


@settings(max_examples=150)
@given(_any_trees)
def test_canonical_json_matches_rfc8785_for_any_json(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value).decode("utf-8")


def test_fast_path_refuses_what_it_cannot_prove() -> None:
    assert not _orjson_is_jcs({"a": 1.5})
    assert not _orjson_is_jcs({"é": 1})
    assert not _orjson_is_jcs([2**53])
    assert not _orjson_is_jcs((1, 2))
    assert not _orjson_is_jcs({1: "a"})


def test_every_control_character_escapes_like_rfc8785() -> None:
    for code in [*range(0x20), 0x7F, 0x2028, 0x2029, 0xFEFF, 0x1F600]:
        text = chr(code)
        assert canonical_json({"s": text}) == rfc8785.dumps({"s": text}).decode("utf-8")
