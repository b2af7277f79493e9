"""Schema and migrations of the SQLite receipt store.

Table ``receipts`` (one row per org and receipt key; times are epoch seconds, REAL):

=====================  =======  ==================================================
column                 type     meaning
=====================  =======  ==================================================
org_id                 TEXT     the org (part of the primary key)
key                    TEXT     receipt key, sha256 hex (part of the primary key)
scope                  TEXT     the play's name
tool_id                TEXT     the tool
status                 TEXT     pending, queued, running, completed, failed, skipped
input_hash             TEXT     sha256 hex of the canonical input
output                 TEXT     JSON output (completed receipts only)
error                  TEXT     error text (failed receipts)
failure_kind           TEXT     a stores.FailureKind value (timeout, rate_limited, ...)
lease_id               TEXT     current (or, once finished, last) lease id
lease_owner_run_id     TEXT     run holding (or that last held) the lease
lease_owner_attempt    INTEGER  that run's attempt
lease_expires_at       REAL     NULL unless a lease is held
attempts               INTEGER  sends of its request: times claimed for execution (a takeover too)
created_at             REAL     first claim
updated_at             REAL     last change
completed_at           REAL     last completion (kept while a refresh holds a lease)
generation             INTEGER  execution generation (v2; see Receipt.generation)
lease_owner_host       TEXT     lease holder's host and pid space (v2)
lease_owner_pid        INTEGER  lease holder's process id (v2)
lease_owner_started_at REAL     lease holder process's start time (v2)
input_text             TEXT     what the call was for: its canonical input, cut to
                                4096 characters, or its tool's digest (v3; NULL in
                                rows written before)
batch_key              TEXT     the batch request its execution was sent in (v4)
cost                   TEXT     what the call whose output it holds cost, as
                                stores.Money's text ("0.0025 USD"); NULL: unknown
                                or free, or written before (v5)
=====================  =======  ==================================================

Table ``meta`` (v2): ``name`` TEXT primary key, ``value`` INTEGER; ``purge_epoch``
counts purges that deleted receipts. ``output`` holds text from
``stores.codec.encode_output`` (JSON, or one space then Python's exact JSON form).

Table ``batches`` (v4): what each request of a batch tool carried, written with its
members' ``running`` mark before it is sent (``stores.types.BatchRecord``): ``org_id``
and ``batch_key`` (its Idempotency-Key; the primary key), ``tool_id``, ``members`` (a
JSON array of ``[receipt key, input text]`` in the request's order; the input text is
``null`` for a tool that keeps no raw input) and ``created_at``.
A purge deletes the records no receipt still in flight names.

The schema version is SQLite's ``PRAGMA user_version``. Migrations run inside
``BEGIN IMMEDIATE``, so two processes opening a new file at once serialise: the
first creates the schema, the second finds it made.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import time

import sqlite_utils

from stores.errors import SchemaVersionError
from stores.rows import COLUMNS

__all__ = [
    "COLUMNS",
    "SCHEMA_VERSION",
    "add_v2",
    "add_v3",
    "add_v4",
    "add_v5",
    "create_v1",
    "enable_wal",
    "migrate",
]

SCHEMA_VERSION = 5


def create_v1(db: sqlite_utils.Database) -> None:
    """Schema step 1: table ``receipts`` with its first 17 columns. :func:`migrate` runs
    each step a file lacks, in order; a test builds an old file with the first few."""
    db["receipts"].create(  # type: ignore[union-attr]
        {
            "key": str,
            "org_id": str,
            "scope": str,
            "tool_id": str,
            "status": str,
            "input_hash": str,
            "output": str,
            "error": str,
            "failure_kind": str,
            "lease_id": str,
            "lease_owner_run_id": str,
            "lease_owner_attempt": int,
            "lease_expires_at": float,
            "attempts": int,
            "created_at": float,
            "updated_at": float,
            "completed_at": float,
        },
        pk=("org_id", "key"),
        not_null={"key", "org_id", "scope", "tool_id", "status", "input_hash", "attempts"},
        defaults={"attempts": 0},
        column_order=list(COLUMNS[:17]),
    )
    db.table("receipts").create_index(["status", "updated_at"], index_name="receipts_status_updated")


def add_v2(db: sqlite_utils.Database) -> None:
    """Schema step 2: lease owner identity, execution generation, the meta table."""
    receipts = db.table("receipts")
    receipts.add_column("generation", int, not_null_default=1)
    receipts.add_column("lease_owner_host", str)
    receipts.add_column("lease_owner_pid", int)
    receipts.add_column("lease_owner_started_at", float)
    db["meta"].create({"name": str, "value": int}, pk="name")  # type: ignore[union-attr]


def add_v3(db: sqlite_utils.Database) -> None:
    """Schema step 3: what each receipt was for (``Receipt.input_text``)."""
    db.table("receipts").add_column("input_text", str)


def add_v4(db: sqlite_utils.Database) -> None:
    """Schema step 4: batch requests recorded before they are sent: ``receipts.batch_key``,
    ``batches``."""
    db.table("receipts").add_column("batch_key", str)
    db["batches"].create(  # type: ignore[union-attr]
        {"org_id": str, "batch_key": str, "tool_id": str, "members": str, "created_at": float},
        pk=("org_id", "batch_key"),
        not_null={"org_id", "batch_key", "tool_id", "members"},
    )


def add_v5(db: sqlite_utils.Database) -> None:
    """Schema step 5: what each receipt's call cost (``receipts.cost``, NULL in the rows
    already there)."""
    db.table("receipts").add_column("cost", str)


_MIGRATIONS = {1: create_v1, 2: add_v2, 3: add_v3, 4: add_v4, 5: add_v5}


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION` inside one write transaction.

    Raises:
        SchemaVersionError: the file's schema is newer than this code.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{path}: receipt schema version {version} is newer than this tooldispatch "
                f"understands ({SCHEMA_VERSION}); upgrade tooldispatch to open it"
            )
        db = sqlite_utils.Database(conn)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            _MIGRATIONS[target](db)
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: sqlite3.Connection) -> bool:
    """End a failed write transaction, keeping its error the one raised: nothing to do when
    SQLite already rolled it back (a full disk, an I/O error, ``RAISE(ROLLBACK)``), and a
    failed COMMIT (a deferred constraint) still holds it open, so the next write can begin.
    Returns False when the transaction is still open (the ROLLBACK itself failed).
    """
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
    return not conn.in_transaction


def enable_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Switch to WAL, retrying while another process opens the same new file.

    SQLite does not call the busy handler for this switch, so two processes opening a
    new file at once could see "database is locked". This runs on a real OS thread
    (see BlockingRunner), so the unpatched sleep never blocks a gevent hub.
    """
    monkey = sys.modules.get("gevent.monkey")
    pause = monkey.get_original("time", "sleep") if monkey else time.sleep
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        pause(0.005)
