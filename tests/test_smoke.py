"""Smoke test: the installed package imports and computes a receipt key."""

import re

import stores


def test_receipt_key_is_sha256_hex() -> None:
    key = stores.receipt_key(org_id="a", scope="s", tool_id="t", input={"x": 1})
    assert re.fullmatch(r"[0-9a-f]{64}", key)
