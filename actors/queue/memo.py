"""A tool's memo: the outputs this system completed, newest kept, bounded by bytes; read
on callers' threads (``actors.front``), written by the tool's queue actor."""

from __future__ import annotations

import collections
import sys
from typing import Any

__all__ = ["Memo", "held_bytes"]


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
            return None
        at, text, _ = found
        if stale_after_s is not None and now - at > stale_after_s:
            return None
        return text

    def remember(self, key: str, text: str, at: float) -> None:
        """Keep ``key``'s output text, dropping the oldest entries past ``max_bytes``."""
        size = held_bytes(text)
        if self.max_bytes <= 0 or size > self.max_bytes:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        self.entries[key] = (at, text, size)
        self.bytes += size
        while self.bytes > self.max_bytes and self.entries:
            _, (_, _, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped

    def forget(self, key: str | None = None) -> None:
        """Drop one key, or everything (after a purge), with its mark (:meth:`owe`)."""
        if key is None:
            self.entries = collections.OrderedDict()
            self.bytes = 0
            self.owed = {}
            return
        self.owed.pop(key, None)
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]


_EMPTY_TEXT_BYTES = sys.getsizeof("")


def held_bytes(text: str) -> int:
    """Bytes ``text`` occupies in memory beyond an empty string's header (``len(text)``
    for ASCII text)."""
    return sys.getsizeof(text) - _EMPTY_TEXT_BYTES
