"""Schema and migrations of the Postgres receipt store.

Everything lives in one Postgres schema (default ``tooldispatch``): table ``receipts``
with the columns of the SQLite store (see :mod:`stores.sqlite.schema`; times are epoch
seconds, ``double precision``), table ``batches`` (the batch requests recorded before
they are sent, as SQLite's) and table ``meta`` (``name``, ``value`` text) holding
``schema_version`` and ``purge_epoch``. Keys use
the "C" collation: byte order, the cheapest comparison, and the one fixed order every
bulk statement locks rows in.

Migrations run in one transaction under ``pg_advisory_xact_lock`` on a lock id derived
from the schema name, so workers starting at once on an empty database serialise: the
first creates the schema, the others find it made (``CREATE SCHEMA IF NOT EXISTS`` alone
still races on the catalog's unique index).
"""

from __future__ import annotations

import hashlib
from typing import Any

from stores.errors import SchemaVersionError

__all__ = ["SCHEMA_VERSION", "migrate", "quote_ident", "read_version"]

SCHEMA_VERSION = 5


MAX_IDENTIFIER_BYTES = 63
"""Postgres keeps the first 63 bytes of a name (NAMEDATALEN - 1) and drops the rest
without an error, so two longer names that share those bytes would be one schema."""


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier.

    Raises:
        ValueError: empty, holds a NUL, or longer than :data:`MAX_IDENTIFIER_BYTES`
            bytes in UTF-8 (Postgres would silently cut it).
    """
    if not name or "\x00" in name:
        raise ValueError(f"not a valid Postgres identifier: {name!r}")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"Postgres names hold at most {MAX_IDENTIFIER_BYTES} bytes; {name!r} has {size} "
            "(Postgres would cut it, and two such names would share one schema)"
        )
    return '"' + name.replace('"', '""') + '"'


def _create_v1(schema: str) -> list[str]:
    return [
        f"""CREATE TABLE {schema}.receipts (
            key text COLLATE "C" NOT NULL,
            org_id text COLLATE "C" NOT NULL,
            scope text NOT NULL,
            tool_id text NOT NULL,
            status text NOT NULL,
            input_hash text NOT NULL,
            output text,
            error text,
            failure_kind text,
            lease_id text,
            lease_owner_run_id text,
            lease_owner_attempt integer,
            lease_expires_at double precision,
            attempts integer NOT NULL DEFAULT 0,
            created_at double precision,
            updated_at double precision,
            completed_at double precision,
            PRIMARY KEY (org_id, key)
        )""",
        f"CREATE INDEX receipts_status_updated ON {schema}.receipts (status, updated_at)",
    ]


def _add_v2(schema: str) -> list[str]:
    """Lease owner identity and execution generation (as SQLite's schema v2)."""
    return [
        f"ALTER TABLE {schema}.receipts ADD COLUMN generation integer NOT NULL DEFAULT 1, "
        "ADD COLUMN lease_owner_host text, ADD COLUMN lease_owner_pid integer, "
        "ADD COLUMN lease_owner_started_at double precision"
    ]


def _add_v3(schema: str) -> list[str]:
    """What each receipt was for (as SQLite's schema v3)."""
    return [f"ALTER TABLE {schema}.receipts ADD COLUMN input_text text"]


def _add_v4(schema: str) -> list[str]:
    """Batch requests recorded before they are sent (as SQLite's schema v4)."""
    return [
        f'ALTER TABLE {schema}.receipts ADD COLUMN batch_key text COLLATE "C"',
        f"""CREATE TABLE {schema}.batches (
            org_id text COLLATE "C" NOT NULL,
            batch_key text COLLATE "C" NOT NULL,
            tool_id text NOT NULL,
            members text NOT NULL,
            created_at double precision,
            PRIMARY KEY (org_id, batch_key)
        )""",
    ]


def _add_v5(schema: str) -> list[str]:
    """What each receipt's call cost (as SQLite's schema v5)."""
    return [f"ALTER TABLE {schema}.receipts ADD COLUMN cost text"]


_MIGRATIONS = {1: _create_v1, 2: _add_v2, 3: _add_v3, 4: _add_v4, 5: _add_v5}


def lock_id(schema_name: str) -> int:
    """The advisory lock id (signed 64-bit) that serialises migrations of one schema."""
    digest = hashlib.sha256(f"tooldispatch:migrate:{schema_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def read_version(conn: Any, schema: str) -> int | None:
    """The schema version ``schema`` (quoted) holds (None: none yet); nothing written."""
    import psycopg

    try:
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE name = 'schema_version'").fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return int(row[0]) if row else None


def _refuse_newer(version: int | None, where: str) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: receipt schema version {version} is newer than this tooldispatch "
            f"understands ({SCHEMA_VERSION}); upgrade tooldispatch to open it"
        )


def migrate(conn: Any, schema_name: str, where: str) -> None:
    """Bring schema ``schema_name`` to :data:`SCHEMA_VERSION` (``conn`` is in autocommit).

    Raises:
        SchemaVersionError: the database's schema is newer than this code.
    """
    schema = quote_ident(schema_name)
    version = read_version(conn, schema)  # the common case: made already, no lock taken
    _refuse_newer(version, where)
    if version == SCHEMA_VERSION:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_id(schema_name),))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {schema}.meta (name text PRIMARY KEY, value text NOT NULL)")
        version = read_version(conn, schema) or 0
        _refuse_newer(version, where)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[target](schema):
                conn.execute(statement)
        if version < SCHEMA_VERSION:
            conn.execute(
                f"INSERT INTO {schema}.meta VALUES ('schema_version', %s) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
