"""``read_completed_since`` (every backend): a tool's completed receipts in pages, in the
order of their last update, from the earliest among the keys a rerun found
(actors/queue/read_ahead.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from stores import ClaimRequest, Completion, Owner, ReceiptStore, SqliteReceiptStore

ORG = "org-a"
OWNER = Owner("run-a")


def _complete(store: ReceiptStore, tool_id: str, keys: list[str], org_id: str = ORG) -> None:
    claims = store.claim_many(
        org_id, [ClaimRequest(k, "play", tool_id, f"h-{k}") for k in keys], OWNER, lease_ttl_s=60
    )
    store.complete_many(
        org_id, [Completion(c.receipt.key, c.receipt.lease_id, {"k": c.receipt.key}) for c in claims], OWNER
    )


def _all_pages(store: ReceiptStore, found: list[str], limit: int, tool_id: str = "t") -> list[list[str]]:
    pages, after = [], None
    while True:
        rows = store.read_completed_since(ORG, tool_id, after=after, keys=found, limit=limit, max_bytes=10**9)
        assert rows is not None
        if not rows:
            return pages
        pages.append([row[0] for row in rows])
        after = (rows[-1][3], rows[-1][0])


def test_pages_follow_the_updates_from_the_earliest_found_and_split_ties_by_key(
    store: ReceiptStore, fake_clock: Any
) -> None:
    _complete(store, "t", ["old"])
    fake_clock.advance(10)
    _complete(store, "t", ["c", "a", "b", "e", "d"])  # five at one time: ties at every page edge
    _complete(store, "other", ["x"])
    _complete(store, "t", ["y"], org_id="org-b")
    fake_clock.advance(10)
    _complete(store, "t", ["f"])
    store.claim_many(ORG, [ClaimRequest("running", "play", "t", "h")], OWNER, lease_ttl_s=60)
    fake_clock.advance(10)
    pages = _all_pages(store, ["b", "f"], limit=2)
    assert pages == [["a", "b"], ["c", "d"], ["e", "f"]]  # from b's time: "old" is before it
    rows = store.read_completed_since(ORG, "t", after=None, keys=["old"], limit=10, max_bytes=10**9)
    assert rows is not None and [r[:3] for r in rows][:2] == [
        ("old", "h-old", '{"k":"old"}'),
        ("a", "h-a", '{"k":"a"}'),
    ]
    assert store.read_completed_since(ORG, "t", after=None, keys=["missing"], limit=10, max_bytes=10**9) == []


def test_a_page_ends_with_the_row_whose_output_reaches_max_bytes(store: ReceiptStore) -> None:
    _complete(store, "t", ["a", "b", "c", "d"])  # outputs of 9 characters: {"k":"a"}
    rows = store.read_completed_since(ORG, "t", after=None, keys=["a"], limit=10, max_bytes=10)
    assert rows is not None and [r[0] for r in rows] == ["a", "b"]
    rows = store.read_completed_since(ORG, "t", after=None, keys=["a"], limit=10, max_bytes=1)
    assert rows is not None and [r[0] for r in rows] == ["a"]  # at least one


def test_values_set_by_hand_are_left_to_the_calls_claims(tmp_path: Path) -> None:
    """SQLite leaves values set by hand that a plain read would not take out of a page."""
    store = SqliteReceiptStore(tmp_path / "r.db")
    try:
        _complete(store, "t", ["a", "b", "c", "d"])
        with sqlite3.connect(tmp_path / "r.db") as conn:
            conn.execute("UPDATE receipts SET output = x'00' WHERE key = 'b'")
            conn.execute("UPDATE receipts SET input_hash = x'01' WHERE key = 'c'")
            conn.execute("UPDATE receipts SET updated_at = 'later' WHERE key = 'd'")
        assert _all_pages(store, ["a"], limit=10) == [["a"]]
    finally:
        store.close()
