"""A tool's memo: the outputs this system completed, newest kept, bounded by bytes; read
on callers' threads (``actors.front``), written by the tool's queue actor."""

from __future__ import annotations

import collections
import sys
from typing import Any

from stores.money import Money

__all__ = ["AHEAD_TTL_S", "Memo", "held_bytes"]

AHEAD_TTL_S = 2.0
"""Seconds an output read ahead of a rerun's calls is used after its read: the longest a
change made elsewhere since (another process's refresh) can go unseen by this system's
calls of a key it never asked for before."""


class Memo:
    """Completed outputs this system saw, newest kept, bounded by bytes.

    Holds encoded JSON text (immutable): each hit decodes its own copy, so no caller
    can change what another caller sees. Written only by its tool queue actor; read
    from any thread (``recall``) without a lock (single dict reads are atomic).

    An entry counts the memory its text takes (:func:`held_bytes`): a byte per character
    of ASCII text; up to four per character of other text, plus its UTF-8 copy once the
    store wrote it (1 MiB of emoji, as UTF-8, occupies 2 MiB).

    Args:
        max_bytes: most bytes of output text kept (older entries are dropped first).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: collections.OrderedDict[str, tuple[float, str, int]] = collections.OrderedDict()
        self.bytes = 0
        self.epoch: Any = None
        self.owed: dict[str, None] = {}
        """Keys whose receipt this system completed with no caller answered ``live`` (kept
        whatever ``max_bytes``: a mark, not an output; one per such key until it is asked for)."""
        self.ahead: collections.OrderedDict[str, tuple[float, str, int]] = collections.OrderedDict()
        """Outputs read ahead of a rerun's calls (:mod:`actors.queue.read_ahead`), oldest
        read first: key -> (when read, monotonic seconds; text; bytes). Used for
        :data:`AHEAD_TTL_S` after their read, within half of ``max_bytes``."""
        self.ahead_bytes = 0
        self.forgets = 0
        """Times everything was forgotten (a purge): an output read before one is not kept."""
        self.costs: dict[str, Money] = {}
        """Key -> what the call whose output is kept (in ``entries`` or ``ahead``) cost when
        it was paid (``Receipt.cost``); keys of unpriced calls are absent."""

    def owe(self, key: str) -> None:
        """Mark ``key``: this system is writing its output and no caller was answered
        ``live`` with it (a member riding along in a request sent again, or one whose callers
        left). Written by the queue actor before the write, so every later answer sees it."""
        self.owed[key] = None

    def take_owed(self, key: str) -> bool:
        """Take ``key``'s mark (:meth:`owe`): True for the one caller that takes it, which is
        answered ``live`` (any thread: a single dict pop is atomic)."""
        return bool(self.owed) and self.owed.pop(key, False) is None

    def recall(self, key: str, stale_after_s: float | None, now: float) -> str | None:
        """The remembered output text of ``key``, or None (a memo older than the call's
        ``stale_after_s`` is not used; an output reused from the store has no known age)."""
        found = self.entries.get(key)
        if found is None:
            if stale_after_s is None and self.ahead:
                read = self.ahead.get(key)
                if read is not None and now - read[0] <= AHEAD_TTL_S:
                    return read[1]
            return None
        at, text, _ = found
        if stale_after_s is not None and now - at > stale_after_s:
            return None
        return text

    def cost_of(self, key: str) -> Money | None:
        """What the call whose output :meth:`recall` gives for ``key`` cost when it was paid
        (None: unpriced, or not kept)."""
        return self.costs.get(key) if self.costs else None

    def remember(self, key: str, text: str, at: float, cost: Money | None = None) -> None:
        """Keep ``key``'s output text (and what its call cost), dropping the oldest entries
        past ``max_bytes``."""
        self._drop_ahead(key)  # (superseded, whether kept here or not)
        size = held_bytes(text)
        if self.max_bytes <= 0 or size > self.max_bytes:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        self.entries[key] = (at, text, size)
        self.bytes += size
        if cost is not None:
            self.costs[key] = cost
        elif self.costs:
            self.costs.pop(key, None)
        while self.bytes + self.ahead_bytes > self.max_bytes and (self.ahead or self.entries):
            if self.ahead:  # what was read ahead goes first
                self._drop_ahead(next(iter(self.ahead)))
                continue
            dropped_key, (_, _, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped
            if self.costs:
                self.costs.pop(dropped_key, None)

    def keep_ahead(self, key: str, text: str, read_at: float, cost: Money | None = None) -> None:
        """Keep ``key``'s output text read ahead at ``read_at`` (monotonic seconds) for
        :data:`AHEAD_TTL_S`, unless the memo holds or owes the key (what this system
        completed or read since is newer); outputs read too long ago go first, and nothing
        is kept past half of ``max_bytes``."""
        if key in self.entries or key in self.owed:
            return
        self.expire_ahead(read_at)
        ahead = self.ahead
        size = held_bytes(text)
        self._drop_ahead(key)
        if (
            self.ahead_bytes + size
        ) * 2 > self.max_bytes or self.bytes + self.ahead_bytes + size > self.max_bytes:
            return
        ahead[key] = (read_at, text, size)
        self.ahead_bytes += size
        if cost is not None:
            self.costs[key] = cost

    def expire_ahead(self, now: float) -> None:
        """Drop the outputs read ahead more than :data:`AHEAD_TTL_S` before ``now``."""
        ahead = self.ahead
        while ahead:
            first = next(iter(ahead))
            if now - ahead[first][0] <= AHEAD_TTL_S:
                return
            self._drop_ahead(first)

    def _drop_ahead(self, key: str) -> None:
        old = self.ahead.pop(key, None)
        if old is not None:
            self.ahead_bytes -= old[2]
            if self.costs:
                self.costs.pop(key, None)

    def _drop(self, key: str) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        if self.costs:
            self.costs.pop(key, None)

    def forget(self, key: str | None = None) -> None:
        """Drop one key, or everything (after a purge), with its mark (:meth:`owe`)."""
        if key is None:
            self.entries = collections.OrderedDict()
            self.bytes = 0
            self.owed = {}
            self.ahead = collections.OrderedDict()
            self.ahead_bytes = 0
            self.costs = {}
            self.forgets += 1
            return
        self.owed.pop(key, None)
        self._drop_ahead(key)
        self._drop(key)


_EMPTY_TEXT_BYTES = sys.getsizeof("")


def held_bytes(text: str) -> int:
    """Bytes ``text`` occupies in memory beyond an empty string's header (``len(text)``
    for ASCII text)."""
    return sys.getsizeof(text) - _EMPTY_TEXT_BYTES
