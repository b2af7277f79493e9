"""The SQLite receipt store (the embedded default)."""

from stores.sqlite.store import WAL_SIZE_LIMIT_BYTES, SqliteReceiptStore

__all__ = ["WAL_SIZE_LIMIT_BYTES", "SqliteReceiptStore"]
