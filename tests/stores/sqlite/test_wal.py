"""The SQLite WAL is bounded: a long reader grows it, and it shrinks once the reader ends.

A real second connection holds a read snapshot (as ``sqlite-utils`` or a report query
would) while the store writes; checkpoints cannot pass the snapshot, so the WAL grows.
After the reader ends, the next write brings the file back under the limit.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

from stores import ClaimRequest, Completion, Owner, SqliteReceiptStore

ORG = "org-a"
OWNER = Owner("run-wal")
LIMIT_BYTES = 1024 * 1024
WRITTEN_BYTES = 12 * LIMIT_BYTES


def _write_outputs(store: SqliteReceiptStore, prefix: str, total_bytes: int) -> None:
    blob = "x" * (100 * 1024)
    for i in range(total_bytes // len(blob)):
        key = hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest()
        (claim,) = store.claim_many(ORG, [ClaimRequest(key, "play", "tool", key)], OWNER, lease_ttl_s=60.0)
        assert claim.receipt.lease_id
        assert store.complete_many(ORG, [Completion(key, claim.receipt.lease_id, blob)], OWNER).ok


def test_sqlite_wal_shrinks_after_long_reader_ends(tmp_path: Path) -> None:
    path = tmp_path / "receipts.db"
    wal = Path(f"{path}-wal")
    with SqliteReceiptStore(path, wal_size_limit_bytes=LIMIT_BYTES) as store:
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM receipts").fetchone()  # holds a snapshot
            _write_outputs(store, "during", WRITTEN_BYTES)
            grown = wal.stat().st_size
            assert grown > WRITTEN_BYTES  # the reader pinned every frame
            reader.execute("COMMIT")
        finally:
            reader.close()
        _write_outputs(store, "after", 100 * 1024)  # one write once checkpoints can run
        assert wal.stat().st_size <= LIMIT_BYTES, (grown, wal.stat().st_size)
        assert os.path.getsize(path) > WRITTEN_BYTES  # the data went into the database


def test_sqlite_wal_kept_while_reader_still_reads(tmp_path: Path) -> None:
    """Bounding never breaks a reader: its snapshot stays readable while the store writes."""
    path = tmp_path / "receipts.db"
    with SqliteReceiptStore(path, wal_size_limit_bytes=LIMIT_BYTES) as store:
        _write_outputs(store, "before", 300 * 1024)
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            seen = reader.execute("SELECT count(*) FROM receipts").fetchone()[0]
            _write_outputs(store, "during", 4 * LIMIT_BYTES)
            assert reader.execute("SELECT count(*) FROM receipts").fetchone()[0] == seen
            reader.execute("COMMIT")
        finally:
            reader.close()
