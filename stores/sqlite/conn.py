"""Opening the SQLite receipt file, and keeping its write-ahead log bounded."""

from __future__ import annotations

import os
import sqlite3

from stores.errors import StoreBusyError, StoreCorruptError, StoreError, StoreUnavailableError
from stores.sqlite.schema import enable_wal, migrate

__all__ = ["bound_wal", "open_connection", "store_error"]

_TOOBIG = 18
"""SQLite's SQLITE_TOOBIG: a string or blob over its length limit (1 GB by default)."""

_BUSY = (5, 6)
"""SQLite's SQLITE_BUSY and SQLITE_LOCKED (primary codes): another connection's lock."""


def store_error(path: str, exc: BaseException) -> StoreError:
    """The store's error for an ``sqlite3`` error ``exc`` of the file ``path``: a
    :class:`~stores.errors.StoreError` naming it; for a value over SQLite's size limit
    ("string or blob too big"), one saying the same write fails the same way again; for
    another connection's lock held past the busy timeout, a
    :class:`~stores.errors.StoreBusyError`."""
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "sqlite_errorcode", None)  # (Python 3.11+; 3.10: the text alone)
    if (code is not None and code & 0xFF in _BUSY) or "database is locked" in str(exc):
        return StoreBusyError(f"{path}: another connection holds the file's lock: {text}")
    if getattr(exc, "sqlite_errorcode", None) == _TOOBIG or "too big" in str(exc):
        return StoreError(
            f"{path}: SQLite refused a value over its size limit (not an outage: not tried again): {text}"
        )
    return StoreError(f"{path}: {text}")


def open_connection(path: str, busy_timeout_s: float, wal_size_limit_bytes: int) -> sqlite3.Connection:
    """Open (creating 0600 if missing) and migrate the store file; WAL for files.

    Raises:
        StoreUnavailableError / StoreCorruptError / SchemaVersionError: see SqliteReceiptStore.
    """
    memory = path == ":memory:"
    if not memory:
        _create_private(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"{path}: cannot open the receipt store: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if not memory:
            enable_wal(conn, busy_timeout_s)
            conn.execute(f"PRAGMA journal_size_limit = {int(wal_size_limit_bytes)}")
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise StoreCorruptError(
                f"{path}: not a tooldispatch receipt database ({exc}); "
                "move it aside or point --db at another path"
            ) from exc
        hint = (
            "another connection holds a lock on the file (an open transaction): "
            "it clears when that connection commits or closes"
            if "locked" in str(exc) or "busy" in str(exc)
            else "check the directory exists and is writable"
        )
        raise StoreUnavailableError(f"{path}: cannot open the receipt store: {exc}; {hint}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _create_private(path: str) -> None:
    """Create the file 0600 so SQLite's -wal/-shm inherit owner-only permissions."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreUnavailableError(
            f"{path}: cannot create the receipt store ({exc.strerror}); "
            "check the directory exists and is writable"
        ) from exc
    os.close(fd)


def bound_wal(conn: sqlite3.Connection, wal_path: str, limit_bytes: int, busy_ms: int) -> None:
    """After a write: if the WAL grew past ``limit_bytes``, checkpoint it and truncate it
    to zero bytes, only if no reader needs its frames now (busy timeout 0: never waits;
    a reader still holding a snapshot makes the checkpoint give up, and a later write
    tries again). ``journal_size_limit`` set at open is the backstop for WAL resets.
    """
    try:
        size = os.stat(wal_path).st_size
    except OSError:
        return
    if size <= limit_bytes:
        return
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # one (busy, log, done) row
    except sqlite3.OperationalError:
        pass  # another writer holds the lock: the next write tries again
    finally:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
