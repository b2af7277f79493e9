"""Group commit for the SQLite store: several fenced writes in one transaction.

Every SQLite write transaction pays a fixed price (taking the write lock, the commit's
WAL frames and index update, and under threads a wait for the GIL after each statement)
that a handful of keys cannot spread: a fenced write of 12 keys costs ~175 µs alone here,
~15 µs a key, where 1,000 keys cost ~8.5 µs a key. Under load the receipt store actor
finds many small writes waiting in its inbox (marks running from the lifecycles,
completions from the flusher); :meth:`WritesTogether.write_together` runs them as one
transaction, each inside a savepoint of its own, so one call's error rolls back that
call alone and is answered to it alone, as if it had run by itself.

A subclass that overrides a fenced write runs inside that transaction: what it does
after ``super()`` happens before the COMMIT, and a write through a second connection of
its own would wait for the write lock this transaction holds.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from stores.base import FENCED_WRITES, Outcome
from stores.errors import StoreError
from stores.sqlite.conn import store_error

__all__ = ["TOGETHER", "WritesTogether"]

TOGETHER = FENCED_WRITES
"""The store methods :meth:`WritesTogether.write_together` takes (the fenced writes)."""


class WritesTogether:
    """Mixin of :class:`stores.sqlite.store.SqliteReceiptStore` (uses its ``_call`` and
    ``_write``, which opens a savepoint, not a transaction, while ``_together`` is set)."""

    _together = False
    _undo_failed = False
    path: str
    _call: Callable[..., Any]
    _write: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]

    def write_together(self, calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Outcome]:
        """Run fenced writes (``(method, args, kwargs)``, methods in :data:`TOGETHER`) in
        one transaction.

        Returns:
            per call, in order, ``(value, None)`` or ``(None, error)``: the value or the
            error that call alone would have had. A call's error rolls back its own
            savepoint only; an error that ends the whole transaction (a failed commit,
            a full disk) is every call's error, since none of them took effect.

        Raises:
            ValueError: a method not in :data:`TOGETHER` (nothing is run).
        """
        for method, _, _ in calls:
            if method not in TOGETHER:
                raise ValueError(f"write_together takes fenced writes only, not {method!r}")
        try:
            return self._call(self._together_work, calls)  # type: ignore[no-any-return]
        except StoreError as exc:  # the transaction as a whole failed: no call took effect
            return [(None, exc)] * len(calls)

    def _together_work(self, calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        with self._write() as conn:  # the transaction; each call's own _write a savepoint
            self._together, self._undo_failed = True, False
            try:
                for method, args, kwargs in calls:
                    try:
                        outcomes.append((getattr(self, method)(*args, **kwargs), None))
                    except Exception as exc:
                        # SQLite rolled the whole transaction back, or this call's share
                        # could not be undone alone (then none of it may be committed)
                        if not conn.in_transaction or self._undo_failed:
                            raise
                        error = store_error(self.path, exc) if isinstance(exc, sqlite3.Error) else exc
                        outcomes.append((None, error))
            finally:
                self._together = False
        return outcomes

    @contextlib.contextmanager
    def _savepoint(self, conn: sqlite3.Connection) -> Any:
        """One call's share of a :meth:`write_together` transaction."""
        conn.execute("SAVEPOINT one_call")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK TO one_call")
                    conn.execute("RELEASE one_call")
                except sqlite3.Error:  # this call's share cannot be undone alone: nor kept,
                    self._undo_failed = True  # so the whole transaction goes (each call fails)
            raise
        conn.execute("RELEASE one_call")
