"""The input cap (``stores.inputs``) and how messages quote values (``stores.quoting``).

One rule for every way an input arrives: ``check_input_size`` holds a value's JSON text to
``MAX_INPUT_BYTES``, and every function that makes a receipt key applies it (the key
maker the front door uses, ``receipt_key``, ``explain_key``), so no key, no claim and no
request is ever made for an input over it. Real sizes: the cap is not configurable.
"""

from __future__ import annotations

import datetime
from typing import Any

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from stores import (
    MAX_ERROR_CHARS,
    MAX_INPUT_BYTES,
    InputTooLargeError,
    InvalidInputError,
    brief,
    canonical_json,
    check_input_size,
    explain_key,
    receipt_key,
    shorten,
)
from stores.inputs import sent_size_bytes
from stores.keys import key_maker

PARTS: dict[str, Any] = {"org_id": "acme", "scope": "enrich", "tool_id": "lookup"}

AT_CAP = "x" * (MAX_INPUT_BYTES - 2)
"""A string whose JSON text (with its two quotes) is exactly the cap."""
OVER_CAP = AT_CAP + "x"

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


def test_input_cap_is_32_mib_of_json_text_and_its_error_is_an_invalid_input_error() -> None:
    assert MAX_INPUT_BYTES == 32 * 1024 * 1024
    assert check_input_size(AT_CAP) == MAX_INPUT_BYTES
    with pytest.raises(InputTooLargeError) as raised:
        check_input_size(OVER_CAP)
    assert isinstance(raised.value, InvalidInputError)
    assert raised.value.size_bytes == MAX_INPUT_BYTES + 1
    message = str(raised.value)
    assert str(MAX_INPUT_BYTES + 1) in message and str(MAX_INPUT_BYTES) in message
    assert len(message) < 200  # the sizes, never the input


