"""Wakes calls waiting on other workers' receipts when the store hears of a change.

A call whose receipt another owner holds waits on a timer (:mod:`actors.lifecycle.claiming`).
When the store has a change feed (Postgres: LISTEN/NOTIFY, :meth:`stores.base.ReceiptStore.change_feed`),
one :class:`ReceiptWatch` per dispatch system, owned by its receipt store actor, keeps
the keys being waited on (per org, per tool queue actor) and one watcher thread (a
greenlet under gevent) blocked on the feed. When an org's token changes (a bulk write
that ended leases, or the listener reconnected and may have missed some), each tool
queue actor waiting on keys of that org is told :class:`~actors.messages.ReceiptsChanged`
with those keys, and its lifecycle re-reads them at once. Nothing else waits: no thread
per wait, no actor blocked. Notifications name an org, not keys (a payload cannot hold
a bulk write's keys), so a wake-up may find nothing new; the timer polls stay the
fallback (a lease that simply expires sends nothing, and a feed may be down).

Registrations go through the store actor's inbox, ahead of the first timed read of the
same keys: a change committed before a key was watched is seen by that read, one
committed after is heard by the feed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import pykka

from actors.messages import ReceiptsChanged
from stores.base import ChangeFeed

__all__ = ["ReceiptWatch"]

IDLE_WAIT_S = 0.25
"""Longest the watcher blocks on the feed before looking at its registrations again."""

GATHER_S = 0.01
"""Pause after telling the waiters, so a burst of notifications makes one message (a
tool queue also keeps at most one woken read out per key, plus one more to follow)."""


class ReceiptWatch:
    """Keys waited on, per org and tool queue actor; one watcher thread tells them of changes.

    Args:
        feed: the store's change feed (started).

    Thread-safe: :meth:`watch` and :meth:`unwatch` run on the store actor's thread, the
    watcher on its own.
    """

    def __init__(self, feed: ChangeFeed) -> None:
        self._feed = feed
        self._lock = threading.Lock()
        self._waited: dict[str, dict[Any, set[str]]] = {}
        """org id -> tool queue actor ref -> receipt keys it waits on."""
        self._seen: dict[str, tuple[int, int]] = {}
        """org id -> the feed's token when its waiters were last told (or first watched)."""
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, org_id: str, keys: Sequence[str], ref: Any) -> None:
        """``ref`` waits on ``keys`` of ``org_id`` from now on; starts the watcher once."""
        with self._lock:
            refs = self._waited.setdefault(org_id, {})
            refs.setdefault(ref, set()).update(keys)
            if org_id not in self._seen:
                self._seen[org_id] = self._feed.version(org_id)
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._loop, name="td-receipt-watch", daemon=True)
                self._thread.start()

    def unwatch(self, org_id: str, keys: Sequence[str], ref: Any) -> None:
        """``ref`` no longer waits on ``keys`` (unknown keys are ignored)."""
        with self._lock:
            refs = self._waited.get(org_id)
            waited = refs.get(ref) if refs is not None else None
            if waited is None or refs is None:
                return
            waited.difference_update(keys)
            if not waited:
                del refs[ref]
            if not refs:
                del self._waited[org_id]
                del self._seen[org_id]

    @property
    def watched(self) -> int:
        """How many keys are watched now."""
        with self._lock:
            return sum(len(keys) for refs in self._waited.values() for keys in refs.values())

    def close(self) -> None:
        """Stop the watcher (within about :data:`IDLE_WAIT_S`); the feed stays the store's."""
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=IDLE_WAIT_S + 1.0)

    # -- the watcher thread ----------------------------------------------------------------

    def _loop(self) -> None:
        feed = self._feed
        seen = feed.changes()
        while not self._closed.is_set():
            started = time.monotonic()
            now = feed.wait_any(seen, IDLE_WAIT_S)
            if now == seen or self._closed.is_set():
                if time.monotonic() - started < IDLE_WAIT_S / 2:  # a closed feed returns at once
                    self._closed.wait(IDLE_WAIT_S)
                continue
            seen = now
            for ref, keys in self._due():
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(ReceiptsChanged(keys=keys))
            self._closed.wait(GATHER_S)

    def _due(self) -> list[tuple[Any, tuple[str, ...]]]:
        """(actor ref, keys) for every org whose token moved since its waiters were told."""
        due: list[tuple[Any, tuple[str, ...]]] = []
        with self._lock:
            for org_id, refs in self._waited.items():
                token = self._feed.version(org_id)
                if token == self._seen.get(org_id):
                    continue
                self._seen[org_id] = token
                due.extend((ref, tuple(keys)) for ref, keys in refs.items())
        return due
