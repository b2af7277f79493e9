"""``read_completed_since`` on SQLite leaves out values set by hand that a plain read
would not take (the pages themselves: tests/stores/test_read_ahead_pages.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stores import ClaimRequest, Completion, Owner, SqliteReceiptStore

ORG = "org-a"
OWNER = Owner("run-a")


def _complete(store: SqliteReceiptStore, tool_id: str, keys: list[str], org_id: str = ORG) -> None:
    claims = store.claim_many(
        org_id, [ClaimRequest(k, "play", tool_id, f"h-{k}") for k in keys], OWNER, lease_ttl_s=60
    )
    store.complete_many(
        org_id, [Completion(c.receipt.key, c.receipt.lease_id, {"k": c.receipt.key}) for c in claims], OWNER
    )


def _all_pages(
    store: SqliteReceiptStore, found: list[str], limit: int, tool_id: str = "t"
) -> list[list[str]]:
    pages, after = [], None
    while True:
        rows = store.read_completed_since(ORG, tool_id, after=after, keys=found, limit=limit, max_bytes=10**9)
        assert rows is not None
        if not rows:
            return pages
        pages.append([row[0] for row in rows])
        after = (rows[-1][3], rows[-1][0])


def test_values_set_by_hand_are_left_to_the_calls_claims(tmp_path: Path) -> None:
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