def test_input_cap_counts_bytes_of_utf8_not_characters() -> None:
    text = "é" * (MAX_INPUT_BYTES // 2)  # 16 Mi characters, 32 MiB of UTF-8 (plus the quotes)
    with pytest.raises(InputTooLargeError):
        check_input_size(text)
    with pytest.raises(InputTooLargeError):
        receipt_key(**PARTS, input={"note": text})


def test_input_cap_is_applied_by_every_key_function_alike() -> None:
    make = key_maker(**PARTS)
    assert make(AT_CAP)[0] == receipt_key(**PARTS, input=AT_CAP) == explain_key(**PARTS, input=AT_CAP).key
    for key_of in (make, lambda v: receipt_key(**PARTS, input=v), lambda v: explain_key(**PARTS, input=v)):
        with pytest.raises(InputTooLargeError):
            key_of(OVER_CAP)
        with pytest.raises(InputTooLargeError):
            key_of({"rows": [OVER_CAP[: MAX_INPUT_BYTES // 2], OVER_CAP[: MAX_INPUT_BYTES // 2]]})


def test_input_cap_counts_non_semantic_fields_which_are_sent_though_not_keyed() -> None:
    big = {"id": 7, "trace": OVER_CAP}
    make = key_maker(**PARTS, ignore_fields=("trace",))
    with pytest.raises(InputTooLargeError):
        make(big)
    with pytest.raises(InputTooLargeError):
        receipt_key(**PARTS, input=big, ignore_fields=("trace",))
    small = {"id": 7, "trace": "t-1"}
    assert make(small)[0] == make({"id": 7})[0]  # still left out of the key


def test_canonical_json_of_an_integer_past_4300_digits_is_an_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError) as raised:
        canonical_json({"n": 10**5000})
    assert len(str(raised.value)) < 400


def test_brief_quotes_any_value_in_a_bounded_repr() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    for value in ("x" * 10_000_000, ["y" * 1000] * 1000, {"k": "z" * 100_000}, 10**5000, b"\0" * 10**6):
        assert len(brief(value)) <= 250, type(value)
    assert brief("abc") == "'abc'"
    assert "Hostile" in brief(Hostile())


def test_shorten_keeps_the_head_and_the_tail_and_says_how_much_was_cut() -> None:
    text = "head " + "x" * 1_000_000 + " tail"
    cut = shorten(text)
    assert len(cut) <= MAX_ERROR_CHARS + 30
    assert cut.startswith("head ") and cut.endswith(" tail")
    assert f"[{len(text) - MAX_ERROR_CHARS} chars cut]" in cut
    assert shorten("short") == "short"


# -- one measure: the canonical text of the whole input ----------------------------------


def sized(target_bytes: int, filler: float) -> dict[str, Any]:
    """``{"id": 7, "trace": [filler * 1000, "xx…"]}`` whose RFC 8785 text (measured by the
    ``rfc8785`` package itself) is ``target_bytes`` long. orjson writes ``1.0`` as ``1.0``
    (canonical ``1``) and ``1e20`` as ``1e+20`` (canonical ``100000000000000000000``), so
    its text is longer, or shorter, than the canonical one."""
    base: dict[str, Any] = {"id": 7, "trace": [filler] * 1000 + [""]}
    base["trace"][-1] = "x" * (target_bytes - len(rfc8785.dumps(base)))
    assert len(rfc8785.dumps(base)) == target_bytes
    return base


@pytest.mark.parametrize("filler", [1.0, 1e20], ids=["orjson-longer", "orjson-shorter"])
@pytest.mark.waits
def test_input_cap_measures_the_whole_input_by_its_canonical_text_non_semantic_fields_too(
    filler: float,
) -> None:
    at, over = sized(MAX_INPUT_BYTES, filler), sized(MAX_INPUT_BYTES + 1, filler)
    assert (len(orjson.dumps(at)) > MAX_INPUT_BYTES) == (filler == 1.0)  # the other measure disagrees
    make = key_maker(**PARTS, ignore_fields=("trace",))
    key_functions = (
        lambda v: make(v)[0],
        lambda v: receipt_key(**PARTS, input=v, ignore_fields=("trace",)),
        lambda v: explain_key(**PARTS, input=v, ignore_fields=("trace",)).key,
    )

    assert check_input_size(at) == MAX_INPUT_BYTES
    assert len({key_of(at) for key_of in key_functions}) == 1  # at the cap: keyed, one key
    for check in (check_input_size, *key_functions):
        with pytest.raises(InputTooLargeError) as raised:
            check(over)
        assert raised.value.size_bytes == MAX_INPUT_BYTES + 1


NOT_JSON: dict[str, Any] = {
    "bytes over the cap": b"\0" * (MAX_INPUT_BYTES + 1),
    "a set": {1, 2},
    "a datetime": datetime.datetime(2026, 1, 15, tzinfo=datetime.timezone.utc),
    "NaN": float("nan"),
    "an object": object(),
    "an integer past 2**53": 2**60,
}


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_non_semantic_field_that_is_not_json_is_refused_naming_the_field(name: str) -> None:
    value = {"id": 7, "trace": NOT_JSON[name]}
    make = key_maker(**PARTS, ignore_fields=("trace",))
    for key_of in (
        make,
        lambda v: receipt_key(**PARTS, input=v, ignore_fields=("trace",)),
        lambda v: explain_key(**PARTS, input=v, ignore_fields=("trace",)),
    ):
        with pytest.raises(InvalidInputError) as raised:
            key_of(value)
        assert type(raised.value) is InvalidInputError
        message = str(raised.value)
        assert "'trace'" in message and "non-semantic" in message and len(message) < 600, message
    with pytest.raises(InvalidInputError):
        check_input_size(NOT_JSON[name])


@settings(max_examples=300, deadline=None)
@given(
    keyed=st.dictionaries(st.sampled_from(["a", "b", "é", "z"]), JSON_VALUES, max_size=3),
    ignored=st.dictionaries(st.sampled_from(["t", "ü", "n"]), JSON_VALUES, max_size=3),
)
def test_sent_size_is_the_canonical_size_of_the_whole_input(
    keyed: dict[str, Any], ignored: dict[str, Any]
) -> None:
    whole = {**keyed, **ignored}
    assert sent_size_bytes(len(rfc8785.dumps(keyed)), whole, ("t", "ü", "n")) == len(rfc8785.dumps(whole))
