"""Connections of the Postgres receipt store: one direct connection to migrate, then a
psycopg_pool pool, and the mapping of driver errors onto the store's error tree.

Driver errors: a lost or refused connection (``psycopg.OperationalError``, which
includes a terminated backend and a detected deadlock) and a pool that hands out no
connection in time are :class:`~stores.errors.StoreUnavailableError` (a lock not granted
within ``lock_timeout``, SQLSTATE 55P03, is its :class:`~stores.errors.StoreBusyError`);
anything else psycopg raises is :class:`~stores.errors.StoreError`, as is an ``OperationalError`` that
is the server refusing what it was sent (:func:`refused`: a value over a size limit),
which no retry would change.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from stores.errors import StoreBusyError, StoreError, StoreUnavailableError
from stores.postgres.schema import migrate, quote_ident

__all__ = ["PgConnections", "is_postgres_url", "refused", "split_schema", "store_error"]

T = TypeVar("T")

_LOCK_NOT_AVAILABLE = "55P03"
"""SQLSTATE lock_not_available: ``lock_timeout`` ran out."""

_IDLE_CHECK_S = 2.0
"""A pooled connection idle longer than this is checked (one empty query) before use."""

RECONNECT_S = 0.25
"""While the server is away, a caller waiting for a connection asks the pool to connect
again at least this often (seconds), so the store is back within about this long after
the server answers again. psycopg_pool retries a lost connection with an exponential
back-off (1, 2, 4, 8... s) for ``reconnect_timeout``: here that timeout is this short,
so a slot that failed is given up at once and the next waiting caller grows the pool
with a fresh attempt."""


def is_postgres_url(target: object) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def split_schema(url: str) -> tuple[str, str | None]:
    """Take a ``schema=NAME`` query parameter (ours, not libpq's) out of a URL."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    if "schema=" not in url or "://" not in url:
        return url, None
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def redact(url: str) -> str:
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, creds = head.partition("://")
    return f"{scheme}://{creds.split(':', 1)[0]}@{tail}"


def _readable(fd: int) -> bool:
    """True when ``fd`` has something to read (or hung up), without waiting.

    ``poll`` rather than ``select``: select refuses descriptors above 1023, which a
    process serving many sockets (gevent) reaches.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def refused(exc: BaseException) -> bool:
    """Whether a driver error is the server refusing what it was sent, not an outage: a
    program limit (SQLSTATE class 54: a value, string, message buffer or index row over
    its size limit; Postgres holds a text value to 1 GB) or a message it would not take
    (08P01, protocol violation: a message over its size limit). The same statement fails
    the same way every time."""
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("54") or state == "08P01"


def _ms(seconds: float) -> int:
    """``seconds`` as whole milliseconds for a Postgres setting, at least 1 (0 would mean
    no bound)."""
    return max(1, round(seconds * 1000))


def store_error(where: str, exc: BaseException) -> StoreError:
    """The store's error for a driver error ``exc`` of ``where`` (the store's address):
    :class:`~stores.errors.StoreUnavailableError` for a lost or refused connection, a
    :class:`~stores.errors.StoreError` saying so for a value the server refused
    (:func:`refused`), else a :class:`~stores.errors.StoreError`."""
    import psycopg

    text = f"{type(exc).__name__}: {exc}".rstrip()
    if refused(exc):
        return StoreError(
            f"{where}: the server refused what was sent, over one of its size limits (not an "
            f"outage: not tried again): {text}"
        )
    if getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
        return StoreBusyError(f"{where}: another session holds a lock past the wait allowed: {text}")
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailableError(f"{where}: {text}")
    return StoreError(f"{where}: {text}")


class PgConnections:
    """A pool of autocommit connections to one database, for one store schema.

    Args:
        url: libpq connection string or URL (without our ``schema=`` parameter).
        schema: the store's schema, migrated (created) on the first connection.
        min_size, max_size: the pool's bounds.
        connect_timeout_s: how long to wait for a connection, seconds.
        application_name: what ``pg_stat_activity`` shows.
        lock_timeout_s: how long a pooled statement waits for a lock another session
            holds, seconds (the sessions' ``lock_timeout``; then StoreBusyError).

    Raises:
        StoreUnavailableError: the server cannot be reached (or refused us).
        SchemaVersionError: the schema was written by a newer tooldispatch.
    """

    def __init__(
        self,
        url: str,
        schema: str,
        *,
        min_size: int,
        max_size: int,
        connect_timeout_s: float,
        application_name: str,
        lock_timeout_s: float = 30.0,
    ) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        self.where = redact(url)
        self.timeout_s = connect_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self._max_size = max_size
        self._closed = False
        self.connect_kwargs: dict[str, Any] = {
            "application_name": application_name[:63],
            "connect_timeout": max(1, int(connect_timeout_s)),
            # psycopg prepares a statement on its 5th run; Postgres may then switch to a
            # generic plan, which for these array statements cannot use the key values
            # (measured: a rerun claim of 500 keys went from 20 ms to 2 s). Custom plans
            # keep the statement parsed once and planned for its arrays every time. JIT
            # off: a claim of many keys is costed past JIT's thresholds, and compiling it
            # took longer than running it (measured: 20,000 keys, 0.26 s -> 2.1 s).
            "options": "-c plan_cache_mode=force_custom_plan -c jit=off",
            # A host or network that vanishes sends no FIN: TCP keepalives notice a dead
            # peer within about a minute even while a call waits for its answer, and
            # unacknowledged data gives up after 30 s, so no call waits forever.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
            "tcp_user_timeout": 30_000,
        }
        self._pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={
                "autocommit": True,
                **self.connect_kwargs,
                # every pooled statement's wait for a lock, as SQLite's busy timeout
                "options": f"{self.connect_kwargs['options']} -c lock_timeout={_ms(lock_timeout_s)}",
            },
            timeout=connect_timeout_s,
            reconnect_timeout=RECONNECT_S,
            name=f"tooldispatch-{schema}",
            open=False,
        )
        try:
            # One direct connection first: an unreachable server fails at once with
            # libpq's own message (the pool would retry quietly until its timeout).
            with psycopg.connect(url, autocommit=True, **self.connect_kwargs) as conn:
                migrate(conn, schema, self.where)
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except psycopg.Error as exc:
            self._pool.close()
            raise StoreUnavailableError(
                f"{self.where}: cannot open the receipt store: {str(exc).strip()}; check the server "
                "is up and the URL (user, database) is right"
            ) from exc
        except BaseException as exc:
            self._pool.close()
            if type(exc).__module__.startswith("psycopg_pool"):
                raise StoreUnavailableError(
                    f"{self.where}: cannot open the receipt store: no connection within "
                    f"{connect_timeout_s:g} s ({exc})"
                ) from exc
            raise

    @contextlib.contextmanager
    def connection(self, wait_s: float | None = None) -> Iterator[Any]:
        """A pooled connection, probed first when it may be dead.

        An idle connection in autocommit has nothing to read; a readable socket means
        the server sent something (a termination notice, EOF), so it is probed, as is a
        connection idle for more than ``_IDLE_CHECK_S`` (a server restarted while it
        slept). A busy pool pays no round trip. A dead one is closed and handed back
        (the pool replaces it) and the next is tried at once: the pool's own check
        would sleep with a back-off between dead connections. ``wait_s``: the most
        seconds to wait for one (default the pool's ``timeout_s``).
        """
        import psycopg

        deadline = time.monotonic() + (self.timeout_s if wait_s is None else wait_s)
        for _ in range(self._max_size + 1):
            conn = self._getconn(deadline)
            idle_s = time.monotonic() - getattr(conn, "_td_returned_at", 0.0)
            if idle_s > _IDLE_CHECK_S or _readable(conn.fileno()):
                try:
                    conn.execute("")
                except psycopg.Error:
                    conn.close()
                    self._pool.putconn(conn)
                    continue
            try:
                yield conn
            finally:
                conn._td_returned_at = time.monotonic()
                self._pool.putconn(conn)
            return
        raise psycopg.OperationalError("every pooled connection was dead")

    def _getconn(self, deadline: float) -> Any:
        """A connection from the pool by ``deadline`` (monotonic seconds), asked for in
        slices of :data:`RECONNECT_S`: each new request lets the pool start a fresh
        connection attempt when its earlier ones gave up (see :data:`RECONNECT_S`).

        Raises:
            psycopg_pool.PoolTimeout: none by ``deadline``.
        """
        from psycopg_pool import PoolTimeout

        while True:
            left = deadline - time.monotonic()
            try:
                return self._pool.getconn(timeout=max(0.001, min(left, RECONNECT_S)))
            except PoolTimeout:
                if left <= RECONNECT_S:
                    raise

    def run(
        self,
        fn: Callable[[Any], T],
        *,
        transaction: bool = False,
        wait_s: float | None = None,
        lock_wait_s: float | None = None,
    ) -> T:
        """``fn(conn)`` on a pooled connection (in one transaction if asked), errors mapped.
        ``wait_s``: the most seconds to wait for a connection (default ``timeout_s``).
        ``lock_wait_s``: the most seconds each statement waits for a lock another session
        holds, when shorter than ``lock_timeout_s`` (``SET LOCAL lock_timeout``, which
        makes the call one transaction: about 0.3 ms more); None: ``lock_timeout_s``.

        Raises:
            StoreBusyError: a lock not granted within ``lock_wait_s`` (SQLSTATE 55P03).
            StoreUnavailableError: no connection, or it was lost (a result may or may not
                have been written: the caller reads back).
            StoreError: the store is closed, or any other database error.
        """
        import psycopg
        from psycopg_pool import PoolTimeout

        if self._closed:
            raise StoreError(f"{self.where}: the receipt store is closed")
        waited = self.timeout_s if wait_s is None else wait_s
        try:
            with self.connection(waited) as conn:
                if lock_wait_s is not None and lock_wait_s >= self.lock_timeout_s:
                    lock_wait_s = None  # the session's own bound is the shorter
                if not transaction and lock_wait_s is None:
                    return fn(conn)
                with conn.transaction():
                    if lock_wait_s is not None:
                        conn.execute(f"SET LOCAL lock_timeout = {_ms(lock_wait_s)}")
                    return fn(conn)
        except PoolTimeout as exc:
            raise StoreUnavailableError(f"{self.where}: no connection within {waited:g} s") from exc
        except psycopg.Error as exc:
            raise store_error(self.where, exc) from exc

    def read_now(self, query: str, params: Any, wait_s: float) -> list[tuple[Any, ...]]:
        """One read that waits at most about ``wait_s`` seconds for a pooled connection and
        as long again on the server for a lock (``lock_timeout``: a table that an
        ``ALTER TABLE``, ``VACUUM FULL`` or ``LOCK TABLE`` holds); its rows.

        Raises:
            StoreUnavailableError: no connection within ``wait_s``, or the connection
                lost; StoreBusyError (one of them): the lock not granted within it.
            StoreError: any other database error.
        """

        def work(conn: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = conn.execute(query, params).fetchall()
            return rows

        return self.run(work, wait_s=wait_s, lock_wait_s=wait_s)

    def execute(self, query: str, params: Any, lock_wait_s: float | None = None) -> list[tuple[Any, ...]]:
        """Run one statement; all its rows (a statement without rows: its row count).
        ``lock_wait_s``: as :meth:`run` takes it."""

        def work(conn: Any) -> list[tuple[Any, ...]]:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else [(cur.rowcount,)]

        return self.run(work, lock_wait_s=lock_wait_s)

    def query(self, schema: str, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """A read-only query in ``schema`` (``%s`` placeholders): rows as dicts."""
        from psycopg.rows import dict_row

        def work(conn: Any) -> list[dict[str, Any]]:
            conn.execute("SET TRANSACTION READ ONLY")
            conn.execute(f"SET LOCAL search_path TO {quote_ident(schema)}")
            rows: list[dict[str, Any]] = (
                conn.cursor(row_factory=dict_row).execute(sql, list(params)).fetchall()
            )
            return rows

        return self.run(work, transaction=True)

    def close(self) -> None:
        """Close the pool; later calls raise StoreError."""
        self._closed = True
        self._pool.close()
