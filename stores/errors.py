"""The one error tree of tooldispatch.

Every error the library raises derives from :class:`ToolDispatchError`. The store
errors live here because ``stores`` never imports ``actors``; the dispatcher's own
errors (``actors.errors``) subclass the same root.
"""

from __future__ import annotations

__all__ = [
    "InvalidInputError",
    "SchemaVersionError",
    "StoreCorruptError",
    "StoreError",
    "StoreUnavailableError",
    "ToolDispatchError",
]


class ToolDispatchError(Exception):
    """Root of every error raised by tooldispatch."""


class InvalidInputError(ToolDispatchError, ValueError):
    """A call's input cannot be canonicalised as JSON (RFC 8785), so no key is made."""


class StoreError(ToolDispatchError):
    """The receipt store failed or refused an operation."""


class StoreUnavailableError(StoreError):
    """The store cannot be opened or written (missing directory, no permission)."""


class StoreCorruptError(StoreError):
    """The store's file is not a receipt database (or is damaged)."""


class SchemaVersionError(StoreError):
    """The store's schema is newer than this code understands."""
