"""LISTEN/NOTIFY for waiters on other workers' receipts (Postgres store).

One listener per store: a dedicated autocommit connection (not from the pool) running
``LISTEN`` on the store's channel, read by a daemon thread (a greenlet under gevent,
where psycopg 3.1.14+ waits cooperatively when imported after patching: psycopg docs,
"gevent support"). Each notification's payload is an org id; the listener bumps that
org's counter and wakes every waiter, which re-reads its own keys.

A connection that dies raises in ``notifies()``; one that silently stops answering is
caught by a probe after ``probe_after_s`` without traffic: it asks the server which
channels the session listens on, and a probe unanswered after ``probe_timeout_s`` shuts
the socket down (a silent connection would otherwise block the probe for as long as
TCP takes to give up). Either way the listener reconnects with a capped back-off, and
on every (re)connect it bumps every org's counter: waiters re-read, so a completion
sent while nobody listened is not missed. Waiters also poll (the caller's poll
interval), so a listener that is down only makes wake-ups slower, never lost.

Two ways to wait: :meth:`Listener.wait_any` blocks until anything changed (one watcher
thread serving every waiting call of a dispatch system, :mod:`actors.store.watch`);
:meth:`Listener.wait` blocks one waiter on one org.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections import defaultdict
from typing import Any

from stores.postgres.schema import MAX_IDENTIFIER_BYTES

__all__ = ["Listener", "channel_name"]

RECONNECT_MAX_S = 0.5
"""The listener connects again after a lost connection with a back-off doubling from
50 ms up to this (seconds): a server back after an outage is heard within about this."""


def channel_name(schema: str) -> str:
    """The NOTIFY channel of the receipt store in ``schema``: ``tooldispatch:SCHEMA``,
    or, when that would pass Postgres's 63-byte limit on names, ``tooldispatch:`` and
    the first 40 hex digits of the schema name's sha256 (every worker on that schema
    derives the same)."""
    name = f"tooldispatch:{schema}"
    # a channel is a Postgres name: pg_notify refuses a longer one, LISTEN cuts it
    if len(name.encode("utf-8", "surrogatepass")) <= MAX_IDENTIFIER_BYTES:
        return name
    return "tooldispatch:" + hashlib.sha256(schema.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class Listener:
    """Counts notifications per org and wakes waiters.

    Args:
        conninfo: libpq connection string.
        connect_kwargs: more connection parameters (application_name, connect_timeout).
        channel: the NOTIFY channel (an unquoted name; quoted here).
        probe_after_s: silence after which the connection is probed, seconds.
        probe_timeout_s: a probe unanswered this long means the connection is dead, seconds.
    """

    def __init__(
        self,
        conninfo: str,
        channel: str,
        connect_kwargs: dict[str, Any],
        *,
        probe_after_s: float = 5.0,
        probe_timeout_s: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._channel = channel
        self._probe_after_s = probe_after_s
        self._probe_timeout_s = probe_timeout_s
        self._cond = threading.Condition()
        self._versions: dict[str, int] = defaultdict(int)
        self._epoch = 0  # bumped on every (re)connect: every org counts as changed
        self._changes = 0  # bumped on every notification and (re)connect
        self._closed = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        self.backend_pid: int | None = None
        """The listening connection's server process id (for tests and operators)."""
        self.reconnects = 0
        """How many times the connection was re-established after a failure."""
        self.waiting = 0
        """How many waiters are blocked in :meth:`wait` now."""

    def start(self) -> None:
        """Start the listener thread once; returns at once."""
        with self._cond:
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._loop, name="td-pg-listener", daemon=True)
                self._thread.start()

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait until the listener holds a live LISTEN; True when it does."""
        return self._connected.wait(timeout_s)

    def version(self, org_id: str) -> tuple[int, int]:
        """A token that changes when ``org_id`` may have changed."""
        with self._cond:
            return (self._epoch, self._versions[org_id])

    @property
    def live(self) -> bool:
        """True while the listener holds a live LISTEN."""
        return self._connected.is_set()

    def changes(self) -> int:
        """A counter that grows on every notification and every (re)connect."""
        with self._cond:
            return self._changes

    def wait_any(self, seen: int, timeout_s: float) -> int:
        """Block until :meth:`changes` differs from ``seen``, at most ``timeout_s`` seconds.

        Returns:
            The counter now (``seen`` on timeout or once closed).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._changes == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed.is_set():
                    break
                self._cond.wait(remaining)
            return self._changes

    def wait(self, org_id: str, seen: tuple[int, int], timeout_s: float) -> bool:
        """Block until ``version(org_id)`` differs from ``seen``, at most ``timeout_s`` seconds.

        Returns True when it changed (a notification or a reconnect), False on timeout.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.waiting += 1
            try:
                while (self._epoch, self._versions[org_id]) == seen:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._closed.is_set():
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self.waiting -= 1

    def close(self) -> None:
        """Stop listening; the thread ends within about half a second."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # -- the listener thread ---------------------------------------------------------------

    def _bump(self, org_id: str | None) -> None:
        with self._cond:
            if org_id is None:
                self._epoch += 1
            else:
                self._versions[org_id] += 1
            self._changes += 1
            self._cond.notify_all()

    def _loop(self) -> None:
        import psycopg

        backoff_s = 0.05
        first = True
        while not self._closed.is_set():
            conn: Any = None
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True, **self._connect_kwargs)
                conn.execute(f'LISTEN "{self._channel.replace(chr(34), chr(34) * 2)}"')
                self.backend_pid = conn.info.backend_pid
                self._connected.set()
                if not first:
                    self.reconnects += 1
                first = False
                self._bump(None)  # re-read what may have been missed while not listening
                backoff_s = 0.05
                self._listen(conn)
            except psycopg.Error:
                self._connected.clear()
                self._bump(None)
                self._closed.wait(backoff_s)
                backoff_s = min(backoff_s * 2, RECONNECT_MAX_S)
            finally:
                if conn is not None:
                    conn.close()
        self._connected.clear()

    def _listen(self, conn: Any) -> None:
        quiet_since = time.monotonic()
        while not self._closed.is_set():
            got = False
            for note in conn.notifies(timeout=0.5):
                self._bump(note.payload)
                got = True
            now = time.monotonic()
            if got:
                quiet_since = now
            elif now - quiet_since >= self._probe_after_s:
                self._probe(conn)  # raises if the connection died, even silently
                quiet_since = time.monotonic()

    def _probe(self, conn: Any) -> None:
        """Ask the server whether this session still listens; give up after the timeout.

        Raises:
            psycopg.OperationalError: no answer in time (the socket was shut down), or the
                connection is gone; the session no longer listens on the channel.
        """
        import psycopg

        watchdog = threading.Timer(self._probe_timeout_s, _shut_down, (conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            row = conn.execute("SELECT %s IN (SELECT pg_listening_channels())", (self._channel,)).fetchone()
        finally:
            watchdog.cancel()
        if not row or not row[0]:
            raise psycopg.OperationalError(f"the session no longer listens on {self._channel}")


def _shut_down(conn: Any) -> None:
    """Shut a silent connection's socket down: a read blocked on it ends with an error."""
    with contextlib.suppress(Exception):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
