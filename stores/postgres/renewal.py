"""The Postgres store's renewal handle: the store's statements on one connection of its own.

The lease renewer runs on a native OS thread that must not wait for a gevent hub a
tool may be starving, nor for the store's pool (whose locks are greenlet-based under
gevent). Its handle is a copy of the store whose statements run on one direct
connection, opened on first use and opened again after it was lost.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any

from stores.errors import StoreError
from stores.postgres.conn import store_error

__all__ = ["OneConnection", "renewal_copy"]


class OneConnection:
    """One autocommit connection, used by one thread at a time (the renewer's).

    Args:
        url: libpq connection string or URL.
        where: the URL without its password, for messages.
        connect_kwargs: psycopg.connect keyword arguments (timeouts, keepalives, name).
    """

    def __init__(self, url: str, where: str, connect_kwargs: dict[str, Any]) -> None:
        self.url = url
        self.where = where
        self.connect_kwargs = connect_kwargs
        self._conn: Any = None
        self._closed = False

    def execute(self, query: str, params: Any) -> list[tuple[Any, ...]]:
        """Run one statement; all its rows (a statement without rows: its row count).

        Raises:
            StoreUnavailableError: no connection, or it was lost (dropped: the next call
                connects again).
            StoreError: closed, or any other database error.
        """
        import psycopg

        if self._closed:
            raise StoreError(f"{self.where}: the renewal connection is closed")
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self.url, autocommit=True, **self.connect_kwargs)
            cur = self._conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else [(cur.rowcount,)]
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._drop()
            raise store_error(self.where, exc) from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken
                conn.close()

    def close(self) -> None:
        """Close the connection; later calls raise StoreError."""
        self._closed = True
        self._drop()


def renewal_copy(store: Any) -> Any:
    """A copy of a :class:`~stores.postgres.store.PostgresReceiptStore` on its own connection
    (``application_name`` gets ``:renew``); closing it closes that connection only."""
    conns = store._conns
    kwargs = dict(conns.connect_kwargs)
    kwargs["application_name"] = (kwargs.get("application_name", "tooldispatch") + ":renew")[:63]
    clone = copy.copy(store)
    clone._conns = OneConnection(store.url, conns.where, kwargs)
    clone._listener = None
    clone._listener_lock = threading.Lock()
    return clone
