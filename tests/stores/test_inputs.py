"""The input cap (``stores.inputs``) and how messages quote values (``stores.quoting``).

One rule for every way an input arrives: ``check_input_size`` holds a value's JSON text to
``MAX_INPUT_BYTES``, and every function that makes a receipt key applies it (the key
maker the front door uses, ``receipt_key``, ``explain_key``), so no key, no claim and no
request is ever made for an input over it. Real sizes: the cap is not configurable.
"""

from __future__ import annotations

from typing import Any

import pytest

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
from stores.keys import key_maker

PARTS: dict[str, Any] = {"org_id": "acme", "scope": "enrich", "tool_id": "lookup"}

AT_CAP = "x" * (MAX_INPUT_BYTES - 2)
"""A string whose JSON text (with its two quotes) is exactly the cap."""
OVER_CAP = AT_CAP + "x"


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
