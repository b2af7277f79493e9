"""The one error tree of tooldispatch.

Every error the library raises derives from :class:`ToolDispatchError`. The store
errors live here because ``stores`` never imports ``actors``; the dispatcher's own
errors (``actors.errors``) subclass the same root.
"""

from __future__ import annotations

__all__ = [
    "InputTooLargeError",
    "InvalidInputError",
    "InvalidOutputError",
    "OutputNotStorableError",
    "SchemaVersionError",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreError",
    "StoreUnavailableError",
    "ToolDispatchError",
]


class ToolDispatchError(Exception):
    """Root of every error raised by tooldispatch."""


class InvalidInputError(ToolDispatchError, ValueError):
    """A call's input cannot be canonicalised as JSON (RFC 8785), so no key is made."""


class InputTooLargeError(InvalidInputError):
    """A call's input (or a row of a ``tooldispatch run`` input) is over the input cap,
    ``stores.inputs.MAX_INPUT_BYTES`` of JSON text: refused for that call (that row)
    alone, before anything is claimed or sent.

    Attributes:
        size_bytes: the size that was measured, bytes (its JSON text; for a line of a
            ``tooldispatch run`` input, the line as it is in the file).
    """

    size_bytes: int = 0


class InvalidOutputError(ToolDispatchError, TypeError):
    """A tool returned a value that is not plain JSON (a set, bytes, a datetime, a tuple,
    a dict with int keys...): stored, it would come back as a different value, so it is
    refused for that call. The message names the path (``$['a'][0]``) and the type.
    Permanent: the same tool code returns the same kind of value."""

    raw_output: object = None
    """The value that was refused (set by the dispatcher, for salvage)."""


class OutputNotStorableError(ToolDispatchError, ValueError):
    """A JSON output the store cannot hold exactly (nesting deeper than
    ``stores.codec.MAX_OUTPUT_DEPTH``, an integer beyond Python's 4300-digit limit).
    Not the provider's fault, but paid for: the answer is salvaged
    (``stores.codec.salvage_form``) and the receipt is recorded failed (kind
    ``permanent``, the error text naming the salvage), so a rerun answers this error from
    the receipt instead of paying again (``retry_failed`` or ``force_refresh`` call the
    provider again)."""

    raw_output: object = None
    """The value that could not be stored (set by the dispatcher, for salvage)."""


class StoreError(ToolDispatchError):
    """The receipt store failed or refused an operation."""


class StoreUnavailableError(StoreError):
    """The store cannot be opened or written (missing directory, no permission)."""


class StoreBusyError(StoreUnavailableError):
    """A write waited its whole allowance for a lock another connection holds on the
    store (SQLite: another process's write transaction, ``SQLITE_BUSY``; Postgres: a
    table lock such as ``LOCK TABLE`` or ``ALTER TABLE`` takes, SQLSTATE 55P03). A claim
    rides it out like an outage, within its callers' ``timeout_s``; a write of paid
    outcomes does not (its ladder, salvage and latch take over)."""


class StoreCorruptError(StoreError):
    """The store's file is not a receipt database (or is damaged)."""


class UnreadableOutputError(StoreCorruptError):
    """A receipt holds an output this code cannot read back (its text was changed by
    hand, damaged, or written by something else): only the calls of that receipt fail;
    a forced refresh of it (``force_refresh``, ``tooldispatch run --force-refresh``)
    pays for it again and replaces it."""


class SchemaVersionError(StoreError):
    """The store's schema is newer than this code understands."""
