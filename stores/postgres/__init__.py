"""The Postgres receipt store, for many workers on many hosts.

``PostgresReceiptStore`` is loaded on first use (PEP 562), so importing this package
imports no psycopg (which a gevent process must import only after patching).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stores.postgres.store import PostgresReceiptStore

__all__ = ["PostgresReceiptStore", "is_postgres_url", "split_schema"]


def __getattr__(name: str) -> Any:
    if name == "PostgresReceiptStore":
        from stores.postgres.store import PostgresReceiptStore

        return PostgresReceiptStore
    if name in ("is_postgres_url", "split_schema"):
        from stores.postgres import conn

        return getattr(conn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
