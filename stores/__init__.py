"""Receipt stores: the durable record of every tool call.

The contract is :class:`ReceiptStore`; :class:`SqliteReceiptStore` is the embedded
default, :class:`PostgresReceiptStore` serves many workers (``pip install
tooldispatch[postgres]``). :func:`open_store` picks one from a URL or path. Keys come
from :func:`receipt_key`. This package never imports ``actors``.

``PostgresReceiptStore`` is loaded lazily (module ``__getattr__``, PEP 562): importing
``stores`` never imports psycopg, which a gevent process must import only after
monkey-patching.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from stores.base import MAX_OUTPUT_BYTES, Clock, ReceiptStore, StoreCapabilities
from stores.codec import UnreadableOutput, decode_output, encode_output, salvage_form, validate_output
from stores.dispositions import REFRESH_LOST, decide_disposition, next_generation, serves_last_good
from stores.errors import (
    InputTooLargeError,
    InvalidInputError,
    InvalidOutputError,
    OutputNotStorableError,
    SchemaVersionError,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
    ToolDispatchError,
    UnreadableOutputError,
)
from stores.inputs import MAX_INPUT_BYTES, check_input_size
from stores.keys import KeyExplanation, canonical_json, explain_key, receipt_key
from stores.money import Money
from stores.process import ProcessIdentity, current_process_identity, process_gone
from stores.quoting import MAX_ERROR_CHARS, brief, shorten
from stores.rules import output_too_large_error
from stores.sqlite.store import SqliteReceiptStore
from stores.types import (
    BatchRecord,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    RefusalReason,
    ResolveAction,
)

if TYPE_CHECKING:
    from stores.postgres.store import PostgresReceiptStore


def __getattr__(name: str) -> Any:
    if name == "PostgresReceiptStore":
        from stores.postgres.store import PostgresReceiptStore

        return PostgresReceiptStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(target: str | os.PathLike[str], **kwargs: Any) -> ReceiptStore:
    """Open the receipt store ``target`` names.

    Args:
        target: a ``postgresql://`` (or ``postgres://``) URL opens a
            :class:`PostgresReceiptStore`; anything else is a SQLite file path
            (or ``":memory:"``).
        kwargs: passed to the store's constructor.

    Raises:
        StoreUnavailableError: the store cannot be opened (no server, no directory).
        StoreCorruptError, SchemaVersionError: as the store's constructor.
    """
    if isinstance(target, str) and target.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            raise StoreUnavailableError(
                f"a postgresql:// store needs psycopg ({exc.name} is not installed): "
                "pip install 'tooldispatch[postgres]'"
            ) from None
        from stores.postgres.store import PostgresReceiptStore

        return PostgresReceiptStore(target, **kwargs)
    return SqliteReceiptStore(target, **kwargs)


def stored_schema_version(target: str | os.PathLike[str]) -> int | None:
    """The schema version of the store ``target`` names (as :func:`open_store` takes it),
    read without writing anything: no migration, no file or schema made. None when there
    is no store there yet (compare with ``stores.sqlite.schema.SCHEMA_VERSION``, the
    version opening it would bring it to).

    Raises:
        StoreUnavailableError: a Postgres server that cannot be reached.
    """
    if isinstance(target, str) and target.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg

            from stores.postgres.conn import split_schema
            from stores.postgres.schema import quote_ident, read_version
        except ImportError as exc:
            raise StoreUnavailableError(f"a postgresql:// store needs psycopg: {exc}") from None
        url, schema = split_schema(target)
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as pg:
                return read_version(pg, quote_ident(schema or "tooldispatch"))
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot read the schema version of {url}: {exc}") from None
    path = os.fspath(target)
    if path == ":memory:" or not os.path.exists(path):
        return None
    import sqlite3
    import urllib.parse

    conn = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=ro", uri=True)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot read the schema version of {path}: {exc}") from None
    finally:
        conn.close()
    return version or None


__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_INPUT_BYTES",
    "MAX_OUTPUT_BYTES",
    "REFRESH_LOST",
    "BatchRecord",
    "Claim",
    "ClaimDisposition",
    "ClaimMode",
    "ClaimRequest",
    "Clock",
    "Completion",
    "Failure",
    "FailureKind",
    "FenceReport",
    "InputTooLargeError",
    "InvalidInputError",
    "InvalidOutputError",
    "KeyExplanation",
    "LeaseRef",
    "Money",
    "OutputNotStorableError",
    "Owner",
    "PostgresReceiptStore",
    "ProcessIdentity",
    "Receipt",
    "ReceiptStatus",
    "ReceiptStore",
    "Refusal",
    "RefusalReason",
    "ResolveAction",
    "SchemaVersionError",
    "SqliteReceiptStore",
    "StoreBusyError",
    "StoreCapabilities",
    "StoreCorruptError",
    "StoreError",
    "StoreUnavailableError",
    "ToolDispatchError",
    "UnreadableOutput",
    "UnreadableOutputError",
    "brief",
    "canonical_json",
    "check_input_size",
    "current_process_identity",
    "decide_disposition",
    "decode_output",
    "encode_output",
    "explain_key",
    "next_generation",
    "open_store",
    "output_too_large_error",
    "process_gone",
    "receipt_key",
    "salvage_form",
    "serves_last_good",
    "shorten",
    "stored_schema_version",
    "validate_output",
]
